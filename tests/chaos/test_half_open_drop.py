"""Issue 3, item 6, case c (second form): the socket drops on the sidecar's side only.

The field's common drop (a Wi-Fi switch, a NAT timeout): the sidecar learns of it at
once (its socket is reset), the hub only from its own ping deadline. The sidecar dials
the pod through a TCP proxy in the test process that resets the client end and leaves
the hub end open and silent. The sidecar reconnects to the *same* hub process while
that process's old session still holds the job in flight; the old session is
superseded (same process: at once) and ends. The job's entry is pending for this very
process's consumer and no longer in flight, so it must be redelivered as soon as the
old session lets go of it — not after the reclaim idle (the bug this test found: the
new session's relay had drained while the entry was still in flight, skipped it, and
never looked again; the entry waited the full reclaim idle).
"""

from __future__ import annotations

import time

import pytest

from tests.chaos._harness import TIMINGS, CuttableProxy, new_user, wait_online
from tests.procs import Ledger, Sidecar, holder, issue, log_times, wait_until

pytestmark = pytest.mark.chaos

RECLAIM_IDLE_S = 30.0  # far beyond the bound below: only a drain can deliver in time
JOB_S = 1.0


def test_sidecar_side_drop_redelivered_by_the_same_process_without_reclaim(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S)}
    pod = procs.hub(tmp_path, env, name="pod")
    proxy = CuttableProxy(pod.port)
    try:
        sidecar = procs.add(
            Sidecar(
                tmp_path,
                proxy.ws,
                issue(user),
                tools=["counting_tools"],
                env={**env, **ledger.env()},
            )
        )
        sid = wait_online(pod.http, user)
        key = "c-half-" + user
        caller = procs.callers.post(
            pod.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=60
        )
        wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
        assert proxy.cut_client_side() == 1
        cut_at = time.time()

        answer = caller.result(timeout=RECLAIM_IDLE_S + 20)
        took = answer.at - cut_at
        assert answer.http_status == 200 and answer.status == "completed", answer.body
        assert ledger.counts() == {key: 1}, ledger.events()
        new_sid = wait_online(pod.http, user)
        assert new_sid != sid and holder([pod], user, new_sid) is pod
        log = sidecar.output()
        welcomed = log_times(log, "welcomed by hub")
        print(
            f"\ncase c (sidecar-side drop): reconnected {welcomed[-1] - cut_at:.3f} s after "
            f"the drop; caller's result {took:.3f} s after the drop "
            f"(reclaim idle {RECLAIM_IDLE_S:g} s)"
        )
        # the old session was superseded in-process and let go of the job unanswered
        assert "superseded by a newer sidecar session" in pod.output()
        # reconnect (backoff <= 0.5 s) + the old session's grace (1 s) + one read block
        # (0.5 s) + slack; the reclaim idle (30 s) would be far beyond
        assert took < 6.0, "redelivered only by the reclaim, not by the same process's drain"
    finally:
        proxy.close()
