"""Issue 14 item 5: ``deskbridge-sidecar status`` reports a real running daemon: connected
to which hub, since when, its tools; not connected (with the last error) when the hub goes
away; not running once stopped. Real hub, real sidecar process, local status file only."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.procs import BIN, Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def status(data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "deskbridge-sidecar"), "status", "--data-dir", str(data_dir), *extra],
        capture_output=True, text=True, timeout=30, env={**os.environ},
    )  # fmt: skip


def test_status_of_a_running_daemon(tmp_path: Path) -> None:
    user = "status-" + secrets.token_hex(3)
    data_dir = tmp_path / "data"
    log_file = tmp_path / "logs" / "sidecar.log"
    hub = Hub(tmp_path, workers=1)
    with running(hub), api() as client:
        hub.wait_healthy()
        sidecar = Sidecar(
            tmp_path, hub.ws, issue(user),
            extra_args=["--data-dir", str(data_dir), "--log-file", str(log_file)],
        )  # fmt: skip
        with running(sidecar):
            wait_until(
                lambda: status(data_dir).returncode == 0, timeout_s=20, what="status connected"
            )
            out = status(data_dir)
            assert f"connected to {hub.ws}/v1/sidecar since" in out.stdout
            assert "tools: status, echo, sleep" in out.stdout
            assert f"(pid {sidecar.pid})" in out.stdout
            assert client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"]
            assert "connected to" in log_file.read_text()  # the log file is written too
            hub.stop()
            wait_until(lambda: status(data_dir).returncode == 1, timeout_s=20, what="not connected")
            out = status(data_dir)
            assert "NOT connected" in out.stdout and "last error:" in out.stdout
        out = status(data_dir)
        assert out.returncode == 3 and "not running" in out.stdout
