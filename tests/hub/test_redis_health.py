"""A Redis that accepts connections but cannot serve the hub is "unavailable" with its
cause, never "offline" (issue 11 item 1): the probe's verdicts (pure), then real
redis-servers started here in each bad state (evicting policy under memory pressure, a
replica, OOM under noeviction, an ACL user without script permission)."""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_health import interpret
from deskbridge_hub._substrate import presence_key

from ..procs import RedisServer, wait_until

PRIMARY = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n# Memory\r\nmaxmemory:0\r\n"
PRIMARY += "maxmemory_policy:noeviction\r\n# Persistence\r\naof_enabled:1\r\n"


class Refused(Exception):
    pass


def test_a_primary_with_noeviction_is_usable() -> None:
    health = interpret(PRIMARY, "v", probe_value="v")
    assert health.ok and not health.evicting and health.notes == ()
    assert health.summary == "role master, maxmemory-policy noeviction (no maxmemory), aof on"


@pytest.mark.parametrize(
    ("info", "probe", "words", "evicting"),
    [
        (PRIMARY.replace("maxmemory:0", "maxmemory:1048576").replace("noeviction", "allkeys-lru"),
         "v", "maxmemory-policy is allkeys-lru", True),
        (PRIMARY.replace("maxmemory:0", "maxmemory:1").replace("noeviction", "volatile-ttl"),
         "v", "maxmemory-policy is volatile-ttl", True),
        (PRIMARY.replace("role:master", "role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379"),
         Refused("READONLY You can't write against a read only replica."),
         "replica of 10.0.0.1:6379", False),
        (PRIMARY, Refused("OOM command not allowed when used memory > 'maxmemory'."),
         "out of memory", False),
        (PRIMARY, Refused("MISCONF Redis is configured to save RDB snapshots"), "persist", False),
        (PRIMARY, Refused("NOPERM this user has no permissions to run the 'eval' command"),
         "permission", False),
        (PRIMARY, "something else", "did not read back", False),
    ],
)  # fmt: skip
def test_each_bad_state_is_a_cause(info: str, probe: object, words: str, evicting: bool) -> None:
    health = interpret(info, probe, probe_value="v")
    assert not health.ok
    assert words in health.cause
    assert health.evicting is evicting


def test_a_replica_is_named_once_not_twice() -> None:
    info = PRIMARY.replace("role:master", "role:slave")
    health = interpret(info, Refused("READONLY You can't write"), probe_value="v")
    assert len(health.causes) == 1


def test_unreadable_info_and_aof_off_are_notes_not_causes() -> None:
    health = interpret(Refused("NOPERM info"), "v", probe_value="v")
    assert health.ok and "cannot read INFO" in health.notes[0]
    health = interpret(PRIMARY.replace("aof_enabled:1", "aof_enabled:0"), "v", probe_value="v")
    assert health.ok and "AOF is off" in health.notes[0]


# -- real redis-servers ---------------------------------------------------------------


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
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, port=_port_in_range(), name="health")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


async def _probe_until(s: RedisSubstrate, pred, timeout_s: float = 10):  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout_s):
        while True:
            health = await s.health_check()
            if pred(health):
                return health
            await trio.sleep(0.1)


