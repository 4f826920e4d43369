"""One worker of ``deskbridge-hub serve --workers 2`` is SIGKILLed (the OOM killer's way)
mid-job, while the caller waits on the other worker.

The supervisor replaces the dead worker and leaves the other alone: it keeps its HTTP
connections and callers (draining it too, as before, cut every desktop of the pod for one
lost process); so is a replacement killed seconds after it started serving. The sidecar
reconnects (to either worker), its daemon's pending entry is taken over, the job ran
exactly once and the caller gets ``completed``; a SIGTERM to the supervisor afterwards
drains and exits 0 (the replaced workers do not make it a failure).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest

from tests.chaos._harness import HTTP_SLACK_S, TIMINGS, new_user, wait_online
from tests.procs import (
    Hub,
    Ledger,
    Sidecar,
    client_on_worker,
    issue,
    log_text,
    pid_alive,
    session_pid,
    wait_until,
    worker_pids,
)

pytestmark = pytest.mark.chaos

JOB_S = 1.5


def test_a_worker_killed_mid_job_is_replaced_and_the_other_keeps_serving(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = procs.add(Hub(tmp_path, workers=2, env=TIMINGS, name="pod"))
    hub.wait_healthy()
    wait_until(lambda: len(worker_pids(hub)) == 2, timeout_s=30, what="two workers serving")
    sidecar = procs.add(
        Sidecar(
            tmp_path, hub.ws, issue(user), tools=["counting_tools"], env={**TIMINGS, **ledger.env()}
        )
    )
    sid = wait_online(hub.http, user)
    doomed = session_pid(hub, sid)
    (survivor,) = worker_pids(hub) - {doomed}
    client, pid = client_on_worker(hub, not_pid=doomed)
    assert pid == survivor
    key = "w-" + user
    body = {"name": "record", "args": {"key": key, "seconds": JOB_S}, "timeout_s": 30,
            "idempotency_key": key}  # fmt: skip
    with contextlib.closing(client):
        caller = procs.callers.submit(
            client.post, f"{hub.http}/v1/users/{user}/jobs", json=body, timeout=30 + HTTP_SLACK_S
        )
        wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
        os.kill(doomed, signal.SIGKILL)

        answer = caller.result(timeout=40)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "completed", answer.text
        assert ledger.counts() == {key: 1}, ledger.events()

        wait_until(
            lambda: len(worker_pids(hub)) == 2 and doomed not in worker_pids(hub),
            timeout_s=30,
            what="a replacement worker serving",
        )
        log = log_text(hub)
        assert re.search(
            rf"worker {doomed} exited with signal SIGKILL after [\d.]+ s: starting a replacement",
            log,
        ), log[-3000:]
        assert hub.popen.poll() is None
        assert pid_alive(survivor)
        assert f"shutdown[{survivor}]" not in log  # never asked to drain
        # the survivor's keep-alive connection still serves
        echo = client.post(
            f"{hub.http}/v1/users/{user}/jobs", json={"name": "echo", "args": {"n": 1}}
        )
        assert echo.status_code == 200 and echo.json()["result"] == {"n": 1}, echo.text

        # the replacement, killed seconds after it started serving, is replaced too (it
        # served: a crash, not a failure to start)
        (young,) = worker_pids(hub) - {survivor}
        os.kill(young, signal.SIGKILL)
        wait_until(
            lambda: len(worker_pids(hub)) == 2 and young not in worker_pids(hub),
            timeout_s=30,
            what="a second replacement serving",
        )
        assert hub.popen.poll() is None and pid_alive(survivor)
        assert f"worker {young} exited with signal SIGKILL" in log_text(hub)
    assert sidecar.popen.poll() is None

    os.kill(hub.popen.pid, signal.SIGTERM)
    assert hub.popen.wait(timeout=30) == 0, log_text(hub)[-3000:]
