"""The connection layer on real Redis: bounded and reused connections, blocking commands
on dedicated connections (waiting or polling when all are busy, never deadlocking),
pub/sub on one subscriber connection. Every wait bounded."""

from __future__ import annotations

import secrets

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_pubsub import Message

from ..conftest import REDIS_URL, RawRedis


async def blpop(s: RedisSubstrate, key: str, timeout_s: float) -> str | None:
    """BLPOP through the connection layer (independent of the substrate's signatures)."""
    async with s._session("BLPOP") as session:
        reply = await s._call(session, b"BLPOP", key, f"{timeout_s:.3f}", block_s=timeout_s)
    return None if reply is None else reply[1]


async def rpush(s: RedisSubstrate, key: str, value: str) -> None:
    async with s._session("RPUSH") as session:
        await s._call(session, b"RPUSH", key, value)


def _name() -> str:
    return f"deskbridge-test-{secrets.token_hex(4)}"


async def _client_ids(raw: RawRedis, name: str) -> set[str]:
    ids = set()
    for line in (await raw("CLIENT", "LIST")).splitlines():
        info = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        if info.get("name") == name:
            ids.add(info["id"])
    return ids


async def test_many_concurrent_commands_share_a_bounded_set_and_reuse_it(
    raw_redis: RawRedis,
) -> None:
    name = _name()
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name, max_connections=6)
    user = f"test-{secrets.token_hex(4)}"
    seen: set[str] = set()

    async def burst(n: int) -> None:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(s.set_catalogue, f"{user}-{i % 7}", f"v{i}")
                nursery.start_soon(s.get_presence, user)
            for i in range(12):  # more blocking waits than dedicated connections (3)
                nursery.start_soon(blpop, s, f"test-list-{user}-{i}", 0.3)
            await trio.sleep(0.05)
            seen.update(await _client_ids(raw_redis, name))

    with trio.fail_after(20):
        async with s:
            await burst(200)
            first = s.statistics()
            assert first is not None and first.opened_total <= 6
            ids = await _client_ids(raw_redis, name)
            for _ in range(3):
                await burst(200)
            after = s.statistics()
            assert after is not None
            # steady state: the same connections, none opened since the first burst
            assert after.opened_total == first.opened_total
            assert await _client_ids(raw_redis, name) == ids
            assert after.polls_total > 0  # 12 waits > 3 dedicated: the rest polled
    assert 0 < len(seen) <= 6
    await raw_redis("DEL", *(f"bridge:tools:{{{user}-{i}}}" for i in range(7)))


async def test_blocking_waits_beyond_the_bound_never_deadlock(raw_redis: RawRedis) -> None:
    """One dedicated connection (max 3) and 6 callers waiting for results that are
    published only after all of them wait, in reverse order: every caller gets its own
    payload, none waits out its timeout."""
    s = RedisSubstrate.from_url(REDIS_URL, max_connections=3)
    jobs = [f"test-list-{secrets.token_hex(4)}" for _ in range(6)]
    got: dict[str, str | None] = {}

    async def wait(job: str) -> None:
        got[job] = await blpop(s, job, 10)

    with trio.fail_after(8):
        async with s, trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(wait, job)
            await trio.sleep(0.3)
            stats = s.statistics()
            assert stats is not None and stats.blocking == 1
            for job in reversed(jobs):
                await rpush(s, job, f"payload-{job}")
    assert got == {job: f"payload-{job}" for job in jobs}
    for job in jobs:
        assert await raw_redis("EXISTS", job) == 0


async def test_a_cancelled_shared_command_keeps_its_connection(raw_redis: RawRedis) -> None:
    name = _name()
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name)
    with trio.fail_after(5):
        async with s:
            await s.ping()
            ids = await _client_ids(raw_redis, name)
            for _ in range(20):
                with trio.move_on_after(0):
                    await s.get_presence("u")
            await s.set_presence("u-cancel", "session-1", 30)
            assert await s.get_presence("u-cancel") == "session-1"
            assert await _client_ids(raw_redis, name) == ids
    await raw_redis("DEL", "bridge:presence:{u-cancel}")


def test_max_connections_below_three_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        RedisSubstrate.from_url(REDIS_URL, max_connections=2)


