"""Redis loses its data (restarted without persistence) while the hubs and the sidecar
stay up, on real processes: two hub pods behind HAProxy on a private ``redis-server``
(no RDB, no AOF), the sidecar through HAProxy.

After the restart presence, the catalogue and the consumer group come back by
themselves; the daemon record (``bridge:daemons:{u}``, which consumer's deliveries went
to which daemon) used to be written only at a session's start, so it stayed gone for as
long as the session lasted. The pod holding the socket then killed mid-job (kill -9),
the same daemon reconnecting to the survivor took nothing over: the job waited for the
reclaim idle (180 s by default), and its caller with it. Now the beat that writes lost
presence back records the daemon again, and the takeover is instant as before the loss.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos._harness import TIMINGS, new_user, presence, wait_online
from tests.procs import (
    HAProxy,
    Ledger,
    RedisServer,
    Sidecar,
    holder,
    issue,
    kill_group,
    log_times,
    wait_until,
)

pytestmark = pytest.mark.chaos

JOB_S = 3.0  # outlives the kill and the reconnect


def _restart_empty(procs, tmp_path, redis: RedisServer) -> RedisServer:
    kill_group(redis)
    again = procs.add(RedisServer(tmp_path, port=redis.port, name="redis-again"))
    again.wait_ready()
    return again


def test_the_same_daemon_takes_over_at_once_after_redis_restarted_empty(tmp_path, procs):
    env = dict(TIMINGS)
    del env["DESKBRIDGE_RECLAIM_IDLE_S"]  # the default, 180 s
    redis = procs.add(RedisServer(tmp_path))
    redis.wait_ready()
    env["DESKBRIDGE_REDIS_URL"] = redis.url
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    pods = [procs.hub(tmp_path, env, name=f"pod{i}") for i in (1, 2)]
    lb = procs.add(HAProxy(tmp_path, [p.port for p in pods]))
    lb.wait_ready()
    sidecar = procs.add(
        Sidecar(tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()})
    )
    sid = wait_online(lb.http, user)
    doomed = wait_until(lambda: holder(pods, user, sid), timeout_s=5, what="socket holder")
    survivor = pods[1] if doomed is pods[0] else pods[0]

    redis = _restart_empty(procs, tmp_path, redis)
    # presence is back within the documented second or so, on the same session
    wait_until(
        lambda: presence(survivor.http, user)[1].get("session_id") == sid,
        timeout_s=5,
        what="presence back after the restart",
    )

    key = "loss-takeover-" + user
    caller = procs.callers.post(
        survivor.http, user, "record", {"key": key, "seconds": JOB_S}, key=key, timeout_s=60
    )
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    killed_at = time.time()
    kill_group(doomed)

    answer = caller.result(timeout=70)
    assert answer.http_status == 200 and answer.status == "completed", answer.body
    assert ledger.counts() == {key: 1}, ledger.events()  # started once
    (end,) = ledger.ends(key)
    print(
        f"\nafter the empty restart: kill -> caller's result {answer.at - killed_at:.3f} s; "
        f"tool end -> result {answer.at - end['t']:.3f} s (reclaim idle 180 s)"
    )
    assert log_times(survivor.output(), "took over 1 entries from its daemon's gone sockets")
    assert answer.at - end["t"] < 2.0
    assert answer.at - killed_at < 15.0  # not the reclaim idle
    log = sidecar.output()
    assert len(log_times(log, f"job {answer.body['job_id']} (record): ok")) == 1, log[-3000:]
