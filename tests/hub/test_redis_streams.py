"""The job stream on Redis beyond the shared contract: the consumer reads' server and
client block times, the consumer group healed from 0 and forgotten when a heal fails,
the trimmed sweep's numeric order, queue inspection's commands and a stream without its
group, and pruning at exactly ``idle_ms``. Real Redis (``DESKBRIDGE_TEST_REDIS_URL``), or a
fake one speaking RESP3; unique ids, every wait bounded, keys deleted afterwards."""

from __future__ import annotations

import functools
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._inspection import QueueInfo
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import GROUP, index_key, jobs_key

from ..conftest import REDIS_URL, RawRedis
from .redis_kit import delete_tagged, record_calls, xgroup_creates
from .test_redis_operation_names import HELLO_REPLY, _commands


@pytest.fixture
async def substrate() -> AsyncIterator[RedisSubstrate]:
    async with RedisSubstrate.from_url(REDIS_URL) as s:
        yield s


@pytest.fixture
async def user(raw_redis: RawRedis) -> AsyncIterator[str]:
    user_id = f"test-{secrets.token_hex(6)}"
    yield user_id
    await delete_tagged(raw_redis, user_id)


async def _group(raw: RawRedis, user: str) -> dict[str, Any]:
    (group,) = await raw("XINFO", "GROUPS", jobs_key(user))
    return dict(zip(group[::2], group[1::2], strict=True))


Read = Callable[[RedisSubstrate, str], Awaitable[Any]]
READS: list[tuple[str, Read]] = [
    ("read_new", lambda s, user: s.read_new(user, "c1", count=10, block_ms=1)),
    ("read_pending", lambda s, user: s.read_pending(user, "c1", count=10)),
    ("autoclaim",
     lambda s, user: s.autoclaim(user, "c1", min_idle_ms=0, start="0-0", count=10)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "read"), READS, ids=[n for n, _ in READS])
async def test_a_missing_group_is_made_from_0_by_a_read(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis, name: str, read: Read
) -> None:
    """The stream exists, its group does not (evicted, or made by another client's
    XADD): the read answers nothing and makes the group from 0, so every entry is
    delivered."""
    await raw_redis("XADD", jobs_key(user), "*", "filler", "1")
    with trio.fail_after(5):
        got = await read(substrate, user)
    assert not (got.entries if name == "autoclaim" else got)
    info = await _group(raw_redis, user)
    assert (info["name"], info["last-delivered-id"]) == (GROUP, "0-0")


@pytest.mark.parametrize(("name", "read"), READS, ids=[n for n, _ in READS])
async def test_a_read_remembers_the_group_and_a_failed_heal_forgets_it(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch, name: str, read: Read,
) -> None:  # fmt: skip
    """After a consumer read of a group it did not make, the session's next enqueue
    sends no XGROUP CREATE (an autoclaim does not note it); after a missing group whose
    heal failed the next enqueue creates it in its own write."""
    await raw_redis("XGROUP", "CREATE", jobs_key(user), GROUP, "0", "MKSTREAM")  # not by us
    with trio.fail_after(10):
        await read(substrate, user)
        before = await xgroup_creates(raw_redis)
        await substrate.enqueue(user, {"filler": "1"}, maxlen=100)
        assert await xgroup_creates(raw_redis) == before + (name == "autoclaim")
        await raw_redis("DEL", jobs_key(user))
        await raw_redis("XADD", jobs_key(user), "*", "filler", "2")  # no group

        async def heal_fails(session: Any, user_id: str) -> None:
            raise SubstrateUnavailable("Redis went away (test)")

        monkeypatch.setattr(substrate, "_heal_group", heal_fails)
        with pytest.raises(SubstrateUnavailable):
            await read(substrate, user)
        monkeypatch.undo()
        before = await xgroup_creates(raw_redis)
        await substrate.enqueue(user, {"filler": "3"}, maxlen=100)
        assert await xgroup_creates(raw_redis) == before + 1


