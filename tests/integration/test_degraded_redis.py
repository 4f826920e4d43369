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

from tests.hub.test_redis_health import LEAST_PRIVILEGE
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
    _wait_present(redis, user)
    return hub, sidecar, user


def _wait_present(redis: RedisServer, user: str) -> None:
    wait_until(
        lambda: redis.command("EXISTS", presence_key(user)) == 1,
        timeout_s=20,
        what="sidecar present",
    )


def _as_acl_user(tmp_path: Path, redis: RedisServer, *rules: str) -> tuple[Hub, Sidecar, str]:
    """A hub (one worker) whose Redis user ``hub`` has ``rules`` only, and a sidecar."""
    redis.command("ACL", "SETUSER", "hub", "on", ">pw", *rules)
    user = f"acl-{secrets.token_hex(4)}"
    url = f"redis://hub:pw@127.0.0.1:{redis.port}/0"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_REDIS_URL": url, **FAST})
    return hub, Sidecar(tmp_path, hub.ws, issue(user)), user


def _start_up_line(hub: Hub, timeout_s: float) -> str:
    """The hub's first log line about its Redis (the probe's verdict)."""
    lines = wait_until(
        lambda: [ln for ln in log_text(hub).splitlines() if "Redis at" in ln],
        timeout_s=timeout_s,
        what="the start-up line about Redis",
    )
    return str(lines[0])


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
    hub, sidecar, user = _as_acl_user(tmp_path, redis, *LEAST_PRIVILEGE, "-xreadgroup")
    with running(sidecar, hub), api() as client:
        line = _start_up_line(hub, timeout_s=60)
        assert "ERROR" in line and STARTS in line and "XREADGROUP" in line, line
        health = httpx.get(hub.http + "/healthz", timeout=2)
        assert health.status_code == 503 and "XREADGROUP" in health.text, health.text
        _wait_present(redis, user)
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
    hub, sidecar, user = _as_acl_user(
        tmp_path, redis, "~bridge:*", "-@all",
        "+hello", "+auth", "+client|setname", "+info", *grants,
    )  # fmt: skip
    with running(sidecar, hub), api() as client:
        hub.wait_healthy()
        _wait_present(redis, user)
        assert [_call(client, hub, user) for _ in range(3)] == [(200, "completed")] * 3
        # the operator views' commands are in the list too
        desktops = client.get(f"{hub.http}/v1/admin/desktops")
        assert desktops.status_code == 200, desktops.text
        assert user in [d["user_id"] for d in desktops.json()["desktops"]]
        assert client.get(f"{hub.http}/v1/admin/users/{user}").status_code == 200
    log = log_text(hub)
    assert "Traceback" not in log and "NOPERM" not in log, log[-4000:]


@pytest.mark.parametrize(
    ("denied", "grant"),
    [
        (("-zcard",), "+zcard"),
        # every operator-only command (the directory's writes also keep the revocation
        # index: needed, not here)
        (("-zcard", "-xlen"), "+xlen +zcard"),
    ],
)  # fmt: skip
def test_a_redis_user_lacking_only_operator_view_commands_serves_calls(
    tmp_path: Path, redis: RedisServer, denied: tuple[str, ...], grant: str
) -> None:
    """A user without the admin desktops directory's ZCARD had every call
    refused ``unavailable`` before enqueue and /healthz 503 (a balancer took the replica
    out), for a missing dashboard grant. Now calls complete, /healthz answers 200 with
    the refused commands in ``warnings``, the start-up line is a WARNING naming the
    grant, and the desktops directory (API and ``inspect``) answers 503 naming it until
    the operator grants it, without a restart."""
    from tests.integration.test_admin import inspect

    hub, sidecar, user = _as_acl_user(tmp_path, redis, *LEAST_PRIVILEGE, *denied)
    with running(sidecar, hub), api() as client:
        hub.wait_healthy()
        line = _start_up_line(hub, timeout_s=20)
        assert "WARNING" in line and STARTS not in line and grant in line, line
        health = httpx.get(hub.http + "/healthz", timeout=2)
        assert health.status_code == 200, health.text
        (warning,) = health.json()["warnings"]
        assert f"ACL SETUSER <user> {grant}" in warning, warning
        _wait_present(redis, user)
        assert [_call(client, hub, user) for _ in range(3)] == [(200, "completed")] * 3
        desktops = client.get(f"{hub.http}/v1/admin/desktops")
        assert desktops.status_code == 503, desktops.text
        assert f"ACL SETUSER <user> {grant}" in desktops.json()["error"]["message"]
        out = inspect(hub, "desktops")
        assert out.returncode == 1 and f"ACL SETUSER <user> {grant}" in out.stderr, out
        # the operator grants them: served again without a restart
        redis.command("ACL", "SETUSER", "hub", *(f"+{d[1:]}" for d in denied))
        wait_until(
            lambda: "warnings" not in httpx.get(hub.http + "/healthz", timeout=2).json(),
            timeout_s=10,
            what="the warning gone",
        )
        desktops = client.get(f"{hub.http}/v1/admin/desktops")
        assert desktops.status_code == 200, desktops.text
        listed = [d["user_id"] for d in desktops.json()["desktops"]]
        assert listed == [user], listed
        assert inspect(hub, "desktops").returncode == 0
        assert _call(client, hub, user) == (200, "completed")
    log = log_text(hub)
    assert "Traceback" not in log and STARTS not in log, log[-4000:]
