"""Results, progress, job state and the delivery read on Redis beyond the shared
contract: the blocking reads' server and client block times, the progress stream's
trimming and page size, the consumer group healed from 0 and forgotten when a heal
fails, a script error other than NOGROUP, and absent keys while Redis cannot serve the
hub. Real Redis (``DESKBRIDGE_TEST_REDIS_URL``), unique ids, every wait bounded, keys
deleted afterwards."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio
from coredis.exceptions import ResponseError
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import (
    GROUP,
    jobs_key,
    presence_key,
    progress_key,
    result_key,
)

from ..conftest import REDIS_URL, RawRedis
from .redis_kit import delete_tagged, record_calls, xgroup_creates

DELIVERED = JobState(Stage.DELIVERED, "u", at=1.0, session_id="s1")


@pytest.fixture
async def substrate() -> AsyncIterator[RedisSubstrate]:
    async with RedisSubstrate.from_url(REDIS_URL) as s:
        yield s


@pytest.fixture
async def ids(raw_redis: RawRedis) -> AsyncIterator[tuple[str, str]]:
    """A user and a job; every key of either deleted afterwards."""
    user, job = f"test-{secrets.token_hex(6)}", f"job-{secrets.token_hex(6)}"
    yield user, job
    for tag in (user, job):
        await delete_tagged(raw_redis, tag)


@pytest.mark.parametrize(
    ("timeout_s", "seconds", "block_s"),
    [(1.0, "1.000", 1.0), (0.0004, "0.001", 0.0004), (0, "0", None)],
)
async def test_a_result_wait_blocks_the_server_its_timeout_and_the_client_as_long_plus_the_timeout(
    substrate: RedisSubstrate,
    ids: tuple[str, str],
    raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch,
    timeout_s: float,
    seconds: str,
    block_s: float | None,
) -> None:
    user, job = ids
    await raw_redis("RPUSH", result_key(user, job), "done")
    calls = record_calls(substrate, monkeypatch)
    with trio.fail_after(5):
        assert await substrate.wait_result(user, job, timeout_s=timeout_s) == "done"
    assert calls == [((b"BLPOP", result_key(user, job), seconds), block_s)]


@pytest.mark.parametrize(("block_ms", "block_s"), [(250, 0.25), (0, None)])
async def test_a_progress_read_blocks_the_server_block_ms_and_the_client_as_long_plus_the_timeout(
    substrate: RedisSubstrate,
    ids: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    block_ms: int,
    block_s: float | None,
) -> None:
    _, job = ids
    await substrate.publish_progress(job, '{"progress": 1}', ttl_s=30)
    calls = record_calls(substrate, monkeypatch)
    with trio.fail_after(5):
        assert len(await substrate.read_progress(job, "0", block_ms=block_ms)) == 1
    key = progress_key(job)
    assert calls == [
        ((b"XREAD", b"COUNT", 100, b"BLOCK", block_ms, b"STREAMS", key, "0"), block_s)
    ]


async def test_a_progress_read_answers_at_most_100_entries(
    substrate: RedisSubstrate, ids: tuple[str, str]
) -> None:
    """One page per read; the reader asks again after the last one."""
    _, job = ids
    with trio.fail_after(10):
        for i in range(101):
            await substrate.publish_progress(job, str(i), ttl_s=30, maxlen=1000)
        page = await substrate.read_progress(job, "0", block_ms=1)
        rest = await substrate.read_progress(job, page[-1][0], block_ms=1)
    assert [p for _, p in page] == [str(i) for i in range(100)]
    assert [p for _, p in rest] == ["100"]


async def _node_size(raw: RawRedis) -> int:
    _, value = await raw("CONFIG", "GET", "stream-node-max-entries")
    return int(value)


async def test_the_progress_stream_keeps_the_newest_64_by_default(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis
) -> None:
    """``MAXLEN ~ 64`` trims whole stream nodes: with one node's worth of entries more
    than 64 the oldest node goes and exactly 64 stay (one entry fewer and none would)."""
    _, job = ids
    node = await _node_size(raw_redis)
    with trio.fail_after(20):
        for i in range(node + 63):
            await substrate.publish_progress(job, str(i), ttl_s=30)
        assert await raw_redis("XLEN", progress_key(job)) == node + 63
        await substrate.publish_progress(job, "last", ttl_s=30)
    assert await raw_redis("XLEN", progress_key(job)) == 64


async def test_a_missing_group_is_made_from_0_by_the_delivery_read(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis
) -> None:
    user, _ = ids
    with trio.fail_after(5):
        assert await substrate.read_new_delivered(
            user, "c1", count=10, state=DELIVERED, ttl_s=60
        ) == []
    (group,) = await raw_redis("XINFO", "GROUPS", jobs_key(user))
    info = dict(zip(group[::2], group[1::2], strict=True))
    assert (info["name"], info["last-delivered-id"]) == (GROUP, "0-0")


async def test_a_read_remembers_the_group_and_a_failed_heal_forgets_it(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """After a read the session's next enqueue sends no XGROUP CREATE; after a NOGROUP
    whose heal failed (Redis went away meanwhile) the next enqueue creates the group in
    its own write, and the entry is delivered."""
    user, job = ids
    await raw_redis("XGROUP", "CREATE", jobs_key(user), GROUP, "0", "MKSTREAM")  # not by us
    with trio.fail_after(10):
        await substrate.read_new_delivered(user, "c1", count=10, state=DELIVERED, ttl_s=60)
        before = await xgroup_creates(raw_redis)
        await substrate.enqueue(user, {"filler": "1"}, maxlen=100)
        assert await xgroup_creates(raw_redis) == before
        await raw_redis("DEL", jobs_key(user))

        async def heal_fails(session: Any, user_id: str) -> None:
            raise SubstrateUnavailable("Redis went away (test)")

        monkeypatch.setattr(substrate, "_heal_group", heal_fails)
        with pytest.raises(SubstrateUnavailable):
            await substrate.read_new_delivered(user, "c1", count=10, state=DELIVERED, ttl_s=60)
        monkeypatch.undo()
        before = await xgroup_creates(raw_redis)
        entry_id = await substrate.enqueue(user, {"job_id": job}, maxlen=100)
        assert await xgroup_creates(raw_redis) == before + 1
        got = await substrate.read_new_delivered(user, "c1", count=10, state=DELIVERED, ttl_s=60)
    assert [e.entry_id for e in got] == [entry_id]


async def test_a_delivery_read_s_script_error_other_than_nogroup_is_raised(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis
) -> None:
    """Presence holding a list (WRONGTYPE inside the script): an error, not "nothing
    read"."""
    user, _ = ids
    await substrate.enqueue(user, {"filler": "1"}, maxlen=100)
    await raw_redis("RPUSH", presence_key(user), "not a string")
    with trio.fail_after(5):
        with pytest.raises(ResponseError, match="wrong kind of value"):
            await substrate.read_new_delivered(
                user, "c1", count=10, state=DELIVERED, ttl_s=60, session_id="h1.s1"
            )


