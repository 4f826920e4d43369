"""A fresh clone holds what the README's Layout describes, not a session's leftovers (a
newcomer pass found sidecar PID files, a log and empty scratch files at the root)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_run_leftovers_are_tracked() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        [git, "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    leftovers = [
        p for p in tracked if p.endswith((".pid", ".log")) or ("/" not in p and p.startswith("r_"))
    ]
    assert leftovers == []
