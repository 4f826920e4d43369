"""Issue 3, item 6, case b: the pod holding the sidecar's socket is SIGKILLed mid-job.

Two independent hub processes (pods) behind a real HAProxy; the sidecar dials HAProxy.
The caller waits on the *other* pod. After the kill the sidecar reconnects through
HAProxy to the surviving pod. Since issue 12.4 the survivor takes the dead consumer's
pending entry over at once (XCLAIM at the session's start: the entry went to this very
daemon, whose ledger joins or answers it) instead of waiting until it is idle for
``RECLAIM_IDLE_S`` (XAUTOCLAIM); that reclaim path remains for entries of another daemon
(tests/chaos/test_takeover.py). Asserts: executed exactly once, the caller gets
``completed``, the redelivery came before the entry was eligible for a reclaim; prints
the time from the kill to the caller's answer and its parts.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos._harness import TIMINGS, pods_behind_haproxy, wait_online
from tests.procs import holder, kill_group, log_times, wait_until

pytestmark = pytest.mark.chaos

JOB_S = 1.5  # the job outlives the kill, and ends before the reclaim idle has passed
RECLAIM_IDLE_S = 3.0


def test_kill_pod_holding_socket_mid_job(tmp_path, procs):
    # READ_BLOCK_MS (2000 ms: how often an idle relay runs a reclaim pass) and
    # BACKOFF_INITIAL_S (1 s: the sidecar's first reconnect delay bound) keep their
    # defaults, so the measured figure has the production shape; only the reclaim idle
    # (180 s) is shortened.
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S)}
    del env["DESKBRIDGE_READ_BLOCK_MS"], env["DESKBRIDGE_BACKOFF_INITIAL_S"]
    user, ledger, sidecar, doomed, survivor, sid = pods_behind_haproxy(tmp_path, procs, env)

    key = "b-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    killed_at = time.time()
    kill_group(doomed)

    answer = caller.result(timeout=40)
    assert answer.http_status == 200, answer.body
    assert answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()
    assert len(ledger.ends(key)) == 1  # the run finished although its socket died

    # the redelivery went through the survivor, taken over at the reconnect
    new_sid = wait_online(survivor.http, user)
    assert new_sid != sid
    assert holder([survivor], user, new_sid) is survivor
    log = sidecar.output()
    job_id = answer.body["job_id"]
    assert len(log_times(log, f"job {job_id} (record): ok")) == 1, log[-3000:]
    took_over = log_times(survivor.output(), "took over 1 entries from its daemon's gone sockets")
    assert len(took_over) == 1, survivor.output()[-3000:]

    delivered_at = ledger.starts(key)[0]["t"]
    noticed_at = min(t for t in log_times(log, "disconnected from hub") if t >= killed_at - 0.01)
    welcomed_at = max(log_times(log, "welcomed by hub"))
    eligible_at = delivered_at + RECLAIM_IDLE_S  # when a reclaim could have taken it
    redelivered_at = took_over[0]
    total = answer.at - killed_at
    print(
        f"\ncase b: kill -> caller's result {total:.3f} s (reclaim idle {RECLAIM_IDLE_S:g} s, "
        f"job {JOB_S:g} s, killed {killed_at - delivered_at:.3f} s after delivery)\n"
        f"  kill -> sidecar noticed the dead socket      {noticed_at - killed_at:7.3f} s\n"
        f"  noticed -> welcomed by the survivor          {welcomed_at - noticed_at:7.3f} s"
        f"  (backoff jitter, HAProxy, handshake)\n"
        f"  welcomed -> taken over (XCLAIM)              {redelivered_at - welcomed_at:7.3f} s\n"
        f"  taken over -> caller's result                {answer.at - redelivered_at:7.3f} s"
        f"  (the run's end, RPUSH, mailbox, HTTP)"
    )
    assert noticed_at - killed_at < 1.0  # a killed process's sockets are closed at once
    assert redelivered_at < eligible_at  # taken over, not reclaimed after the idle
    assert redelivered_at - welcomed_at < 1.0
    assert total < RECLAIM_IDLE_S + 2.0


def test_kill_pod_while_a_job_outlives_the_reclaim_idle(tmp_path, procs):
    """The job runs longer than the reclaim idle: the survivor reclaims and redelivers
    it while the orphaned run is still going; the sidecar joins the running original
    (no second start) and answers when it ends."""
    job_s = 2 * RECLAIM_IDLE_S
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S)}
    user, ledger, sidecar, doomed, survivor, _ = pods_behind_haproxy(tmp_path, procs, env)
    key = "b-long-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": job_s}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    kill_group(doomed)

    answer = caller.result(timeout=40)
    assert answer.http_status == 200 and answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()
    (end,) = ledger.ends(key)
    (start,) = ledger.starts(key)
    assert answer.at - end["t"] < 1.0  # answered as the run ended, not a reclaim later
    log = sidecar.output()
    job_id = answer.body["job_id"]
    # the redelivery arrived while the run was still going: it joined the run
    assert not log_times(log, f"job {job_id} (record): answered from the dedupe cache")
    assert len(log_times(log, f"job {job_id} (record): ok")) == 1, log[-3000:]
    assert "not delivered on this socket" not in survivor.output()
    print(
        f"\ncase b (long job): ran {end['t'] - start['t']:.3f} s once; caller answered "
        f"{answer.at - end['t']:.3f} s after the run ended"
    )