Read = Callable[[RedisSubstrate, str], Awaitable[Any]]


@pytest.mark.parametrize(
    ("what", "read"),
    [
        ("a job state read", lambda s, user: s.get_job_state(user, "j1")),
        ("a catalogue read", lambda s, user: s.get_catalogue(user)),
    ],
)
async def test_an_absent_key_proves_nothing_while_redis_cannot_serve_the_hub(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch, what: str, read: Read,
) -> None:  # fmt: skip
    """As the health probe would find an evicting Redis (``_redis_health``): a missing
    state or catalogue may have been evicted, so the read is unavailable, naming it; a
    present one is answered."""
    user, _ = ids
    asked: list[str] = []

    def unusable(read_what: str) -> SubstrateUnavailable:
        asked.append(read_what)
        return SubstrateUnavailable(f"Redis cannot serve {read_what}: evicting")

    monkeypatch.setattr(substrate._connections, "unusable", unusable)
    with trio.fail_after(5):
        with pytest.raises(SubstrateUnavailable, match=f"cannot serve {what}"):
            await read(substrate, user)
        await substrate.set_job_state(user, "j1", DELIVERED, ttl_s=30)
        await substrate.set_catalogue(user, "[]")
        assert await read(substrate, user) is not None
    assert asked == [what]


async def test_a_group_still_missing_after_its_heal_reads_as_nothing(
    substrate: RedisSubstrate, ids: tuple[str, str], raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The stream came back without its group, and the group is gone again before the
    read after the heal (here: the heal made nothing): nothing read, no error; the next
    read heals it."""
    user, job = ids
    await raw_redis("XADD", jobs_key(user), "*", "job_id", job)
    heals: list[str] = []

    async def heal_makes_nothing(session: Any, user_id: str) -> None:
        heals.append(user_id)

    monkeypatch.setattr(substrate, "_heal_group", heal_makes_nothing)
    with trio.fail_after(5):
        got = await substrate.read_new_delivered(user, "c1", count=10, state=DELIVERED, ttl_s=60)
    assert (got, heals) == ([], [user])
