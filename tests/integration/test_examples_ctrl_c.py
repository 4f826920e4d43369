"""Ctrl-C on the examples a newcomer runs first (README: ``./dev demo``, then
``examples/form_site.py`` for the MCP agent): one line and exit 130, as the hub and the
sidecar answer it. The demo printed trio's nested ExceptionGroup traceback (exit 1), the
form site a KeyboardInterrupt traceback. Real processes; every wait is bounded."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.procs import Proc, free_port, wait_until

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "args", "ready"),
    [
        ("demo.py", (), "status (while sleep runs)"),  # inside the 3 s sleep
        ("form_site.py", ("--port", "PORT"), "form at http://"),
    ],
)
def test_ctrl_c_is_one_line_and_exit_130(
    tmp_path: Path, script: str, args: tuple[str, ...], ready: str
) -> None:
    argv = [sys.executable, str(EXAMPLES / script)]
    argv += [str(free_port()) if a == "PORT" else a for a in args]
    proc = Proc(argv, {"PYTHONUNBUFFERED": "1"}, tmp_path / "example.log")
    try:
        wait_until(lambda: ready in proc.output(), timeout_s=60, what=f"{script} ready")
        proc.popen.send_signal(signal.SIGINT)
        proc.popen.wait(30)
    finally:
        proc.stop()
    out = proc.log_path.read_text(errors="replace")  # stop() closed the log
    assert "Traceback" not in out, out
    assert proc.popen.returncode == 130, out
    assert out.splitlines()[-1] == "interrupted", out