async def test_evicting_policy_under_pressure_is_unavailable_not_offline(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis_server.command("CONFIG", "SET", "maxmemory", str(4 * 1024 * 1024))
    redis_server.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    s = RedisSubstrate.from_url(redis_server.url, health_interval_s=0.2)
    caplog.set_level(logging.INFO, "deskbridge.hub.redis")
    with trio.fail_after(30):
        async with s:
            await s.set_presence("alice", "session-1", 30)
            # another client fills memory until Redis evicts alice's presence
            for i in range(200):
                if redis_server.command("EXISTS", presence_key("alice")) == 0:
                    break
                redis_server.command("SET", f"filler:{i}", "x" * 65536)
            assert redis_server.command("EXISTS", presence_key("alice")) == 0
            assert int(redis_server.command("INFO", "stats").split("evicted_keys:")[1].split()[0])
            await _probe_until(s, lambda h: h is not None and not h.ok)
            with pytest.raises(SubstrateUnavailable, match="allkeys-lru"):
                await s.get_presence("alice")  # absent, but that proves nothing
            with pytest.raises(SubstrateUnavailable, match="maxmemory-policy"):
                await s.ping()  # readiness fails with the cause
            # the operator fixes it: usable again, one line each way
            redis_server.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
            redis_server.command("CONFIG", "SET", "maxmemory", "0")
            await _probe_until(s, lambda h: h is not None and h.ok)
            assert await s.get_presence("alice") is None
            await s.ping()
    lines = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.redis"]
    assert sum("cannot serve the hub" in line for line in lines) == 1, lines
    assert sum("usable again" in line for line in lines) == 1, lines


async def test_a_replica_is_unavailable_until_promoted(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    replica = RedisServer(tmp_path, port=_port_in_range(), name="replica")
    try:
        replica.wait_ready()
        replica.command("REPLICAOF", "127.0.0.1", str(redis_server.port))
        wait_until(
            lambda: "master_link_status:up" in replica.command("INFO", "replication"),
            timeout_s=10,
            what="replica linked",
        )
        s = RedisSubstrate.from_url(replica.url)
        with trio.fail_after(20):
            health = await s.health_check()
            assert health is not None and "replica" in health.cause
            with pytest.raises(SubstrateUnavailable, match="READONLY|replica"):
                await s.set_presence("bob", "session-1", 30)
            replica.command("REPLICAOF", "NO", "ONE")
            await _probe_until(s, lambda h: h is not None and h.ok)
            await s.set_presence("bob", "session-1", 30)
    finally:
        replica.stop()


async def test_out_of_memory_under_noeviction_refuses_writes_with_the_cause(
    redis_server: RedisServer,
) -> None:
    redis_server.command("CONFIG", "SET", "maxmemory", "1")
    s = RedisSubstrate.from_url(redis_server.url)
    with trio.fail_after(10):
        health = await s.health_check()
        assert health is not None and "out of memory" in health.cause
        with pytest.raises(SubstrateUnavailable, match="OOM"):
            await s.set_presence("carol", "session-1", 30)


async def test_a_user_without_script_permission_is_named(redis_server: RedisServer) -> None:
    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    with trio.fail_after(10):
        health = await s.health_check()
        assert health is not None and "permission" in health.cause
        with pytest.raises(SubstrateUnavailable, match="NOPERM"):
            await s.refresh_presence("dave", "session-1", 30)


async def test_a_password_with_reserved_characters_is_percent_decoded(
    redis_server: RedisServer,
) -> None:
    password = "s3cr/t+k3y=@#x"
    redis_server.command("CONFIG", "SET", "requirepass", password)
    from urllib.parse import quote

    url = f"redis://:{quote(password, safe='')}@127.0.0.1:{redis_server.port}/0"
    s = RedisSubstrate.from_url(url)
    with trio.fail_after(10):
        await s.ping()
        assert password not in repr(s)


@pytest.mark.parametrize(
    "refusal", [("min-replicas-to-write", "1", "0"), ("replica-serve-stale-data", None, None)]
)
async def test_a_store_refusing_writes_fails_the_heartbeat_as_an_outage(
    redis_server: RedisServer, refusal: tuple[str, str | None, str | None]
) -> None:
    """NOREPLICAS (too few replicas) or READONLY (a replica: after a failover) is the
    store's refusal, not one user's bad key: the batched heartbeat (one script over many
    users, each under ``pcall``) must fail as SubstrateUnavailable, so the reader retries
    every session within a second and the outage is told once; a review found it answered
    a per-user ``error`` for every user instead."""
    from deskbridge_hub._substrate import Beat

    setting, bad, good = refusal
    users = [f"refuse-{secrets.token_hex(4)}" for _ in range(3)]
    beats = [Beat(user, "s1") for user in users]
    s = RedisSubstrate.from_url(redis_server.url)
    with trio.fail_after(20):
        async with s:
            replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            assert [r.ours for r in replies] == [True] * 3
            if bad is not None:
                redis_server.command("CONFIG", "SET", setting, bad)
            else:  # a replica of a primary that is not there: writes are refused
                redis_server.command("REPLICAOF", "127.0.0.1", "1")
            try:
                with pytest.raises(SubstrateUnavailable):
                    await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            finally:
                if bad is not None:
                    redis_server.command("CONFIG", "SET", setting, good)
                else:
                    redis_server.command("REPLICAOF", "NO", "ONE")
            replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            assert [(r.ours, r.error) for r in replies] == [(True, None)] * 3


@pytest.mark.parametrize(
    "refusal", [("maxmemory", "1", "0"), ("min-replicas-to-write", "1", "0")]
)
async def test_a_lapsed_holder_under_a_store_refusing_writes_is_unavailable_not_offline(
    redis_server: RedisServer, refusal: tuple[str, str, str]
) -> None:
    """While Redis refuses writes (out of memory, too few replicas) the holder's liveness
    refresh is refused too, and its key lapses within 3 s: callers were told the
    connected desktop was ``offline`` (a fault-injection helper saw 119-139 such answers
    in 6 s). A lapsed key now reads "dead holder" only if the store takes a write."""
    from deskbridge_hub import Bridge
    from deskbridge_hub._keys import proc_key

    setting, bad, good = refusal
    user, holder = f"lapse-{secrets.token_hex(4)}", f"h{secrets.token_hex(4)}"
    s = RedisSubstrate.from_url(redis_server.url)
    bridge = Bridge(s)
    with trio.fail_after(20):
        async with s:
            await s.set_liveness(holder, 30, consumer="c1", max_pending=32)
            await s.set_presence(user, f"{holder}.s1", 30)
            assert await s.holder_alive(holder) is True
            redis_server.command("CONFIG", "SET", setting, bad)
            try:
                assert await s.holder_alive(holder) is True  # a read: still answered
                redis_server.command("CONFIG", "SET", setting, good)
                redis_server.command("DEL", proc_key(holder))  # as if it lapsed, refused
                redis_server.command("CONFIG", "SET", setting, bad)
                with pytest.raises(SubstrateUnavailable):
                    await s.holder_alive(holder)
                with pytest.raises(SubstrateUnavailable):
                    await bridge.presence(user)
                with pytest.raises(SubstrateUnavailable):
                    await bridge.dispatch(user, "echo", {}, timeout_s=1)
            finally:
                redis_server.command("CONFIG", "SET", setting, good)
            # the store takes writes: a lapsed key is a dead holder, the desktop offline
            assert await s.holder_alive(holder) is False
            assert (await bridge.presence(user)).online is False


#: The least-privilege user docs/operations.md recommends ("Redis requirements").
LEAST_PRIVILEGE = ("~bridge:*", "&bridge:*", "+@all", "-@dangerous", "+info")


@pytest.mark.parametrize(
    ("denied", "named"),
    [
        (("-xreadgroup",), "XREADGROUP"),
        (("-blmpop",), "BLMPOP"),
        (("-script|load",), "SCRIPT|LOAD"),
        (("-xautoclaim", "-xclaim"), "XCLAIM, XAUTOCLAIM"),
    ],
)
async def test_a_user_lacking_a_command_the_hub_needs_is_named_by_the_probe(
    redis_server: RedisServer, denied: tuple[str, ...], named: str
) -> None:
    """A user allowed scripts but not one command the hub sends (outside or inside its
    scripts) passed the probe (a scripted SET + GET), so the hub said "usable" at start
    and /healthz 200, then failed mid-call: a 500 and a traceback a second from the
    reader (XREADGROUP), every call "unavailable" after its job ran (BLMPOP), presence
    lost (SCRIPT LOAD). The probe now asks Redis (``redis.acl_check_cmd``) for each
    command the hub sends, and names the ones refused."""
    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE, *denied)
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    with trio.fail_after(10):
        health = await s.health_check()
    assert health is not None and not health.ok
    assert "ACL" in health.cause and f"cannot run {named}" in health.cause, health.cause


async def test_the_least_privilege_user_of_the_docs_passes_the_probe(
    redis_server: RedisServer,
) -> None:
    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE)
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    with trio.fail_after(10):
        health = await s.health_check()
    assert health is not None and health.ok, health


