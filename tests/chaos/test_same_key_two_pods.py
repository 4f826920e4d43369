"""Issue 3, item 6, case d: one idempotency key dispatched twice at once, through two
different pods (two concurrent HTTP POSTs, one to each pod directly).

One job per key (issue 16 item 3): the idempotency-key index in Redis lets only the first
request enqueue; the second, on the other pod, attaches to that job and gets its answer.
Asserts: one job id for both, executed exactly once, both callers get ``completed`` with
the same result.
"""

from __future__ import annotations

import threading

import pytest

from tests.chaos._harness import TIMINGS, new_user, post_job, wait_online
from tests.procs import HAProxy, Ledger, Sidecar, issue

pytestmark = pytest.mark.chaos


def test_same_key_through_two_pods_at_once_runs_once(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    pods = [procs.hub(tmp_path, TIMINGS, name=f"pod{i}") for i in (1, 2)]
    lb = procs.add(HAProxy(tmp_path, [p.port for p in pods]))
    lb.wait_ready()
    procs.add(
        Sidecar(
            tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**TIMINGS, **ledger.env()}
        )
    )
    for pod in pods:
        wait_online(pod.http, user)

    rounds = 3
    for n in range(rounds):
        key = f"d{n}-{user}"
        barrier = threading.Barrier(2, timeout=10)

        def call(base, key=key, barrier=barrier):
            barrier.wait()
            return post_job(base, user, "record", {"key": key, "seconds": 0.5}, key=key)

        futures = [procs.callers.submit(call, pod.http) for pod in pods]
        answers = [f.result(timeout=40) for f in futures]
        for a in answers:
            assert a.http_status == 200, a.body
            assert a.status == "completed", a.body
        assert answers[0].body["job_id"] == answers[1].body["job_id"]  # one key, one job
        assert answers[0].body["result"] == answers[1].body["result"]  # the same run
        assert answers[0].body["result"]["key"] == key
    assert ledger.counts() == {f"d{n}-{user}": 1 for n in range(rounds)}, ledger.events()
