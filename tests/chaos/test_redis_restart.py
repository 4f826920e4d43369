"""Issue 3, item 6, case e: Redis restarts, without persistence, while the user is
connected.

A private ``redis-server`` (no RDB, no AOF) serves two pods; the sidecar holds its socket
on pod 1, callers use the pods directly. Redis is SIGKILLed:

* calls during the outage are answered ``503 unavailable`` — never ``offline``: "Redis is
  down" says nothing about the desktop (invariant 5); a call that was waiting on a
  running job when Redis died is answered ``unavailable`` too, and the job ran once;
* the sidecar's socket stays up (liveness is the application ping, not Redis);
* the hubs back off (no tight error loop: their logs stay short).

Redis then comes back empty on the same port: presence is rewritten within one
heartbeat; the stream and its consumer group are gone. Redis is restarted just after the
relay went to sleep for its longest back-off (1 s), so the first jobs (through pod 2,
whose cache says the group exists) reach Redis *before* the relay reads again: the
submit script finds the stream gone and makes the group from ``0`` with MKSTREAM before
its XADD, so no entry reaches a stream without its group (before, a bare XADD did, and
the relay's read got NOGROUP and recreated the group from ``0``: both keep the entries).
A MONITOR client records the command order to prove that premise. Every job enqueued
after the restart runs exactly once.
"""

from __future__ import annotations

import shlex
import time

import pytest
from deskbridge_hub._retry import READ_ERROR_BACKOFF_S
from deskbridge_hub._substrate import jobs_key, presence_key

from tests.chaos._harness import (
    TIMINGS,
    cpu_seconds,
    new_user,
    post_job,
    presence,
    wait_online,
    worker_pid,
)
from tests.procs import (
    Ledger,
    Proc,
    RedisServer,
    Sidecar,
    issue,
    kill_group,
    log_times,
    wait_until,
)

pytestmark = pytest.mark.chaos

HEARTBEAT_S = 1.0
OUTAGE_S = 4.0
#: error lines a pod may log for a ~5 s outage: heartbeat (1/s), relay retries (back-off
#: capped at 2 s), publish retries (capped at 5 s); a tight loop would log thousands.
MAX_ERROR_LINES = 100


def _error_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if " WARNING " in line or " ERROR " in line)


def _monitored(text: str, key: str) -> list[list[str]]:
    """Commands on ``key`` seen by MONITOR, as token lists, in order."""
    out = []
    for line in text.splitlines():
        _, _, command = line.partition("] ")
        tokens = shlex.split(command) if command else []
        if key in tokens:
            out.append(tokens)
    return out