async def test_a_command_refused_inside_a_script_is_unavailable_not_a_bug(
    redis_server: RedisServer,
) -> None:
    """Redis 7.0 words an ACL refusal inside a script without the NOPERM code ("ERR The
    user executing the script can't run this command or subcommand"): it propagated as
    a bare ResponseError, a 500 for the caller and a traceback a second from the reader.
    It is the store refusing, as NOPERM outside a script is: SubstrateUnavailable."""
    from deskbridge_hub import Bridge

    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE, "-xreadgroup")
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    user, holder = f"acl-{secrets.token_hex(4)}", f"h{secrets.token_hex(4)}"
    with trio.fail_after(20):
        async with s:
            await s.set_liveness(holder, 30, consumer="c1", max_pending=32)
            await s.set_presence(user, f"{holder}.s1", 30)
            with pytest.raises(SubstrateUnavailable, match="NOPERM"):
                await Bridge(s).dispatch(user, "echo", {}, timeout_s=1)


async def test_a_command_refused_inside_the_heartbeat_script_is_an_outage(
    redis_server: RedisServer,
) -> None:
    """The batched heartbeat runs each user under ``pcall`` and keeps an error of one
    user's own keys to that user; Redis 7.0's uncoded in-script ACL refusal was taken
    for one (every user answered its own ``error``), not for the store refusing."""
    from deskbridge_hub._substrate import Beat

    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE)
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    beats = [Beat(f"acl-beat-{secrets.token_hex(4)}", "s1") for _ in range(2)]
    with trio.fail_after(20):
        async with s:
            replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            assert [r.ours for r in replies] == [True, True]
            redis_server.command("ACL", "SETUSER", "hub", "-getex")
            with pytest.raises(SubstrateUnavailable, match="NOPERM"):
                await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            redis_server.command("ACL", "SETUSER", "hub", "+getex")
            replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
            assert [(r.ours, r.error) for r in replies] == [(True, None)] * 2


