"""The pod holding a desktop's socket is SIGKILLed mid-job while the desktop sleeps
(SIGSTOP: the lid closed), and the desktop comes back (SIGCONT) later than the result
TTL after the pod's last keep of the job's records, and after the job's deadline.

Nobody served the job meanwhile, so nothing kept its state. Was: the state had lapsed,
the survivor's mark saw a job never forwarded past its deadline and answered it
``expired``, although it had run (the desktop's ledger says so). Now a forwarded job's
state is kept a day + the result TTL (``_jobstate.forwarded_keep_s``): the job goes to
the desktop again and its ledger answers. Asserts: executed exactly once, the caller's
wait ended (``timeout``, the job ``delivered``), and the job's answer is the real one.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.chaos._harness import TIMINGS, headers, pods_behind_haproxy
from tests.procs import kill_group, wait_until

pytestmark = pytest.mark.chaos

RESULT_TTL_S = 2.0
TIMEOUT_S = 2.0
JOB_S = 1.5


def test_a_desktop_back_after_its_pod_died_and_the_result_ttl_answers_its_job(tmp_path, procs):
    env = {**TIMINGS, "DESKBRIDGE_RESULT_TTL_S": str(RESULT_TTL_S)}
    user, ledger, sidecar, doomed, survivor, _ = pods_behind_haproxy(tmp_path, procs, env)
    key = "away-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key,
        timeout_s=TIMEOUT_S,
    )  # fmt: skip
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    sidecar.signal_group(signal.SIGSTOP)  # the lid closes with the job running
    try:
        kill_group(doomed)
        answer = caller.result(timeout=20)
        assert answer.status == "timeout", answer.body  # the caller's wait ended
        assert answer.body["detail"]["stage"] == "delivered", answer.body
        job_id = answer.body["job_id"]
        # past the deadline + result TTL and the dead pod's last keep + result TTL
        time.sleep(TIMEOUT_S + 2 * RESULT_TTL_S + 1.0)
    finally:
        sidecar.signal_group(signal.SIGCONT)  # the desktop wakes up

    def answered():
        with httpx.Client(headers=headers(), timeout=5.0) as client:
            r = client.get(f"{survivor.http}/v1/jobs/{job_id}")
        body = r.json()
        return body if body.get("terminal") else None

    job = wait_until(answered, timeout_s=20, what="the job's answer")
    assert job["stage"] == "finished", job  # was: expired, by the survivor's mark
    assert job["outcome"]["status"] == "completed", job
    assert job["outcome"]["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()  # executed exactly once
