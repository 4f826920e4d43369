"""RedisSubstrate beyond the shared contract: lifecycle across event-loop runs and
backends, connection faults, and which server errors count as "unavailable".
Real Redis on loopback; fake servers on port 0; every wait bounded."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable

import anyio
import pytest
import trio
import trio.testing
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import jobs_key, presence_key, result_key

from ..conftest import REDIS_URL, RawRedis


def _ids() -> tuple[str, str]:
    return f"test-{secrets.token_hex(6)}", f"job-{secrets.token_hex(6)}"


async def _round_trip(s: RedisSubstrate, user: str, job: str) -> None:
    await s.set_presence(user, "session", 30)
    assert await s.get_presence(user) == "session"
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=100)
    got = await s.read_new(user, "c1", count=10, block_ms=1000)
    assert [e.entry_id for e in got] == [entry_id]
    assert await s.ack(user, entry_id) == 1
    await s.publish_result(user, job, "payload", ttl_s=30)
    assert await s.wait_result(user, job, timeout_s=1) == "payload"


async def _cleanup(raw: RawRedis, user: str, job: str) -> None:
    await raw("DEL", presence_key(user), jobs_key(user), result_key(user, job))


def test_one_instance_serves_successive_trio_runs() -> None:
    s = RedisSubstrate.from_url(REDIS_URL)
    user, job = _ids()

    async def entered() -> None:
        with trio.fail_after(5):
            async with s:
                await _round_trip(s, user, job)
            await _round_trip(s, user, job)  # after leaving: one-shot connections

    async def unentered() -> None:
        with trio.fail_after(5):
            await _round_trip(s, user, job)
            await s.aclose()
            await _cleanup(RawRedis(REDIS_URL), user, job)

    trio.run(entered)
    trio.run(entered)
    trio.run(unentered)


def test_connections_are_bound_to_the_event_loop_run_that_opened_them() -> None:
    """Invariant: a client opened in one event-loop run is never used from another.

    Run A holds ``async with substrate`` open (its connections live in A's task group)
    while run B, in another thread, uses the same instance. B must get connections of its
    own: borrowing A's would drive A's sockets from B's loop (the field's cached-client
    "offline" bug). A plain attribute instead of a per-run holder fails this test: B hangs
    or errors. Then A, still open, must keep working on its own connections.
    """
    import threading

    s = RedisSubstrate.from_url(REDIS_URL)
    user, job = _ids()
    a_open = threading.Event()
    b_done = threading.Event()
    errors: list[BaseException] = []

    async def run_a() -> None:
        with trio.fail_after(15):
            async with s:
                await _round_trip(s, user, job)
                a_open.set()
                await trio.to_thread.run_sync(b_done.wait, 10)
                assert b_done.is_set(), "run B never finished"
                await _round_trip(s, user, job)  # A's own connections still serve A

    async def run_b() -> None:
        with trio.fail_after(5):
            await _round_trip(s, user + "-b", job + "-b")
            await _cleanup(RawRedis(REDIS_URL), user + "-b", job + "-b")

    def thread_b() -> None:
        try:
            assert a_open.wait(10), "run A never opened"
            trio.run(run_b)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            b_done.set()

    t = threading.Thread(target=thread_b)
    t.start()
    try:
        trio.run(run_a)
    finally:
        b_done.set()
        t.join(10)
    assert not t.is_alive()
    assert errors == []
    trio.run(_cleanup, RawRedis(REDIS_URL), user, job)


@pytest.mark.parametrize("enter", [True, False])
def test_works_under_asyncio(enter: bool) -> None:
    s = RedisSubstrate.from_url(REDIS_URL)
    user, job = _ids()

    async def main() -> None:
        with anyio.fail_after(5):
            if enter:
                async with s:
                    await _round_trip(s, user, job)
                    await _cancelled_read_leaves_no_waiter(s, user)
            else:
                await _round_trip(s, user, job)
                await _cancelled_read_leaves_no_waiter(s, user)
            await _cleanup(RawRedis(REDIS_URL), user, job)

    anyio.run(main, backend="asyncio")


async def _cancelled_read_leaves_no_waiter(s: RedisSubstrate, user: str) -> None:
    with anyio.move_on_after(0.2):
        await s.read_new(user, "c1", count=10, block_ms=30_000)
    entry_id = await s.enqueue(user, {"b": "2"}, maxlen=100)
    got = await s.read_new(user, "c2", count=10, block_ms=1000)
    assert [e.entry_id for e in got] == [entry_id]


async def test_entering_twice_in_one_run_is_refused() -> None:
    s = RedisSubstrate.from_url(REDIS_URL)
    async with s:
        with pytest.raises(RuntimeError):
            async with s:
                pass
    async with s:  # leaving made it enterable again
        await s.ping()


async def test_aclose_drops_connections_and_the_instance_stays_usable(
    raw_redis: RawRedis,
) -> None:
    name = f"deskbridge-test-{secrets.token_hex(4)}"
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name)
    with trio.fail_after(5):
        async with s:
            await s.ping()
            assert await _connections_named(raw_redis, name)
            await s.aclose()
            await s.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert not await _connections_named(raw_redis, name)
            await s.ping()


async def test_idle_connections_killed_by_the_server_are_replaced(raw_redis: RawRedis) -> None:
    name = f"deskbridge-test-{secrets.token_hex(4)}"
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name)
    with trio.fail_after(5):
        async with s:
            await s.ping()
            for client_id in await _connections_named(raw_redis, name):
                await raw_redis("CLIENT", "KILL", "ID", client_id)
            await s.ping()  # at once: the dead idle connection may not be noticed yet


async def _connections_named(raw: RawRedis, name: str) -> list[str]:
    ids = []
    for line in (await raw("CLIENT", "LIST")).splitlines():
        info = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        if info.get("name") == name:
            ids.append(info["id"])
    return ids


async def _serve(
    handler: Callable[[trio.SocketStream], Awaitable[None]], nursery: trio.Nursery
) -> int:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"), handler, 0)
    return listeners[0].socket.getsockname()[1]


async def test_a_server_that_never_answers_the_handshake_is_unavailable_fast() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await _serve(silent, nursery)
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}", connect_timeout_s=0.3)
        with trio.fail_after(3):
            with pytest.raises(SubstrateUnavailable, match=f"127.0.0.1:{port}"):
                await s.get_presence("u")
        nursery.cancel_scope.cancel()


HELLO_REPLY = b"%3\r\n$5\r\nproto\r\n:3\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$2\r\nid\r\n:1\r\n"


async def test_a_server_that_stops_answering_is_unavailable_after_the_command_timeout() -> None:
    async def hangs_after_hello(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(HELLO_REPLY)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await _serve(hangs_after_hello, nursery)
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}", command_timeout_s=0.3)
        with trio.fail_after(3):
            start = trio.current_time()
            with pytest.raises(SubstrateUnavailable):
                await s.get_presence("u")
            with pytest.raises(SubstrateUnavailable):  # block 0.2 s + 0.3 s
                await s.read_new("u", "c1", count=1, block_ms=200)
            assert trio.current_time() - start >= 0.8
        nursery.cancel_scope.cancel()


async def test_refusing_server_states_are_unavailable_and_bugs_are_not() -> None:
    replies = iter(
        [b"-OOM command not allowed when used memory > 'maxmemory'.\r\n", b"-ERR boom\r\n"]
    )

    async def refusing(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(HELLO_REPLY)
        while await stream.receive_some():
            await stream.send_all(next(replies))

    async with trio.open_nursery() as nursery:
        port = await _serve(refusing, nursery)
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}")
        with trio.fail_after(3):
            async with s:
                with pytest.raises(SubstrateUnavailable, match="OOM"):
                    await s.set_presence("u", "session", 30)
                with pytest.raises(Exception, match="boom") as info:
                    await s.set_presence("u", "session", 30)
                assert not isinstance(info.value, SubstrateUnavailable)
        nursery.cancel_scope.cancel()


async def test_connection_refused_names_host_port_not_password() -> None:
    async def close(stream: trio.SocketStream) -> None:
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        port = await _serve(close, nursery)
        nursery.cancel_scope.cancel()  # nothing listens on the port any more
    s = RedisSubstrate.from_url(f"redis://user:hunter2@127.0.0.1:{port}/0")
    assert "hunter2" not in repr(s)
    with trio.fail_after(3):
        with pytest.raises(SubstrateUnavailable) as info:
            await s.ping()
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "hunter2" not in str(info.value)


async def test_an_idle_connection_found_dead_on_use_is_replaced_once() -> None:
    accepted = 0

    async def drops_first_connection_on_second_command(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        first = accepted == 1
        await stream.receive_some()
        await stream.send_all(HELLO_REPLY)
        served = 0
        while await stream.receive_some():
            if first and served == 1:
                await stream.aclose()  # as a restarted Redis or a NAT timeout would
                return
            served += 1
            await stream.send_all(b"+PONG\r\n")

    async with trio.open_nursery() as nursery:
        port = await _serve(drops_first_connection_on_second_command, nursery)
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}")
        with trio.fail_after(3):
            async with s:
                await s.ping()
                await s.ping()  # reuses the idle connection, which dies: sent again once
        assert accepted == 2
        nursery.cancel_scope.cancel()


async def test_a_flushed_script_cache_never_applies_a_write_twice(raw_redis: RawRedis) -> None:
    """Redis forgets its scripts (restart, failover, SCRIPT FLUSH): the caller's and the
    holder's scripted steps must still apply every command of their write exactly once (a
    NOSCRIPT answer followed by a resend of the whole write used to push the mailbox
    notification twice)."""
    user, job = _ids()
    box = f"box-{secrets.token_hex(4)}"
    s = RedisSubstrate.from_url(REDIS_URL)
    with trio.fail_after(10):
        async with s:
            await raw_redis("SCRIPT", "FLUSH")
            await s.publish_result(user, job, '{"status": "completed"}', ttl_s=30, notify=box)
            got = await s.read_notifications(box, count=10, block_ms=500)
            assert got == [(job, '{"status": "completed"}')]
            assert await s.read_notifications(box, count=10, block_ms=50) == []
    await raw_redis("DEL", box)


async def _command_calls(raw: RawRedis) -> dict[str, int]:
    info = await raw("INFO", "commandstats")
    calls = {}
    for line in info.splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line.removeprefix("cmdstat_").partition(":")
            calls[name] = int(dict(f.split("=") for f in fields.split(","))["calls"])
    return calls


async def test_an_idle_users_heartbeat_costs_three_commands_as_redis_counts_them() -> None:
    """Issue 10: <= 0.15 Redis commands/s per idle desktop, counted inside Redis (INFO
    commandstats counts the EVALSHA and every command the script runs). An idle beat is
    EVALSHA + GETEX (presence) + XINFO GROUPS: 3 per 30 s heartbeat, 0.1/s."""
    from deskbridge_hub._substrate import Beat, index_key, tools_key

    raw = RawRedis(REDIS_URL)
    user, _ = _ids()
    try:
        with trio.fail_after(10):
            async with RedisSubstrate.from_url(REDIS_URL) as s:
                assert await s.read_new(user, "hub-1", count=1, block_ms=None) == []  # group
                await s.set_presence(user, "s1", 90)
                beat = [Beat(user, "s1")]
                await s.heartbeat(beat, ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000)
                before = await _command_calls(raw)
                (reply,) = await s.heartbeat(
                    beat, ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000
                )
                after = await _command_calls(raw)
        assert reply.ours and not (reply.backlog or reply.reclaim_due or reply.trimmed_due)
        spent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        spent = {
            k: v for k, v in spent.items() if v and k not in ("info", "select")
        }  # the oracle's
        assert spent == {"evalsha": 1, "getex": 1, "xinfo|groups": 1}
    finally:
        await raw("DEL", presence_key(user), jobs_key(user), index_key(user), tools_key(user))


async def test_many_idle_users_are_beaten_in_one_script_call() -> None:
    """One EVALSHA covers up to 100 users (issue 10, idle CPU); each user still costs
    its own GETEX + XINFO GROUPS inside it."""
    from deskbridge_hub._substrate import Beat, index_key, tools_key

    raw = RawRedis(REDIS_URL)
    users = [_ids()[0] for _ in range(3)]
    try:
        with trio.fail_after(10):
            async with RedisSubstrate.from_url(REDIS_URL) as s:
                for user in users:
                    assert await s.read_new(user, "hub-1", count=1, block_ms=None) == []
                    await s.set_presence(user, "s1", 90)
                beats = [Beat(user, "s1") for user in users]
                await s.heartbeat(beats, ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000)
                before = await _command_calls(raw)
                replies = await s.heartbeat(
                    beats, ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000
                )
                after = await _command_calls(raw)
        assert [r.ours for r in replies] == [True] * 3
        spent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        spent = {k: v for k, v in spent.items() if v and k not in ("info", "select")}
        assert spent == {"evalsha": 1, "getex": 3, "xinfo|groups": 3}
    finally:
        for user in users:
            await raw("DEL", presence_key(user), jobs_key(user), index_key(user), tools_key(user))


async def test_a_key_of_the_wrong_type_fails_only_its_users_beat(raw_redis: RawRedis) -> None:
    """Another program (or an operator) left a hash where a user's presence belongs, or
    a string where its entry index belongs: that user's beat answers ``error``; the beats of
    the users beside it in the same script call are refreshed as usual (a WRONGTYPE used
    to fail the whole heartbeat, which stopped the process's reader)."""
    from deskbridge_hub._substrate import Beat, index_key, tools_key

    bad, good, index_bad = (_ids()[0] for _ in range(3))
    await raw_redis("HSET", presence_key(bad), "x", "1")
    await raw_redis("SET", index_key(index_bad), "not a hash")
    try:
        with trio.fail_after(10):
            async with RedisSubstrate.from_url(REDIS_URL) as s:
                beats = [Beat(bad, "s1"), Beat(good, "s2"), Beat(index_bad, "s3")]
                replies = await s.heartbeat(
                    beats, ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000
                )
                assert await s.get_presence(good) == "s2"
        assert replies[0].error is not None and "WRONGTYPE" in replies[0].error.upper()
        assert not replies[0].ours
        assert (replies[1].ours, replies[1].taken, replies[1].error) == (True, True, None)
        assert replies[2].error is not None
    finally:
        for user in (bad, good, index_bad):
            await raw_redis(
                "DEL", presence_key(user), jobs_key(user), index_key(user), tools_key(user)
            )


async def test_an_index_field_that_is_no_entry_id_fails_only_its_users_beat(
    raw_redis: RawRedis,
) -> None:
    """Bad data that is no key type error: a field of a user's entry index that is not
    an entry ID makes the script's comparison fail (a Lua runtime error). That stays the
    user's own ``error`` too; the users after it in the same call are beaten (found by a
    review: only WRONGTYPE was kept per user, this failed the whole call)."""
    from deskbridge_hub._substrate import Beat, index_key, tools_key

    users = [_ids()[0] for _ in range(3)]
    await raw_redis("HSET", index_key(users[1]), "not-an-id", "x")
    await raw_redis("XADD", jobs_key(users[1]), "*", "f", "v")  # not quiet: the index is read
    try:
        with trio.fail_after(10):
            async with RedisSubstrate.from_url(REDIS_URL) as s:
                replies = await s.heartbeat(
                    [Beat(u, "s1") for u in users], ttl_s=30, consumer="c1",
                    reclaim_idle_ms=60_000,
                )  # fmt: skip
                present = [await s.get_presence(u) for u in users]
        assert replies[1].error is not None
        assert [(r.ours, r.error) for r in (replies[0], replies[2])] == [(True, None)] * 2
        assert present == ["s1", "s1", "s1"]
    finally:
        for user in users:
            await raw_redis(
                "DEL", presence_key(user), jobs_key(user), index_key(user), tools_key(user)
            )


async def test_a_read_that_finds_the_group_gone_reads_what_the_stream_holds_at_once(
    raw_redis: RawRedis,
) -> None:
    # Redis restarted empty: this session's group cache is stale, so the next enqueue is
    # a bare XADD (a stream without the group), and the holder's read healed the group
    # and returned [], leaving the job to the next heartbeat (a call waited 53 s, seen)
    from deskbridge_hub._jobstate import JobState, Stage

    user = f"deskbridge-test-{secrets.token_hex(4)}"
    state = JobState(Stage.DELIVERED, user, at=0.0)
    s = RedisSubstrate.from_url(REDIS_URL)
    with trio.fail_after(10):
        async with s:
            first = await s.enqueue(user, {"a": "1"}, maxlen=100)
            read = await s.read_new_delivered(user, "c1", count=10, state=state, ttl_s=60)
            assert [e.entry_id for e in read] == [first]
            await raw_redis("DEL", jobs_key(user))  # the restart: group and stream gone
            second = await s.enqueue(user, {"a": "2"}, maxlen=100)
            read = await s.read_new_delivered(user, "c1", count=10, state=state, ttl_s=60)
            assert [e.entry_id for e in read] == [second]
            assert await s.read_new_delivered(user, "c1", count=10, state=state, ttl_s=60) == []
    await raw_redis("DEL", jobs_key(user), f"bridge:index:{{{user}}}")


def test_a_group_of_outages_is_an_outage_and_a_group_with_a_bug_is_not() -> None:
    """A Cluster batch split over slots runs one task per node, and anyio wraps a
    failure in an ExceptionGroup: one node's reset connection must still read as the
    outage it is (the heartbeat retries every session within a second), never as a bug
    (found by a review: the group was not mapped)."""
    from coredis.exceptions import ConnectionError as RedisConnectionError
    from deskbridge_hub._redis_conn import RedisConnections

    conns = RedisConnections(
        REDIS_URL, connect_timeout_s=1, command_timeout_s=1, max_connections=4, client_name=None
    )
    outage = ExceptionGroup("split", [OSError("reset"), RedisConnectionError("lost")])
    mapped = conns.map_error("heartbeat", outage)
    assert isinstance(mapped, SubstrateUnavailable) and "reset" in str(mapped)
    assert (
        conns.map_error("heartbeat", ExceptionGroup("split", [OSError("x"), KeyError(1)])) is None
    )
    assert conns.map_error("heartbeat", KeyError(1)) is None


def test_a_clusters_redirections_and_retries_past_their_budget_are_an_outage() -> None:
    """CLUSTERDOWN (a primary down past its node timeout), TRYAGAIN (a slot migrating key
    by key), MOVED/ASK still bouncing: ``_redis_cluster`` retries them for a few seconds,
    then they are the caller's SubstrateUnavailable (503). Unmapped, they were a 500 with
    a traceback per submit, and CLUSTERDOWN escaped the reader's loops and ended every
    hub process (found by a fault-injection helper)."""
    from coredis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
    from deskbridge_hub._redis_conn import RedisConnections

    conns = RedisConnections(
        REDIS_URL, connect_timeout_s=1, command_timeout_s=1, max_connections=4, client_name=None
    )
    for exc in (
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        ClusterDownError("CLUSTERDOWN Hash slot not served"),
        TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        MovedError("3999 127.0.0.1:6381"),
        AskError("3999 127.0.0.1:6381"),
    ):
        mapped = conns.map_error("submit", exc)
        assert isinstance(mapped, SubstrateUnavailable), exc
    group = ExceptionGroup("split", [ClusterDownError("CLUSTERDOWN x"), OSError("reset")])
    assert isinstance(conns.map_error("heartbeat", group), SubstrateUnavailable)


def test_a_blocked_command_unblocked_by_a_demotion_is_an_outage() -> None:
    """A primary demoted under the hub (a failover, ``REPLICAOF``) ends its blocked
    commands with ``-UNBLOCKED ... instance state changed (master -> replica?)``: the
    wake-up BLMPOP and a caller's mailbox read. Unmapped, the caller waiting on a running
    job was answered 500 (tests/chaos/test_redis_failover.py)."""
    from coredis.exceptions import UnblockedError
    from deskbridge_hub._redis_conn import RedisConnections

    conns = RedisConnections(
        REDIS_URL, connect_timeout_s=1, command_timeout_s=1, max_connections=4, client_name=None
    )
    exc = UnblockedError(
        "force unblock from blocking operation, instance state changed (master -> replica?)"
    )
    mapped = conns.map_error("BLMPOP notify", exc)
    assert isinstance(mapped, SubstrateUnavailable), exc
    assert "UNBLOCKED force unblock" in str(mapped)


async def test_a_connection_that_could_not_be_made_is_told_unsent() -> None:
    """``SubstrateUnavailable.unsent``: no connection could be made, so nothing of the
    operation reached Redis (the Bridge answers a submit so as enqueueing nothing)."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(15):
        async with RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0") as substrate:
            with pytest.raises(SubstrateUnavailable) as info:
                await substrate.get_presence("alice")
    assert info.value.unsent is True