async def test_pubsub_delivers_after_confirmation_and_shares_one_connection(
    raw_redis: RawRedis,
) -> None:
    name = _name()
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name)
    channel = f"test-chan-{secrets.token_hex(4)}"
    with trio.fail_after(5):
        async with s:
            await s.ping()
            before = await _client_ids(raw_redis, name)
            async with (
                s.subscribe(channel) as a,
                s.subscribe(channel) as b,
                s.subscribe(channel[:-2] + "*", pattern=True) as p,
            ):
                assert await s.publish(channel, "one") == 2  # the channel + the pattern
                assert await a.__anext__() == Message(channel, "one")
                assert await b.__anext__() == Message(channel, "one")
                assert await p.__anext__() == Message(channel, "one", channel[:-2] + "*")
                assert len(await _client_ids(raw_redis, name)) == len(before) + 1
            assert await raw_redis("PUBSUB", "NUMSUB", channel) == [channel, 0]
            async with s.subscribe(channel) as again:  # same connection, resubscribed
                await s.publish(channel, "two")
                assert await again.__anext__() == Message(channel, "two")
            assert len(await _client_ids(raw_redis, name)) == len(before) + 1


async def test_pubsub_reports_a_gap_after_reconnecting(raw_redis: RawRedis) -> None:
    name = _name()
    s = RedisSubstrate.from_url(REDIS_URL, client_name=name)
    channel = f"test-chan-{secrets.token_hex(4)}"
    with trio.fail_after(10):
        async with s, s.subscribe(channel) as messages:
            for client_id in await _client_ids(raw_redis, name):
                await raw_redis("CLIENT", "KILL", "ID", client_id)
            assert await messages.__anext__() == Message(channel, None)  # the gap
            for _ in range(100):  # the gap comes before Redis confirms the resubscription
                if await s.publish(channel, "after"):
                    break
                await trio.sleep(0.05)
            assert await messages.__anext__() == Message(channel, "after")


async def test_a_slow_consumer_loses_messages_to_a_gap_not_the_reader() -> None:
    s = RedisSubstrate.from_url(REDIS_URL)
    channel = f"test-chan-{secrets.token_hex(4)}"
    with trio.fail_after(5):
        async with s, s.subscribe(channel, buffer=2) as slow, s.subscribe(channel) as fast:
            for i in range(5):
                await s.publish(channel, str(i))
            assert [(await fast.__anext__()).data for _ in range(5)] == list("01234")
            assert (await slow.__anext__()).data == "0"
            assert (await slow.__anext__()).data == "1"
            await s.publish(channel, "5")
            await fast.__anext__()
            assert await slow.__anext__() == Message(channel, None)
            assert (await slow.__anext__()).data == "5"
            assert slow.dropped == 3


async def test_subscribe_to_an_unreachable_redis_is_unavailable() -> None:
    from ..procs import free_port

    s = RedisSubstrate.from_url(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_s=0.3)
    with trio.fail_after(5):
        async with s:
            with pytest.raises(SubstrateUnavailable, match="SUBSCRIBE"):
                async with s.subscribe("anything"):
                    pass


def test_pubsub_and_polling_work_under_asyncio() -> None:
    import anyio

    async def main() -> None:
        s = RedisSubstrate.from_url(REDIS_URL, max_connections=3)
        channel = f"test-chan-{secrets.token_hex(4)}"
        keys = [f"test-list-{secrets.token_hex(4)}" for _ in range(3)]
        got: list[str | None] = []

        async def wait(key: str) -> None:
            got.append(await blpop(s, key, 5))

        with anyio.fail_after(8):
            async with s:
                async with s.subscribe(channel) as messages:
                    await s.publish(channel, "hello")
                    assert await messages.__anext__() == Message(channel, "hello")
                async with anyio.create_task_group() as tg:
                    for key in keys:
                        tg.start_soon(wait, key)
                    await anyio.sleep(0.2)
                    for key in keys:
                        await rpush(s, key, key)
        assert sorted(got) == sorted(keys)  # type: ignore[type-var]

    anyio.run(main, backend="asyncio")


