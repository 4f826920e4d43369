"""Issue 3, item 6, case a: the hub restarts with pending entries for a connected user.

What "pending" means here: consumer names are unique per process, so a restarted hub is
a *new* consumer. Its startup drain (XREADGROUP from ``0``) only ever sees its own
entries — none; the dead process's pending entries come back through its daemon's
takeover at the new session's start (the same daemon reconnects), or XAUTOCLAIM once
idle for ``RECLAIM_IDLE_S``. Jobs enqueued while no hub ran at all (presence still alive
within its TTL, so callers were not told "offline") were either pushed to the dead
process (push delivery, while its liveness key lived: they are among its pending entries)
or never delivered to any consumer and read with ``>`` as soon as a hub serves the user
again.

The sidecar dials the one pod directly; the pod is SIGKILLed (its whole process group)
and started again on the same port. Callers use ``Bridge.dispatch`` over Redis from the
test process, so they wait through the time when no hub runs at all.
"""

from __future__ import annotations

import time

import pytest
from deskbridge_hub._substrate import GROUP, jobs_key, presence_key

from tests.chaos._harness import TIMINGS, bridge_dispatch, new_user, wait_online
from tests.chaos._harness import redis_command as redis
from tests.procs import REDIS_URL, Ledger, Sidecar, issue, kill_group, log_times, wait_until

pytestmark = pytest.mark.chaos

RECLAIM_IDLE_S = 3.0
JOB_S = 1.0


def test_restarted_hub_reclaims_pending_and_delivers_jobs_queued_while_down(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # presence must outlive the outage (kill, enqueue, restart) so callers are queued,
    # not told "offline": 10 s instead of 3
    env = {
        **TIMINGS,
        "DESKBRIDGE_RECLAIM_IDLE_S": str(RECLAIM_IDLE_S),
        "DESKBRIDGE_PRESENCE_TTL_S": "10",
    }
    pod = procs.hub(tmp_path, env, name="pod")
    sidecar = procs.add(
        Sidecar(
            tmp_path, pod.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()}
        )
    )
    wait_online(pod.http, user)

    def dispatch(key, seconds=0.0):
        return procs.callers.submit(
            bridge_dispatch,
            REDIS_URL,
            user,
            "record",
            {"key": key, "seconds": seconds},
            key=key,
            timeout_s=30,
        )

    running_key = "a-running-" + user
    first = dispatch(running_key, JOB_S)
    wait_until(lambda: ledger.starts(running_key), timeout_s=10, what="the job started")
    kill_group(pod)
    killed_at = time.time()

    # no hub runs now; presence is still alive (within its TTL), so these are enqueued
    assert redis("GET", presence_key(user)) is not None
    queued_keys = [f"a-queued{i}-{user}" for i in range(3)]
    queued = [dispatch(k) for k in queued_keys]
    wait_until(
        lambda: redis("XLEN", jobs_key(user)) == 1 + len(queued_keys),
        timeout_s=10,
        what="jobs enqueued while no hub runs",
    )
    wait_until(lambda: ledger.ends(running_key), timeout_s=10, what="the orphaned run finished")
    assert not first.done() and not any(f.done() for f in queued)
    pending = redis("XPENDING", jobs_key(user), GROUP)
    # the running job's entry, pending for the dead consumer, and those of the jobs a
    # caller pushed to it (push delivery) while its liveness key outlived it (at most
    # PROCESS_LIVENESS_TTL_S); the rest wait unread in the stream
    assert 1 <= pending[0] <= 1 + len(queued_keys), pending
    assert len(pending[3]) == 1, pending  # one consumer holds them: the dead one
    dead_consumer = pending[3][0][0]

    pod2 = procs.hub(tmp_path, env, port=pod.port, name="pod-restarted")
    restarted_at = time.time()

    answers = {k: f.result(timeout=30) for k, f in zip(queued_keys, queued, strict=True)}
    answers[running_key] = first.result(timeout=30)
    for key, a in answers.items():
        assert a.status == "completed", (key, a.body)
        assert a.body["result"]["key"] == key
    assert ledger.counts() == {k: 1 for k in answers}, ledger.events()

    # The same daemon came back, so the restarted process took the dead consumer's entry
    # over at once (instant takeover, issue 12.4) instead of waiting the reclaim idle; its
    # ledger answered the redelivery (no second start, asserted above). Either way the
    # answer can only come after the restart: no hub ran before it.
    assert answers[running_key].at >= restarted_at
    job_id = answers[running_key].body["job_id"]
    log = sidecar.output()
    assert len(log_times(log, f"job {job_id} (record): answered from the dedupe cache")) == 1
    assert len(log_times(log, "welcomed by hub")) == 2

    # everything acked; the restarted process is a new consumer, the dead one holds nothing
    wait_until(
        lambda: redis("XPENDING", jobs_key(user), GROUP)[0] == 0, timeout_s=5, what="all acked"
    )

    # ... and the next reclaim pass deletes the dead process's consumer name altogether
    def consumers():
        return {c[1]: c[3] for c in redis("XINFO", "CONSUMERS", jobs_key(user), GROUP)}

    wait_until(lambda: dead_consumer not in consumers(), timeout_s=10, what="dead consumer pruned")
    assert len(consumers()) == 1
    assert wait_online(pod2.http, user)
    queued_done = max(answers[k].at for k in queued_keys) - restarted_at
    print(
        f"\ncase a: hub down {restarted_at - killed_at:.3f} s; after the restart the "
        f"{len(queued_keys)} jobs queued meanwhile answered within {queued_done:.3f} s, the "
        f"reclaimed one {answers[running_key].at - restarted_at:.3f} s "
        f"(taken over by the same daemon's new session)"
    )
