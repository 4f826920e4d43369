"""Issue 3, item 6, case c: the socket drops mid-job while every hub stays up.

HAProxy is SIGKILLed (both TCP legs die at once: sidecar-HAProxy and HAProxy-pod) and
started again on the same port. One pod sits behind HAProxy so the outcome is
deterministic: the sidecar reconnects to the *same* hub process, whose new session
drains its own consumer's pending entries from ``0`` at once and redelivers the job
under a fresh delivery ``id``; the sidecar, which finished the run meanwhile, answers
from its dedupe cache under that new ``id``. The reclaim idle is set far beyond the
test's bound, so only the drain path can deliver in time.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos._harness import (
    TIMINGS,
    new_user,
    post_job,
    presence,
    redis_command,
    wait_online,
)
from tests.procs import HAProxy, Ledger, Sidecar, holder, issue, kill_group, log_times, wait_until

pytestmark = pytest.mark.chaos

RECLAIM_IDLE_S = 60.0  # never reached: the redelivery must come from the startup drain
JOB_S = 1.0


def test_socket_drop_mid_job_redelivered_by_drain_and_answered_from_cache(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S)}
    pod = procs.hub(tmp_path, env, name="pod")
    lb = procs.add(HAProxy(tmp_path, [pod.port]))
    lb.wait_ready()
    sidecar = procs.add(
        Sidecar(tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()})
    )
    sid = wait_online(pod.http, user)
    assert holder([pod], user, sid) is pod

    key = "c-" + user
    # the caller talks to the pod directly: it must outlive the load balancer
    caller = procs.callers.post(
        pod.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    kill_group(lb)
    dropped_at = time.time()

    # the pod saw its socket end (presence cleared at once, not by TTL), and the sidecar
    # finished the run with no socket to answer on
    wait_until(
        lambda: not presence(pod.http, user)[1]["online"], timeout_s=5, what="presence cleared"
    )
    wait_until(lambda: ledger.ends(key), timeout_s=10, what="the run finished")
    assert not caller.done()

    back_at = time.time()  # the sidecar may get through before wait_ready returns
    lb2 = procs.add(HAProxy(tmp_path, [pod.port], port=lb.port, name="haproxy-again"))
    lb2.wait_ready()
    answer = caller.result(timeout=20)
    assert answer.http_status == 200, answer.body
    assert answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()

    new_sid = wait_online(pod.http, user)
    assert new_sid != sid and holder([pod], user, new_sid) is pod
    log = sidecar.output()
    job_id = answer.body["job_id"]
    hits = log_times(log, f"job {job_id} (record): answered from the dedupe cache")
    assert len(hits) == 1, log[-3000:]
    assert len(log_times(log, "welcomed by hub")) == 2
    # answered under the redelivery's fresh id: an answer under the first delivery's id
    # would have been refused by the new session (and the caller would have timed out)
    assert "not delivered on this socket" not in pod.output()
    took = answer.at - back_at
    print(
        f"\ncase c: socket dropped {dropped_at - ledger.starts(key)[0]['t']:.3f} s into the job; "
        f"load balancer restarted -> caller's result {took:.3f} s "
        f"(drain from 0; reclaim idle {RECLAIM_IDLE_S:g} s not involved)"
    )
    assert took < 5.0  # reconnect backoff (<= 1 s) + handshake + drain; far below reclaim


def test_socket_drop_with_a_backlog_beyond_one_drain_batch(tmp_path, procs):
    """More of the user's entries are pending for the hub process than one drain read
    returns (32) when the socket drops: after the reconnect every one of them is
    redelivered by the same process's drain — the entries past the first batch must not
    wait for the reclaim idle — and each runs exactly once."""
    from concurrent.futures import ThreadPoolExecutor

    from deskbridge_hub._substrate import jobs_key

    n_jobs = 48
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S)}
    pod = procs.hub(tmp_path, env, name="pod")
    lb = procs.add(HAProxy(tmp_path, [pod.port]))
    lb.wait_ready()
    procs.add(
        Sidecar(tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()})
    )
    wait_online(pod.http, user)
    keys = [f"c-backlog{i:02d}-{user}" for i in range(n_jobs)]
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        futures = [
            pool.submit(
                post_job, pod.http, user, "record", {"key": k, "seconds": 0.2}, key=k, timeout_s=60
            )
            for k in keys
        ]
        # all enqueued, a few ran: then drop the socket
        wait_until(
            lambda: redis_command("XLEN", jobs_key(user)) == n_jobs,
            timeout_s=10,
            what="all jobs enqueued",
        )
        wait_until(lambda: len(ledger.counts()) >= 2, timeout_s=10, what="jobs running")
        kill_group(lb)
        wait_until(
            lambda: not presence(pod.http, user)[1]["online"], timeout_s=5, what="presence cleared"
        )
        ran_before = len(ledger.counts())
        back_at = time.time()
        lb2 = procs.add(HAProxy(tmp_path, [pod.port], port=lb.port, name="haproxy-again"))
        lb2.wait_ready()
        answers = [f.result(timeout=RECLAIM_IDLE_S + 30) for f in futures]
    for k, a in zip(keys, answers, strict=True):
        assert a.http_status == 200 and a.status == "completed", (k, a.body)
    assert ledger.counts() == {k: 1 for k in keys}, ledger.counts()
    took = max(a.at for a in answers) - back_at
    print(
        f"\ncase c (backlog): {ran_before} of {n_jobs} ran before the drop; the rest answered "
        f"{took:.3f} s after the load balancer was restarted (reclaim idle {RECLAIM_IDLE_S:g} s)"
    )
    # 48 x 0.2 s serial runs + reconnect + drains; the reclaim idle (60 s) would be beyond
    assert took < 0.2 * n_jobs + 10.0
