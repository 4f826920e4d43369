"""Issue 11 item 1 on real processes: a Redis that evicts keys under memory pressure from
another client, then a replica, behind a real hub and a real sidecar. Calls to the
connected desktop are never answered "offline"; readiness fails with the cause; the hub
logs one line when the bad state starts and one when it ends; after the fix, presence is
back within a heartbeat and calls complete. Every wait bounded."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.procs import (
    Hub,
    RedisServer,
    Sidecar,
    api,
    issue,
    log_text,
    presence_key,
    running,
    wait_until,
)

pytestmark = pytest.mark.integration

FAST = {"DESKBRIDGE_HEARTBEAT_S": "1", "DESKBRIDGE_PRESENCE_TTL_S": "3"}
STARTS = "cannot serve the hub"
ENDS = "usable again"


def _port_in_range(low: int = 7100, high: int = 7200) -> int:
    for port in range(low + secrets.randbelow(high - low), high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 7100-7199")


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, port=_port_in_range(), name="degraded")
    with running(server):
        server.wait_ready()
        yield server


def _call(client: httpx.Client, hub: Hub, user: str) -> tuple[int, str]:
    r = client.post(
        f"{hub.http}/v1/users/{user}/jobs",
        json={"name": "echo", "args": {"n": 1}, "timeout_s": 5},
    )
    body = r.json()
    return r.status_code, body.get("status") or body.get("error", {}).get("code", "?")


def _fill(redis: RedisServer, key: str) -> None:
    """Another client's write (no TTL); refused with OOM once nothing is evictable."""
    try:
        redis.command("SET", key, "x" * 65536)
    except RuntimeError as exc:
        if not str(exc).startswith("OOM"):
            raise


def _connected(tmp_path: Path, redis: RedisServer) -> tuple[Hub, Sidecar, str]:
    user = f"degraded-{secrets.token_hex(4)}"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_REDIS_URL": redis.url, **FAST})
    hub.wait_healthy()
    sidecar = Sidecar(tmp_path, hub.ws, issue(user))
    wait_until(
        lambda: redis.command("EXISTS", presence_key(user)) == 1,
        timeout_s=20,
        what="sidecar present",
    )
    return hub, sidecar, user


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_evicting_redis_answers_unavailable_never_offline(
    tmp_path: Path, redis: RedisServer, policy: str
) -> None:
    """allkeys-lru is the issue's example (LRU mostly spares the heartbeat-refreshed
    presence key, so calls may still complete; none may say offline). volatile-lru with
    a filler that sets no TTL evicts exactly the hub's expiring keys, presence first:
    the calls that meet an evicted presence must answer unavailable."""
    hub, sidecar, user = _connected(tmp_path, redis)
    with running(sidecar, hub), api() as client:
        assert _call(client, hub, user) == (200, "completed")
        # the operator's mistake, then another client's memory pressure
        redis.command("CONFIG", "SET", "maxmemory", str(8 * 1024 * 1024))
        redis.command("CONFIG", "SET", "maxmemory-policy", policy)
        for i in range(400):
            _fill(redis, f"filler:{i}")
        health = wait_until(
            lambda: (r := httpx.get(hub.http + "/healthz", timeout=2)).status_code == 503 and r,
            timeout_s=10,
            what="readiness failing",
        )
        assert policy in health.text
        answers = []
        for i in range(20):
            _fill(redis, f"filler:more:{i}")  # keep evicting
            answers.append(_call(client, hub, user))
        assert all(a != (503, "offline") for a in answers), answers
        assert all(a in ((200, "completed"), (503, "unavailable")) for a in answers), answers
        if policy == "volatile-lru":
            assert (503, "unavailable") in answers, answers
        # fixed: noeviction, memory back
        redis.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        redis.command("CONFIG", "SET", "maxmemory", "0")
        redis.command(
            "EVAL",
            "for _, k in ipairs(redis.call('KEYS', 'filler:*')) do redis.call('DEL', k) end",
            0,
        )
        hub.wait_healthy(timeout_s=10)
        wait_until(
            lambda: redis.command("EXISTS", presence_key(user)) == 1,
            timeout_s=3,  # one heartbeat (1 s) plus slack
            what="presence restored",
        )
        assert _call(client, hub, user) == (200, "completed")
    log = log_text(hub)
    assert log.count(STARTS) == 1, log[-4000:]
    assert log.count(ENDS) == 1, log[-4000:]


def test_a_hub_pointed_at_a_replica_says_so_and_recovers_on_promotion(
    tmp_path: Path, redis: RedisServer
) -> None:
    replica = RedisServer(tmp_path, port=_port_in_range(), name="replica")
    with running(replica):
        replica.wait_ready()
        replica.command("REPLICAOF", "127.0.0.1", str(redis.port))
        wait_until(
            lambda: "master_link_status:up" in replica.command("INFO", "replication"),
            timeout_s=10,
            what="replica linked",
        )
        user = f"replica-{secrets.token_hex(4)}"
        hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_REDIS_URL": replica.url, **FAST})
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar, hub), api() as client:
            wait_until(lambda: STARTS in log_text(hub), timeout_s=20, what="start-up line")
            assert "replica" in log_text(hub)
            r = httpx.get(hub.http + "/healthz", timeout=2)
            assert r.status_code == 503 and "replica" in r.text
            status, outcome = _call(client, hub, user)
            assert (status, outcome) == (503, "unavailable")
            replica.command("REPLICAOF", "NO", "ONE")  # promoted
            hub.wait_healthy(timeout_s=10)
            wait_until(
                lambda: replica.command("EXISTS", presence_key(user)) == 1,
                timeout_s=5,
                what="presence written once writable",
            )
            assert _call(client, hub, user) == (200, "completed")
        log = log_text(hub)
        assert log.count(STARTS) == 1, log[-4000:]
        assert log.count(ENDS) == 1, log[-4000:]


