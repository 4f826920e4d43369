"""Issue 16 item 3, the soak's example on real processes: a retry attaches to the job it
retries, and is never answered "offline" about work that then ran.

Attempt 1 is queued (and forwarded) through pod A while the desktop is frozen (SIGSTOP);
pod A, which holds the socket and serves attempt 1's HTTP request, is killed with -9, so
attempt 1's caller gets no answer. Its presence stops counting (A's liveness key expires)
while the desktop is still away. The caller retries with the same idempotency key through
pod B: before, every retry was answered ``offline`` and attempt 1 ran 3.8 s later. Now the
retry waits for attempt 1; the desktop comes back (SIGCONT), reconnects to B, attempt 1 is
redelivered and runs once, and the retry gets its real outcome.
"""

from __future__ import annotations

import signal
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.chaos._harness import TIMINGS, new_user, post_job, presence, wait_online
from tests.procs import (
    REDIS_URL,
    HAProxy,
    Ledger,
    Sidecar,
    holder,
    issue,
    kill_group,
    resp_command,
    wait_until,
)

pytestmark = pytest.mark.chaos


def _indexed(user: str, key: str) -> bool:
    parts = urlsplit(REDIS_URL)
    found = resp_command(
        parts.hostname or "127.0.0.1", parts.port or 6379, "EXISTS", f"bridge:idem:{{{user}}}:{key}"
    )
    return found == 1


def test_retry_after_the_holder_died_waits_for_attempt_1_and_gets_its_outcome(tmp_path, procs):
    user = new_user()
    key = f"pay-{user}"
    ledger = Ledger(tmp_path / "ledger.jsonl")
    pods = [procs.hub(tmp_path, TIMINGS, name=f"pod{i}") for i in (1, 2)]
    lb = procs.add(HAProxy(tmp_path, [p.port for p in pods]))
    lb.wait_ready()
    sidecar = procs.add(
        Sidecar(
            tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**TIMINGS, **ledger.env()}
        )
    )
    sid = wait_online(pods[0].http, user)
    a = holder(pods, user, sid)
    assert a is not None
    b = next(p for p in pods if p is not a)

    sidecar.signal_group(signal.SIGSTOP)  # the desktop freezes (lid closed)
    try:
        attempt_1 = procs.callers.submit(
            post_job, a.http, user, "record", {"key": key}, key=key, timeout_s=60
        )
        wait_until(lambda: _indexed(user, key), timeout_s=10, what="attempt 1 enqueued")
        time.sleep(0.5)  # A reads and forwards it to the frozen desktop
        kill_group(a)  # the pod holding the socket and serving attempt 1 dies
        with pytest.raises(httpx.HTTPError):
            attempt_1.result(timeout=30)
        # A's liveness key expires: its presence stops counting while the desktop is away
        wait_until(
            lambda: not presence(b.http, user)[1]["online"], timeout_s=10, what="offline via B"
        )
        retry = procs.callers.submit(
            post_job, b.http, user, "record", {"key": key}, key=key, timeout_s=60
        )
        time.sleep(2)
        assert not retry.done(), retry.result().body  # not answered "offline"
    finally:
        sidecar.signal_group(signal.SIGCONT)  # the desktop is back inside the deadline
    answer = retry.result(timeout=70)
    assert answer.http_status == 200, answer.body
    assert answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()
    # a later retry (another replica, after the answer) gets the same answer, runs nothing
    again = post_job(b.http, user, "record", {"key": key}, key=key, timeout_s=10)
    assert again.status == "completed" and again.body["job_id"] == answer.body["job_id"]
    assert ledger.counts() == {key: 1}
