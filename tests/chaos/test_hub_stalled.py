"""A hub process stalled (SIGSTOP of its worker: a paused VM, a stopped container)
longer than a blocked Redis command's timeout, with a caller waiting in it, while the
desktop's sidecar moves to the other pod behind HAProxy and its job completes there.

Found by fault injection (a 40 s stop under the default timings): on SIGCONT the
caller's mailbox read, begun before the stop, failed by its own timeout, and the caller
was answered 503 ``unavailable`` ("Redis ... BLMPOP timed out after 6.0 seconds"),
stage ``unknown``, although Redis had answered throughout and the job's result was
there. Now the waiter reads again before it tells an outage: ``completed``, ran once.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.chaos._harness import TIMINGS, pods_behind_haproxy, post_job, wait_online, worker_pid
from tests.procs import wait_until

pytestmark = pytest.mark.chaos

#: Longer than a blocked read's timeout (``READ_BLOCK_S`` 1 s + the 5 s command
#: timeout) and the presence TTL of the suite's timings (3 s).
STOP_S = 9.0


def test_a_caller_waiting_in_a_stalled_hub_gets_the_answer_its_job_got(tmp_path, procs):
    user, ledger, sidecar, doomed, survivor, sid = pods_behind_haproxy(tmp_path, procs, TIMINGS)
    worker = worker_pid(doomed)
    key = "stalled-" + user
    caller = procs.callers.post(
        doomed.http, user, "record", {"key": key, "seconds": 2}, key=key, timeout_s=60
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    os.kill(worker, signal.SIGSTOP)
    try:
        # the sidecar's ping deadline moves it to the survivor, whose takeover hands it
        # the job again; the ledger joins the run and answers there
        moved = wait_until(
            lambda: (s := wait_online(survivor.http, user)) != sid and s,
            timeout_s=STOP_S,
            what="the desktop online through the survivor",
        )
        time.sleep(max(0.0, STOP_S - 2))
    finally:
        os.kill(worker, signal.SIGCONT)

    answer = caller.result(timeout=30)
    assert answer.http_status == 200 and answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()
    # the desktop stays reachable through either pod once the stalled one runs again
    assert wait_online(doomed.http, user) == moved
    for pod in (doomed, survivor):
        echo = post_job(pod.http, user, "echo", {"pod": pod.port}, timeout_s=10)
        assert echo.status == "completed", echo.body
    assert sidecar.popen.poll() is None