class _CannedSession:
    """A session answering the probe's pipeline with a node's INFO (the probe script's
    value echoed, the ACL check refusing nothing)."""

    closed = False

    def __init__(self, info: str) -> None:
        self.info = info

    async def open(self) -> None:
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()

    async def execute(self, *commands: tuple[object, ...], timeout_s: float | None) -> list[object]:
        await trio.lowlevel.checkpoint()
        return [self.info, commands[1][-1], []]


@pytest.mark.parametrize(("url", "counted"), [("redis://h:1/0", 1), ("redis+cluster://h:1", 0)])
async def test_another_replication_history_is_a_change_of_the_store_only_on_a_single_redis(
    url: str, counted: int
) -> None:
    """Under Cluster the probe reaches the node owning its key's slot: another
    ``master_replid`` there is that one node's failover, or the slot moved to another
    primary (a resharding: no write lost), not the store's history; a lost presence is
    rewritten by the beat that failed while its node was down (docs/operations.md,
    "Failover"). It counted as a failover of the store (every session beaten at once,
    a warning) although ``history_changes`` says 0 under Cluster."""
    from deskbridge_hub._redis_conn import RedisConnections

    conns = RedisConnections(
        url, connect_timeout_s=1, command_timeout_s=1, max_connections=8, client_name=None
    )
    node = _CannedSession(PRIMARY + "master_replid:" + "a" * 40 + "\r\n")
    conns._new_session = lambda: node  # type: ignore[method-assign,assignment,return-value]
    await conns.monitor.check()
    node.info = PRIMARY + "master_replid:" + "b" * 40 + "\r\n"
    await conns.monitor.check()
    assert conns.monitor.history_changes == counted


async def test_a_password_at_a_redis_that_has_none_is_named_at_start(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``redis://:secret@`` at a Redis without a password started silently (HELLO's
    AUTH as ``default``, a user with ``nopass``, accepts any password): the operator
    believed the store protected. A warning at start, not a refusal: the hub works, and
    the URL is set before ``requirepass`` when a password is rolled out without a stop."""
    url = f"redis://:not-checked@127.0.0.1:{redis_server.port}/0"
    caplog.set_level(logging.INFO, "deskbridge.hub.redis")
    with trio.fail_after(10):
        health = await RedisSubstrate.from_url(url).health_check()
    assert health is not None and health.ok  # it serves
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "DESKBRIDGE_REDIS_URL gives a password" in warned[0]
    assert "no password" in warned[0] and "not-checked" not in warned[0]
    caplog.clear()
    redis_server.command("CONFIG", "SET", "requirepass", "not-checked")
    with trio.fail_after(10):
        health = await RedisSubstrate.from_url(url).health_check()
    assert health is not None and health.ok
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
