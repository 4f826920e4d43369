"""Issue 12 item 3: fenced deliveries on real processes. A zombie's late answer is refused.

Two pods, two desktops of one user (two sidecar processes, each with its own ledger: a
second daemon, so its redelivery really runs). Pod A delivers a long job to sidecar X;
sidecar Y then connects to pod B and supersedes X (newest wins). A's session keeps
waiting for X's running job (a long grace), while B, past the reclaim idle, reclaims the
entry and delivers it again to Y: A is now a zombie holding an older delivery. X's run
ends first; A's answer carries the older claim epoch and is refused (one WARNING, the
counter, nothing published). Y's run ends later and is the caller's answer.

Before the fence, A published X's result (the caller got it) and B published Y's behind
it: two answers for one job, the first from a delivery that had been taken over.
"""

from __future__ import annotations

import httpx
import pytest

from tests.chaos._harness import TIMINGS, headers, new_user, redis_command, wait_online
from tests.procs import REDIS_URL, Ledger, Sidecar, issue, wait_until

pytestmark = pytest.mark.chaos

#: X's run: longer than the reclaim idle (3 s) plus a heartbeat (1 s) plus B's delivery,
#: so B's delivery comes first; Y's run (the same length) ends well after X's.
JOB_S = 8.0


def test_a_zombies_late_answer_is_refused_and_the_newest_delivery_answers(tmp_path, procs):
    env = {**TIMINGS, "DESKBRIDGE_GRACE_S": "30"}  # A's superseded session waits for X
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    pod_a = procs.hub(tmp_path, env, name="podA")
    pod_b = procs.hub(tmp_path, env, name="podB")
    sidecar_env = {**TIMINGS, **ledger.env()}
    procs.add(Sidecar(tmp_path, pod_a.ws, issue(user), tools=["counting_tools"], env=sidecar_env))
    first_sid = wait_online(pod_a.http, user)

    key = "zombie-" + user
    caller = procs.callers.post(
        pod_b.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=45
    )
    (x_start,) = wait_until(lambda: ledger.starts(key), timeout_s=10, what="X started the job")
    procs.add(
        Sidecar(
            tmp_path, pod_b.ws, issue(user), tools=["counting_tools"], env=sidecar_env, name="y"
        )
    )
    wait_until(
        lambda: wait_online(pod_b.http, user) != first_sid, timeout_s=15, what="Y holds presence"
    )

    answer = caller.result(timeout=60)
    assert answer.http_status == 200 and answer.status == "completed", answer.body
    starts = ledger.starts(key)
    assert len(starts) == 2, ledger.events()  # X's run, then Y's (another daemon's ledger)
    y_start = next(s for s in starts if s["pid"] != x_start["pid"])
    assert y_start["t"] < x_start["t"] + JOB_S  # B redelivered while X still ran
    # the caller's answer is the newest delivery's (Y's run), never the zombie's
    assert answer.body["result"]["pid"] == y_start["pid"], answer.body

    job_id = answer.body["job_id"]
    needle = f"stale answer (completed) of job {job_id} refused: delivery epoch 1, newest 2"
    wait_until(lambda: needle in pod_a.output(), timeout_s=10, what="A's refusal logged")
    assert pod_a.output().count(needle) == 1
    assert f"job {job_id} finished" not in pod_a.output()  # A never answered it
    assert redis_command("LLEN", f"bridge:result:{{{user}}}:{job_id}", url=REDIS_URL) == 1
    with httpx.Client(headers=headers(), timeout=10) as client:
        metrics = client.get(f"{pod_a.http}/metrics").text
    assert "deskbridge_stale_results_total 1.0" in metrics, metrics[-2000:]