_BUSY_450_MS = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  local n = redis.call('TIME')
until (n[1] * 1000000 + n[2]) - start >= 450000
return 1
"""


async def test_a_timeout_on_a_live_shared_connection_keeps_it_and_every_other_request(
    raw_redis: RawRedis,
) -> None:
    """Issue 10: a command timing out is no proof its shared connection is dead (on a
    saturated event loop replies sit unread past the timeout). Only that command fails;
    a PING decides, and a live connection stays, with every request in flight on it. The
    old rule (drop the connection on any timeout) failed the GET sent behind the slow
    script and opened a second connection."""
    # max_connections=3: one shared connection, so the LRANGE is pipelined behind the EVAL
    s = RedisSubstrate.from_url(
        REDIS_URL, client_name=_name(), command_timeout_s=0.3, max_connections=3
    )
    key = f"test-{secrets.token_hex(4)}"
    async with s:
        await rpush(s, key, "v")  # opens the shared connection
        stats = s.statistics()
        assert stats is not None and stats.opened_total == 1
        results: dict[str, object] = {}

        async def slow() -> None:
            try:
                async with s._session("EVAL") as session:
                    await s._call(session, b"EVAL", _BUSY_450_MS, 0)
            except SubstrateUnavailable as exc:
                results["slow"] = exc

        async def behind() -> None:
            await trio.sleep(0.01)  # written after the script, before its timeout
            async with s._session("LRANGE") as session:
                results["behind"] = await s._call(session, b"LRANGE", key, 0, -1, block_s=1.0)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                nursery.start_soon(behind)
            live = s._connections._session_var.get()
            assert live is not None
            for _ in range(400):  # bounded poll: the PING's answer (or its timeout) is in
                if not any(c.probing for c in live._shared):
                    break
                await trio.sleep(0.01)
            assert isinstance(results["slow"], SubstrateUnavailable)  # it did time out
            assert results["behind"] == ["v"]  # the request behind it was answered
            async with s._session("LLEN") as session:
                assert await s._call(session, b"LLEN", key) == 1
        stats = s.statistics()
        assert stats is not None and stats.opened_total == 1  # the same connection
    await raw_redis("DEL", key)


async def test_a_timed_out_reply_raises_substrate_unavailable_from_every_scripted_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command that timed out is an outage to its caller (SubstrateUnavailable), never
    a raw TimeoutError: found at 10,000 desktops, where take_over's TimeoutError escaped
    the error mapping and the reader stopped reading for that user for good. The same
    'raise the reply after leaving the session' slip was in mark_delivered,
    read_new_delivered and wake. Every reply here is the TimeoutError a connection
    returns for a command with no answer in time (no Redis I/O at all)."""
    from deskbridge_hub._jobstate import JobState, Stage
    from deskbridge_hub._redis_session import _Session

    async def timed_out(
        self: object, *commands: object, timeout_s: float | None, **_: object
    ) -> list:
        return [TimeoutError("EVAL timed out after 5.0 seconds") for _ in commands]

    monkeypatch.setattr(_Session, "execute", timed_out)
    s = RedisSubstrate.from_url(REDIS_URL, client_name=_name())
    user = f"test-{secrets.token_hex(4)}"
    state = JobState(Stage.DELIVERED, user, at=1.0, session_id="s1")
    calls = [
        lambda: s.take_over(user, "c1", daemon_id="d1", session_id="s1", count=4, record_ttl_s=60),
        lambda: s.mark_delivered(user, "j1", state, ttl_s=60),
        lambda: s.read_new_delivered(user, "c1", count=4, state=state, ttl_s=60),
        lambda: s.wake("h1", user, ttl_s=60),
    ]
    async with s:
        for call in calls:
            with trio.fail_after(5), pytest.raises(SubstrateUnavailable, match="timed out"):
                await call()


async def test_a_probe_of_a_connection_closed_meanwhile_closes_it_and_raises_nothing() -> None:
    """The PING that decides whether a timed-out shared connection lives runs in the
    session's task group: an exception there would take the whole process down (seen at
    10,000 desktops: coredis raised ClosedResourceError for a connection closed between
    the timeout and the PING, and the hub's lifespan ended)."""
    import anyio
    from deskbridge_hub._redis_session import _Conn

    class _Closed:
        usable = True

        def create_request(self, *args: object, **kwargs: object) -> None:
            raise anyio.ClosedResourceError

    s = RedisSubstrate.from_url(REDIS_URL, client_name=_name())
    async with s:
        session = s._connections._session_var.get()
        assert session is not None
        c = _Conn(conn=_Closed())  # type: ignore[arg-type]
        session._shared.append(c)
        c.probing = True
        with trio.fail_after(5):
            await session._probe_shared(c)  # raises nothing
        assert c.scope.cancel_called and c not in session._shared and not c.probing


async def test_a_refused_password_is_misconfigured_not_an_outage() -> None:
    # an authentication failure was an ordinary SubstrateUnavailable, so a served hub
    # retried it forever as an outage; SubstrateMisconfigured stops it at start (exit 2)
    from urllib.parse import urlsplit

    from deskbridge_hub._errors import SubstrateMisconfigured

    parts = urlsplit(REDIS_URL)
    url = f"redis://deskbridge-no-such-user:pw-never-shown@{parts.hostname}:{parts.port}/0"
    with trio.fail_after(10):
        async with RedisSubstrate.from_url(url) as s:
            with pytest.raises(SubstrateMisconfigured) as caught:
                await s.set_liveness("deskbridge-test-holder", 3.0)
    message = str(caught.value)
    assert "refused the user name or password of DESKBRIDGE_REDIS_URL" in message
    assert "pw-never-shown" not in message
