"""Redis paused (``CLIENT PAUSE 5000 WRITE|ALL``) as the pod holding a desktop's socket
is SIGKILLed mid-job: the sidecar dials the survivor, whose handshake Redis holds past
the sidecar's welcome deadline, so the sidecar gives that socket up and dials again.

Found by fault injection: once Redis answered, the survivor welcomed the abandoned
socket, and its takeover step handed the daemon's running job to that session as its
tasks ended: ``RuntimeError: Nursery is closed to new arrivals``, an ERROR with its
traceback ("reading for ... failed; read again when its heartbeat finds a backlog"), the
rest of the step dropped (2 runs of 4). Now the session says it is gone and the reader
treats it as stopped (tests/hub/test_session_gone.py); the job goes to the daemon's next
session. Asserts: ``completed``, ran once, no such ERROR.
"""

from __future__ import annotations

import pytest

from tests.chaos._harness import TIMINGS, pods_behind_haproxy, post_job, redis_command
from tests.procs import kill_group, wait_until

pytestmark = pytest.mark.chaos

JOB_S = 6.0
PAUSE_MS = 5000


@pytest.mark.parametrize("mode", ["WRITE", "ALL"])
def test_a_takeover_while_redis_is_paused_answers_once(tmp_path, procs, mode):
    user, ledger, sidecar, doomed, survivor, _ = pods_behind_haproxy(tmp_path, procs, TIMINGS)
    key = "paused-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    kill_group(doomed)
    redis_command("CLIENT", "PAUSE", str(PAUSE_MS), mode)

    answer = caller.result(timeout=45)
    assert answer.status == "completed", answer.body
    assert ledger.counts() == {key: 1}, ledger.events()
    echo = post_job(survivor.http, user, "echo", {"after": 1}, timeout_s=10)
    assert echo.status == "completed", echo.body
    log = survivor.output()
    assert "Nursery is closed" not in log and " failed; read again" not in log, log[-4000:]