def test_redis_restart_without_persistence_while_connected(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    redis = procs.add(RedisServer(tmp_path))
    redis.wait_ready()
    env = {
        **TIMINGS,
        "DESKBRIDGE_REDIS_URL": redis.url,
        "DESKBRIDGE_HEARTBEAT_S": str(HEARTBEAT_S),
        "DESKBRIDGE_LOG_LEVEL": "DEBUG",  # the read loops' retries (the restart's cue below)
    }
    relay_pod, api_pod = pods = [procs.hub(tmp_path, env, name=f"pod{i}") for i in (1, 2)]
    sidecar = procs.add(
        Sidecar(
            tmp_path,
            relay_pod.ws,
            issue(user),
            tools=["counting_tools"],
            env={**env, **ledger.env()},
        )
    )
    sid = wait_online(api_pod.http, user)
    warm = post_job(api_pod.http, user, "record", {"key": "e-warm-" + user}, key="e-warm-" + user)
    assert warm.status == "completed", warm.body

    # a call waiting on a running job when Redis dies
    inflight_key = "e-inflight-" + user
    inflight = procs.callers.post(
        api_pod.http, user, "record", {"key": inflight_key, "seconds": 2.0}, key=inflight_key
    )
    wait_until(lambda: ledger.starts(inflight_key), timeout_s=10, what="the job started")
    log_marks = [len(p.output()) for p in pods]
    pids = [worker_pid(p) for p in pods]
    cpu_before = [cpu_seconds(pid) for pid in pids]
    kill_group(redis)
    down_at = time.time()

    answer = inflight.result(timeout=15)
    assert answer.http_status == 503 and answer.status == "unavailable", answer.body

    outage_answers = []
    while time.time() - down_at < OUTAGE_S:
        for pod in pods:
            key = f"e-outage{len(outage_answers)}-{user}"
            outage_answers.append(post_job(pod.http, user, "record", {"key": key}, key=key))
            code, body = presence(pod.http, user)
            assert code == 503 and body["status"] == "unavailable", body
        time.sleep(0.25)
    for a in outage_answers:
        assert a.http_status == 503 and a.status == "unavailable", a.body

    # restart Redis right after the relay went to sleep for its longest back-off
    retry_line = f"retrying in {READ_ERROR_BACKOFF_S[-1]:.2f} s"
    seen = relay_pod.output().count(retry_line)
    wait_until(
        lambda: relay_pod.output().count(retry_line) > seen,
        timeout_s=5,
        what="the relay backing off its longest step",
    )
    outage_logs = [p.output()[mark:] for p, mark in zip(pods, log_marks, strict=True)]
    outage_cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu_before, strict=True)]
    outage_s = time.time() - down_at
    redis2 = procs.add(RedisServer(tmp_path, port=redis.port, name="redis-again"))
    redis2.wait_ready()
    up_at = time.time()
    monitor = procs.add(
        Proc(
            ["redis-cli", "-p", str(redis.port), "monitor"],
            {},
            tmp_path / "redis-monitor.log",
        )
    )
    wait_until(lambda: "OK" in monitor.output(), timeout_s=5, what="MONITOR attached")
    # the heartbeat rewrites presence in the new Redis (watched there directly, every
    # 20 ms) within one heartbeat; every replica then reads the user online again
    wait_until(
        lambda: redis2.command("GET", presence_key(user)) == sid,
        timeout_s=HEARTBEAT_S + 3,
        interval_s=0.02,
        what="presence rewritten",
    )
    online_after = time.time() - up_at
    assert online_after < HEARTBEAT_S + 0.3
    assert wait_online(api_pod.http, user) == sid
    assert wait_online(relay_pod.http, user) == sid  # the same session: never reconnected

    # first through the pod whose group cache is stale (the script remakes the group), then
    # through both
    keys = [f"e-after{i}-{user}" for i in range(6)]
    first = [procs.callers.post(api_pod.http, user, "record", {"key": k}, key=k) for k in keys[:3]]
    answers = [f.result(timeout=20) for f in first]
    rest = [
        procs.callers.post(pods[i % 2].http, user, "record", {"key": k}, key=k)
        for i, k in enumerate(keys[3:])
    ]
    answers += [f.result(timeout=20) for f in rest]
    for k, a in zip(keys, answers, strict=True):
        assert a.http_status == 200 and a.status == "completed", (k, a.body)
        assert a.body["result"]["key"] == k

    counts = ledger.counts()
    for k in keys:
        assert counts[k] == 1, ledger.events()
    assert counts[inflight_key] == 1  # ran once; its caller was told "unavailable"
    assert not any(k.startswith("e-outage") for k in counts)  # nothing was enqueued
    log = sidecar.output()
    assert len(log_times(log, "welcomed by hub")) == 1, log[-3000:]
    assert "disconnected from hub" not in log

    # the premise: the new Redis had neither the stream nor its group, though the api
    # pod's session had made the group before (its cache says so); the first enqueue's
    # script made the group (from 0, MKSTREAM) before its XADD, so no entry reached a
    # stream without its group (before the fix-submit round, a bare XADD did, and the
    # holder recreated the group from 0 after its read failed with NOGROUP)
    commands = _monitored(monitor.output(), jobs_key(user))
    names = [
        " ".join(c[:2]).upper() if c[0].upper() == "XGROUP" else c[0].upper() for c in commands
    ]
    assert "XADD" in names and "XGROUP CREATE" in names, commands
    create_at = names.index("XGROUP CREATE")
    assert create_at < names.index("XADD"), commands[: names.index("XADD") + 1]
    assert commands[create_at][-2:] == ["0", "MKSTREAM"], commands[create_at]

    errors = [_error_lines(text) for text in outage_logs]
    print(
        f"\ncase e: Redis down {up_at - down_at:.2f} s; {len(outage_answers)} calls answered "
        f"503 unavailable; presence back {online_after:.3f} s after Redis; "
        "the group remade before the first XADD; "
        f"{len(keys)} jobs after the restart ran once each; "
        f"warning/error lines per pod during the outage: {errors}; CPU per pod "
        f"{', '.join(f'{c:.2f} s' for c in outage_cpu)} in {outage_s:.2f} s"
    )
    for text, n in zip(outage_logs, errors, strict=True):
        assert n < MAX_ERROR_LINES, text[-3000:]
    for cpu in outage_cpu:  # a silent busy loop would burn ~1 CPU second per second
        assert cpu < 0.25 * outage_s