def test_redis_down_at_start_is_one_line_then_recovery(tmp_path: Path) -> None:
    port = _port_in_range()
    hub = Hub(
        tmp_path,
        workers=1,
        env={"DESKBRIDGE_REDIS_URL": f"redis://127.0.0.1:{port}/0", **FAST},
        name="hub-no-redis",
    )
    with running(hub):
        wait_until(
            lambda: "unreachable (hub starting)" in log_text(hub),
            timeout_s=20,
            what="start-up line",
        )
        r = httpx.get(hub.http + "/healthz", timeout=2)
        assert r.status_code == 503 and f"127.0.0.1:{port}" in r.text
        redis = RedisServer(tmp_path, port=port, name="late")
        with running(redis):
            redis.wait_ready()
            hub.wait_healthy(timeout_s=10)
            usable = f"Redis at 127.0.0.1:{port} usable"
            wait_until(lambda: usable in log_text(hub), timeout_s=5, what="usable line")
        log = log_text(hub)
    assert log.count("unreachable (hub starting)") == 1, log[-4000:]
    assert log.count(usable) == 1, log[-4000:]


def test_a_redis_user_lacking_a_command_is_named_at_start_never_a_500(
    tmp_path: Path, redis: RedisServer
) -> None:
    """An ACL user allowed scripts but not XREADGROUP (which the hub runs inside its
    scripts) passed the start-up probe: the hub said "usable", /healthz answered 200,
    the first call was a 500 and the reader logged a traceback every second while calls
    timed out "queued". Now the start-up line names the command at ERROR, /healthz
    answers 503 with it, and calls are answered 503 ``unavailable``, never a 500."""
    redis.command(
        "ACL", "SETUSER", "hub", "on", ">pw",
        "~bridge:*", "&bridge:*", "+@all", "-@dangerous", "+info", "-xreadgroup",
    )  # fmt: skip
    user = f"acl-{secrets.token_hex(4)}"
    url = f"redis://hub:pw@127.0.0.1:{redis.port}/0"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_REDIS_URL": url, **FAST})
    sidecar = Sidecar(tmp_path, hub.ws, issue(user))
    with running(sidecar, hub), api() as client:
        line = wait_until(
            lambda: [ln for ln in log_text(hub).splitlines() if "Redis at" in ln],
            timeout_s=60,
            what="the start-up line about Redis",
        )[0]
        assert "ERROR" in line and STARTS in line and "XREADGROUP" in line, line
        health = httpx.get(hub.http + "/healthz", timeout=2)
        assert health.status_code == 503 and "XREADGROUP" in health.text, health.text
        wait_until(
            lambda: redis.command("EXISTS", presence_key(user)) == 1,
            timeout_s=20,
            what="sidecar present",
        )
        answers = [_call(client, hub, user) for _ in range(3)]
        assert answers == [(503, "unavailable")] * 3, answers
        # the operator grants it: usable again without a restart
        redis.command("ACL", "SETUSER", "hub", "+xreadgroup")
        hub.wait_healthy(timeout_s=10)
        assert _call(client, hub, user) == (200, "completed")
    log = log_text(hub)
    assert "Traceback" not in log, log[-4000:]
    assert log.count(ENDS) == 1, log[-4000:]


def test_a_redis_user_with_only_the_needed_commands_serves(
    tmp_path: Path, redis: RedisServer
) -> None:
    """The other side of the probe's list (``NEEDED_COMMANDS``): a user granted only
    those commands (and the connection's own) is found usable and serves a call, so a
    command the hub sends but the list lacks fails here rather than in production."""
    from deskbridge_hub._redis_health import NEEDED_COMMANDS, needed_command_name

    grants = sorted({f"+{needed_command_name(c).lower()}" for c in NEEDED_COMMANDS})
    redis.command(
        "ACL", "SETUSER", "hub", "on", ">pw", "~bridge:*", "-@all",
        "+hello", "+auth", "+client|setname", "+info", *grants,
    )  # fmt: skip
    user = f"acl-{secrets.token_hex(4)}"
    url = f"redis://hub:pw@127.0.0.1:{redis.port}/0"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_REDIS_URL": url, **FAST})
    hub.wait_healthy()
    sidecar = Sidecar(tmp_path, hub.ws, issue(user))
    with running(sidecar, hub), api() as client:
        wait_until(
            lambda: redis.command("EXISTS", presence_key(user)) == 1,
            timeout_s=20,
            what="sidecar present",
        )
        assert [_call(client, hub, user) for _ in range(3)] == [(200, "completed")] * 3
    log = log_text(hub)
    assert "Traceback" not in log and "NOPERM" not in log, log[-4000:]
