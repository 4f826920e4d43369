"""Ctrl-C on ``deskbridge-hub serve --workers 1`` (a developer's terminal) drains like
SIGTERM: one line saying so, sockets closed with 1012 (the sidecar reconnects at once
instead of backing off), exit 0. It used to stop silently, sockets just gone."""

from __future__ import annotations

import secrets
import signal

import pytest

from tests.procs import Hub, Sidecar, issue, running, wait_log

pytestmark = pytest.mark.integration


def test_ctrl_c_drains_like_sigterm(tmp_path) -> None:
    user = "ctrlc-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_GRACE_S": "5"})
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar):
            wait_log(sidecar, r"welcomed by hub", timeout_s=20)
            hub.popen.send_signal(signal.SIGINT)
            assert hub.popen.wait(timeout=30) == 0
            out = hub.output()
            assert "SIGINT: draining (grace 5.0 s); Ctrl-C again to stop at once" in out
            assert "drained 1 sessions" in out
            wait_log(sidecar, r"closed, code 1012: hub restarting", timeout_s=10)