@pytest.mark.parametrize(
    ("block_ms", "block", "block_s"), [(250, [b"BLOCK", 250], 0.25), (0, [b"BLOCK", 0], None)]
)
async def test_a_new_entries_read_blocks_the_server_block_ms_and_the_client_as_long(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch,
    block_ms: int, block: list[Any], block_s: float | None,
) -> None:  # fmt: skip
    """... plus the command timeout (0: both wait for ever); a pending read does not
    block at all (it is a script of XPENDING and XRANGE, no blocking command)."""
    entry_id = await substrate.enqueue(user, {"filler": "0"}, maxlen=100)
    calls = record_calls(substrate, monkeypatch)
    with trio.fail_after(5):
        (got,) = await substrate.read_new(user, "c1", count=10, block_ms=block_ms)
        (again,) = await substrate.read_pending(user, "c1", count=10)
    assert got.entry_id == again.entry_id == entry_id
    head = [b"XREADGROUP", b"GROUP", GROUP, "c1", b"COUNT", 10]
    tail = [b"STREAMS", jobs_key(user)]
    assert calls == [((*head, *block, *tail, ">"), block_s)]


async def test_the_trimmed_sweep_lists_entries_in_stream_order(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """Entry IDs compare as numbers: ``5-9`` comes before ``5-10`` (not as text)."""
    await raw_redis("XADD", jobs_key(user), "6-0", "filler", "x")
    await raw_redis("HSET", index_key(user), "5-10", "j10", "5-9", "j9", "4-99", "j4")
    with trio.fail_after(5):
        got = await substrate.trimmed(user)
    assert got == [("4-99", "j4"), ("5-9", "j9"), ("5-10", "j10")]


async def test_a_stream_without_its_group_reads_as_nothing_pending(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    await raw_redis("XADD", jobs_key(user), "*", "filler", "x")
    with trio.fail_after(5):
        info = await substrate.queue_info(user, count=10)
    assert (info.length, info.pending_count, info.pending) == (1, 0, ())
    assert info == QueueInfo(1, 0)


@pytest.mark.parametrize("count", [0, 1])
async def test_queue_inspection_reads_pending_entries_only_when_asked(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    await substrate.enqueue(user, {"filler": "x"}, maxlen=100)
    await substrate.read_new(user, "c1", count=10, block_ms=1)
    calls = record_calls(substrate, monkeypatch)
    with trio.fail_after(5):
        info = await (
            substrate.queue_info(user) if count == 0 else substrate.queue_info(user, count=count)
        )
    assert len(info.pending) == count
    expected = [(b"XLEN", jobs_key(user)), (b"XPENDING", jobs_key(user), GROUP)]
    if count:
        expected.append((b"XPENDING", jobs_key(user), GROUP, b"-", b"+", count))
    assert [c for c, _ in calls] == expected


def _consumer(name: str, pending: int, idle: int) -> bytes:
    fields = [(b"name", name.encode()), (b"pending", pending), (b"idle", idle)]
    out = b"%3\r\n"
    for key, value in fields:
        out += b"$%d\r\n%s\r\n" % (len(key), key)
        if isinstance(value, int):
            out += b":%d\r\n" % value
        else:
            out += b"$%d\r\n%s\r\n" % (len(value), value)
    return out


async def test_a_consumer_idle_exactly_idle_ms_is_pruned() -> None:
    """A fake Redis reports consumers idle 499, 500 and 501 ms (one with an entry
    pending): with ``idle_ms=500`` the ones at 500 and 501 with nothing pending go."""
    deleted: list[str] = []

    async def fake(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while (words := await _commands(stream, buffer)) is not None:
            name = words[0].upper()
            if name == "HELLO":
                await stream.send_all(HELLO_REPLY)
            elif name == "XINFO":
                await stream.send_all(
                    b"*4\r\n" + _consumer("c499", 0, 499) + _consumer("c500", 0, 500)
                    + _consumer("c501", 0, 501) + _consumer("busy", 1, 900)
                )  # fmt: skip
            elif name == "XGROUP":
                deleted.append(words[-1])
                await stream.send_all(b":1\r\n")

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, fake, 0)
        port = listeners[0].socket.getsockname()[1]
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0")
        with trio.fail_after(5):
            assert await s.prune_consumers("u1", idle_ms=500, keep="me") == 2
        nursery.cancel_scope.cancel()
    assert deleted == ["c500", "c501"]


async def test_enqueue_creates_the_group_once_per_session_and_user(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    before = await xgroup_creates(raw_redis)
    with trio.fail_after(5):
        for i in range(3):
            await substrate.enqueue(user, {"filler": str(i)}, maxlen=100)
    assert await xgroup_creates(raw_redis) == before + 1
