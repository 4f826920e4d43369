"""Issue 12.4, instant takeover, on real processes: two hub pods behind HAProxy, the
sidecar through HAProxy, the pod holding its socket SIGKILLed mid-job, with the DEFAULT
reclaim idle (180 s). The same daemon reconnects to the survivor, which takes the dead
pod's entries of that daemon over at once (XCLAIM) and redelivers them; the daemon's
ledger joins the running run. Negative case: a *different* daemon (its own data dir)
gets nothing early; the entry reaches it only after the reclaim idle.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos._harness import TIMINGS, pods_behind_haproxy, wait_online
from tests.procs import Sidecar, issue, kill_group, log_times, wait_until

pytestmark = pytest.mark.chaos

JOB_S = 3.0  # outlives the kill and the reconnect


def test_kill_9_of_the_holding_pod_same_daemon_result_within_2_s_of_the_tool(tmp_path, procs):
    env = dict(TIMINGS)
    del env["DESKBRIDGE_RECLAIM_IDLE_S"]  # the default, 180 s
    user, ledger, sidecar, doomed, survivor, sid = pods_behind_haproxy(tmp_path, procs, env)
    key = "takeover-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=60
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    killed_at = time.time()
    kill_group(doomed)

    answer = caller.result(timeout=70)
    assert answer.http_status == 200 and answer.status == "completed", answer.body
    assert answer.body["result"]["key"] == key
    assert ledger.counts() == {key: 1}, ledger.events()  # started once
    (end,) = ledger.ends(key)
    after_tool_s = answer.at - end["t"]
    total_s = answer.at - killed_at
    log = sidecar.output()
    took_over = log_times(survivor.output(), "took over 1 entries from its daemon's gone sockets")
    print(
        f"\ntakeover: kill -> caller's result {total_s:.3f} s; tool end -> result "
        f"{after_tool_s:.3f} s (reclaim idle 180 s, job {JOB_S:g} s)"
    )
    assert took_over, survivor.output()[-3000:]
    assert after_tool_s < 2.0
    assert total_s < 15.0  # not the reclaim idle
    assert len(log_times(log, f"job {answer.body['job_id']} (record): ok")) == 1, log[-3000:]
    assert wait_online(survivor.http, user) != sid


def test_a_different_daemon_does_not_take_over_early(tmp_path, procs):
    idle_s = 10.0  # shortened so the test sees the entry arrive; still >> a takeover
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": str(idle_s)}
    user, ledger, sidecar, doomed, survivor, sid = pods_behind_haproxy(tmp_path, procs, env)
    key = "no-takeover-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=60
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    (first,) = ledger.starts(key)
    kill_group(sidecar)  # this desktop is gone for good (kill -9 mid-job) ...
    kill_group(doomed)  # ... and so is its pod
    other = procs.add(  # another daemon of the same user: its own data dir, its own id
        Sidecar(tmp_path, survivor.ws, issue(user), tools=["counting_tools"],
                env={**env, **ledger.env()}, name="other")
    )  # fmt: skip
    wait_until(
        lambda: wait_online(survivor.http, user) != sid, timeout_s=20, what="the other online"
    )
    time.sleep(3.0)  # well past any takeover (which takes well under a second)
    assert ledger.counts() == {key: 1}, ledger.events()
    assert "took over" not in survivor.output()

    answer = caller.result(timeout=70)
    assert answer.status == "completed", answer.body
    assert ledger.counts() == {key: 2}  # that desktop never saw it: it ran there
    second = ledger.starts(key)[1]
    print(
        f"\nno takeover: the other daemon started it {second['t'] - first['t']:.3f} s after "
        f"the first delivery (reclaim idle {idle_s:g} s)"
    )
    assert second["t"] - first["t"] >= idle_s - 0.1
    assert "took over" not in other.output()
