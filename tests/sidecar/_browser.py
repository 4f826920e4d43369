"""The browser the browser toolset's tests drive: Debian's chromium, headless (never
downloaded; .ci/run installs it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest
from deskbridge_sidecar.toolsets import BrowserToolset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def headless_toolset(origins: Iterable[str], profile_dir: str | Path) -> BrowserToolset:
    """A toolset allowed ``origins``, on a fresh ``profile_dir``; fails the test (never
    skips) when chromium is missing."""
    if CHROMIUM is None:
        pytest.fail("Debian's chromium is not installed (.ci/run installs it)")
    return BrowserToolset(
        list(origins), profile_dir=str(profile_dir), executable_path=CHROMIUM, headless=True
    )
