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

A store that lost only its *last* writes (a replica promoted without them, an older
snapshot restored) can name the desktop's previous session again, on a pod since killed:
the current session's beat took that for a newer sidecar and closed with 4001, and the
sidecar stopped for good (exit status 3). Now the beat checks the holder first.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.chaos._harness import (
    TIMINGS,
    headers,
    new_user,
    pods_behind_haproxy,
    post_job,
    presence,
    wait_online,
)
from tests.procs import (
    Ledger,
    RedisServer,
    Sidecar,
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
    user, ledger, sidecar, doomed, survivor, sid = pods_behind_haproxy(tmp_path, procs, env)

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


def test_presence_rewound_to_the_previous_session_keeps_the_desktop(tmp_path, procs):
    heartbeat_s = 2.0
    redis = procs.add(RedisServer(tmp_path))
    redis.wait_ready()
    env = {
        **TIMINGS, "DESKBRIDGE_REDIS_URL": redis.url, "DESKBRIDGE_PRESENCE_TTL_S": "60",
        "DESKBRIDGE_HEARTBEAT_S": str(heartbeat_s),
    }  # fmt: skip
    user, ledger, sidecar, doomed, survivor, first = pods_behind_haproxy(tmp_path, procs, env)
    kill_group(doomed)  # the desktop moves to the survivor
    second = wait_until(
        lambda: (s := wait_online(survivor.http, user)) != first and s,
        timeout_s=20,
        what="the desktop on the survivor",
    )
    # the store names the previous session again, as the lost writes left it
    redis.command("SET", f"bridge:presence:{{{user}}}", first, "PX", 60_000)
    rewound_at = time.time()
    time.sleep(heartbeat_s + 1.5)  # the next beat, and its check
    back = wait_until(
        lambda: presence(survivor.http, user)[1].get("session_id") == second,
        timeout_s=5,
        what="presence back on the current session",
    )
    back_s = time.time() - rewound_at
    print(f"\nrewound presence: the current session holds it again {back_s:.1f} s on")
    assert back and sidecar.popen.poll() is None, sidecar.output()[-2000:]
    assert "superseded" not in sidecar.output()
    key = "after-rewind-" + user
    answer = post_job(survivor.http, user, "record", {"key": key}, key=key, timeout_s=10)
    assert answer.status == "completed", answer.body
    assert ledger.counts() == {key: 1}
    assert "which" not in survivor.output() and "its process is gone" in survivor.output()


def test_a_restore_without_the_last_writes_brings_the_newest_desktop_back_at_once(tmp_path, procs):
    """Redis comes back from a snapshot taken before the newest desktop connected (as a
    replica promoted without the last writes): that desktop's presence is gone, the
    older one's is there. The process looked at one presence after the outage, its
    oldest session's, found it intact, and the newest desktop read offline until its
    next heartbeat. It now looks at the newest session's."""
    heartbeat_s = 20.0
    redis = procs.add(RedisServer(tmp_path, extra=("--dbfilename", "dump.rdb")))
    redis.wait_ready()
    env = {
        **TIMINGS, "DESKBRIDGE_REDIS_URL": redis.url, "DESKBRIDGE_HEARTBEAT_S": str(heartbeat_s),
        "DESKBRIDGE_PRESENCE_TTL_S": "60",
    }  # fmt: skip
    hub = procs.hub(tmp_path, env, name="pod")
    older, newer = new_user(), new_user()
    for user in (older, newer):
        procs.add(Sidecar(tmp_path, hub.ws, issue(user), env=env, name=f"sidecar-{user}"))
        wait_online(hub.http, user)
        if user == older:
            assert redis.command("SAVE") == "OK"  # the snapshot: before the newer one
    kill_group(redis)
    again = procs.add(RedisServer(tmp_path, port=redis.port, extra=("--dbfilename", "dump.rdb")))
    again.wait_ready()
    restored_at = time.time()
    assert again.command("EXISTS", f"bridge:presence:{{{older}}}") == 1
    wait_until(
        lambda: presence(hub.http, newer)[1].get("online"),
        timeout_s=5,  # well under the heartbeat (20 s)
        what="the newest desktop online again",
    )
    print(
        f"\nrestored without the last writes: newest desktop online again "
        f"{time.time() - restored_at:.1f} s on"
    )


def test_presence_rewound_to_an_ended_session_is_cleared_by_the_first_call(tmp_path, procs):
    """The desktop stopped (its session ended, presence cleared), then the store named
    that session again, on a process that is alive: every call was pushed to that
    process, which holds no session of the user, and answered ``timeout`` "delivered,
    may be running" after its whole wait, until the rewound presence expired (90 s).
    The wake-up of the first call now makes the process clear it: the next calls are
    answered ``offline`` at once. Nothing runs."""
    redis = procs.add(RedisServer(tmp_path))
    redis.wait_ready()
    env = {
        **TIMINGS, "DESKBRIDGE_REDIS_URL": redis.url, "DESKBRIDGE_PRESENCE_TTL_S": "60",
        "DESKBRIDGE_HEARTBEAT_S": "20",
    }  # fmt: skip
    hub = procs.hub(tmp_path, env, name="pod")
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar_env = {**env, **ledger.env()}
    sidecar = procs.add(
        Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=sidecar_env)
    )
    sid = wait_online(hub.http, user)
    sidecar.stop(timeout_s=10)
    wait_until(lambda: not presence(hub.http, user)[1]["online"], timeout_s=5, what="offline")
    redis.command("SET", f"bridge:presence:{{{user}}}", sid, "PX", 60_000)
    answers = [post_job(hub.http, user, "record", {"key": f"r{i}"}, timeout_s=3) for i in range(3)]
    print("\nafter the rewind:", [(a.status, a.body.get("detail")) for a in answers])
    # the first was pushed to the process for the ended session, and no desktop got it:
    # queued (was: "delivered, may be running"), and it stays so
    assert (answers[0].status, answers[0].body.get("detail")) == ("timeout", {"stage": "queued"})
    with httpx.Client(headers=headers(), timeout=5.0) as client:
        job = client.get(f"{hub.http}/v1/jobs/{answers[0].body['job_id']}").json()
    assert job["stage"] == "queued", job
    assert answers[-1].status == "offline", answers[-1].body
    assert answers[1].status == "offline", answers[1].body
    assert ledger.counts() == {}
    assert "it ended in this process" in hub.output()
