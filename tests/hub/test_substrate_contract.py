"""One contract, three substrates: ``MemorySubstrate``, ``RedisSubstrate`` entered with
``async with`` (the hub's way) and ``RedisSubstrate`` used without it (one connection per
call). Real time with tiny durations, every wait bounded by ``fail_after``; Redis is the
machine's, with unique user and job ids per test and their keys deleted afterwards.
Time-travel tests of the memory substrate live in test_memory_substrate.py."""

from __future__ import annotations

import secrets
import socket
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
import trio.testing
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import (
    Claimed,
    Entry,
    cancel_key,
    index_key,
    jobs_key,
    presence_key,
    result_key,
    state_key,
    tools_key,
)

from ..conftest import RawRedis

GROUP_MAXLEN = 1000


@attrs.define
class Case:
    """A substrate under test plus what only a test may do to its backing store."""

    kind: str
    substrate: MemorySubstrate | RedisSubstrate
    raw: RawRedis
    client_name: str
    keys: list[str] = attrs.Factory(list)

    @property
    def is_redis(self) -> bool:
        return self.kind != "memory"

    def user(self) -> str:
        user_id = f"test-{secrets.token_hex(6)}"
        self.keys += [presence_key(user_id), jobs_key(user_id), index_key(user_id)]
        self.keys.append(tools_key(user_id))
        return user_id

    def job(self) -> str:
        job_id = f"job-{secrets.token_hex(6)}"
        self.keys += [result_key(job_id), state_key(job_id), cancel_key(job_id)]
        return job_id

    async def delete_stream(self, user_id: str) -> None:
        """Simulate eviction / Redis restarted without persistence."""
        if isinstance(self.substrate, MemorySubstrate):
            self.substrate.delete_stream(user_id)
        else:
            assert await self.raw("DEL", jobs_key(user_id)) == 1

    async def wait_blocked(self, command: str) -> None:
        """Return once a read of ours is blocked (in Redis: server-side)."""
        if isinstance(self.substrate, MemorySubstrate):
            await trio.testing.wait_all_tasks_blocked()
            return
        with trio.fail_after(3):
            while not await self.blocked(command):  # noqa: ASYNC110 - polling Redis' own view
                await trio.sleep(0.005)

    async def blocked(self, command: str) -> bool:
        clients = (await self.raw("CLIENT", "LIST")).splitlines()
        for line in clients:
            info = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
            if info.get("name") == self.client_name and "b" in info.get("flags", ""):
                if info.get("cmd") == command:
                    return True
        return False

    async def fill(self, user_id: str, n: int, *, maxlen: int) -> None:
        for i in range(n):
            await self.substrate.enqueue(user_id, {"filler": str(i)}, maxlen=maxlen)


@pytest.fixture(params=["memory", "redis", "redis-unentered"])
async def case(
    request: pytest.FixtureRequest, raw_redis: RawRedis, redis_url: str
) -> AsyncIterator[Case]:
    name = f"deskbridge-test-{secrets.token_hex(4)}"
    if request.param == "memory":
        yield Case("memory", MemorySubstrate(), raw_redis, name)
        return
    substrate = RedisSubstrate.from_url(redis_url, client_name=name)
    c = Case(request.param, substrate, raw_redis, name)
    try:
        if request.param == "redis":
            async with substrate:
                yield c
        else:
            yield c
            await substrate.aclose()
    finally:
        if c.keys:
            await raw_redis("DEL", *c.keys)


# -- presence ------------------------------------------------------------------------------


async def test_presence_set_get_and_clear_only_by_holder(case: Case) -> None:
    s, user = case.substrate, case.user()
    assert await s.get_presence(user) is None
    await s.set_presence(user, "session-a", 30)
    assert await s.get_presence(user) == "session-a"
    await s.set_presence(user, "session-b", 30)  # a newer socket takes over
    assert await s.clear_presence(user, "session-a") is False
    assert await s.get_presence(user) == "session-b"
    assert await s.clear_presence(user, "session-b") is True
    assert await s.get_presence(user) is None
    assert await s.clear_presence(user, "session-b") is False


async def test_presence_expires_after_ttl(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.set_presence(user, "session-a", 0.2)
    assert await s.get_presence(user) == "session-a"
    if case.is_redis:
        ttl_ms = await case.raw("PTTL", presence_key(user))
        assert 0 < ttl_ms <= 200
    await trio.sleep(0.25)  # the behaviour under test is the passage of time
    assert await s.get_presence(user) is None
    assert await s.clear_presence(user, "session-a") is False


# -- enqueue and reads ---------------------------------------------------------------------


async def test_enqueue_then_read_new_delivers_fields(case: Case) -> None:
    s, user = case.substrate, case.user()
    entry_id = await s.enqueue(user, {"job_id": "j1", "name": "echo"}, maxlen=GROUP_MAXLEN)
    with trio.fail_after(3):
        got = await s.read_new(user, "c1", count=10, block_ms=1000)
    assert got == [Entry(entry_id, {"job_id": "j1", "name": "echo"})]


async def test_read_new_times_out_with_empty_list(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "c1", count=10, block_ms=100)
    with trio.fail_after(3):
        start = trio.current_time()
        assert await s.read_new(user, "c1", count=10, block_ms=150) == []
        assert trio.current_time() - start >= 0.14


async def test_read_new_wakes_when_an_entry_arrives_during_the_block(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.read_new(user, "c1", count=10, block_ms=1)  # group exists
    got: list[Entry] = []

    async def reader() -> None:
        got.extend(await s.read_new(user, "c1", count=10, block_ms=10_000))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await case.wait_blocked("xreadgroup")
            entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert got == [Entry(entry_id, {"a": "1"})]


async def test_one_entry_goes_to_exactly_one_of_two_consumers(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    got: dict[str, list[Entry]] = {}

    async def reader(consumer: str) -> None:
        got[consumer] = await s.read_new(user, consumer, count=10, block_ms=400)

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, "c1")
            nursery.start_soon(reader, "c2")
            await trio.testing.wait_all_tasks_blocked()
            entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    delivered = got["c1"] + got["c2"]
    assert [e.entry_id for e in delivered] == [entry_id]


async def test_read_pending_returns_own_unacked_entries_until_acked(case: Case) -> None:
    s, user = case.substrate, case.user()
    first = await s.enqueue(user, {"n": "1"}, maxlen=GROUP_MAXLEN)
    second = await s.enqueue(user, {"n": "2"}, maxlen=GROUP_MAXLEN)
    assert len(await s.read_new(user, "c1", count=10, block_ms=100)) == 2
    third = await s.enqueue(user, {"n": "3"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c2", count=10, block_ms=100)] == [third]

    mine = await s.read_pending(user, "c1", count=10)
    assert mine == [Entry(first, {"n": "1"}), Entry(second, {"n": "2"})]
    assert await s.read_pending(user, "c1", count=1) == [Entry(first, {"n": "1"})]
    assert await s.ack(user, first) == 1
    assert await s.ack(user, first) == 0
    assert [e.entry_id for e in await s.read_pending(user, "c1", count=10)] == [second]
    assert [e.entry_id for e in await s.read_pending(user, "c2", count=10)] == [third]
    assert await s.read_pending(user, "nobody", count=10) == []


async def test_ack_of_unknown_entry_or_stream_is_zero(case: Case) -> None:
    s, user = case.substrate, case.user()
    assert await s.ack(user, "1-1") == 0
    await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert await s.ack(user, "1-1") == 0


async def test_trimmed_pending_entry_comes_back_without_fields(case: Case) -> None:
    s, user = case.substrate, case.user()
    victim = await s.enqueue(user, {"a": "victim"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=1, block_ms=100)] == [victim]
    # MAXLEN ~ trims whole stream nodes (100 entries by default), so overflow generously.
    await case.fill(user, 250, maxlen=1)
    pending = await s.read_pending(user, "c1", count=10)
    assert pending == [Entry(victim, None)]
    assert await s.ack(user, victim) == 1
    assert await s.read_pending(user, "c1", count=10) == []


# -- XAUTOCLAIM ----------------------------------------------------------------------------


async def test_autoclaim_respects_min_idle(case: Case) -> None:
    s, user = case.substrate, case.user()
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "dead", count=10, block_ms=100)

    none = await s.autoclaim(user, "alive", min_idle_ms=60_000, start="0-0", count=10)
    assert none == Claimed("0-0", (), ())
    await trio.sleep(0.15)  # let the entry go idle
    claimed = await s.autoclaim(user, "alive", min_idle_ms=100, start="0-0", count=10)
    assert claimed == Claimed("0-0", (Entry(entry_id, {"a": "1"}),), ())
    assert await s.read_pending(user, "dead", count=10) == []
    assert [e.entry_id for e in await s.read_pending(user, "alive", count=10)] == [entry_id]
    # the claim restarted the idle time
    again = await s.autoclaim(user, "third", min_idle_ms=100, start="0-0", count=10)
    assert again == Claimed("0-0", (), ())


async def test_read_pending_restarts_idle_time(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "c1", count=10, block_ms=100)
    await trio.sleep(0.15)
    assert len(await s.read_pending(user, "c1", count=10)) == 1  # re-delivery
    claimed = await s.autoclaim(user, "c2", min_idle_ms=100, start="0-0", count=10)
    assert claimed.entries == ()


async def test_autoclaim_reports_and_drops_deleted_entries_whatever_their_idle(case: Case) -> None:
    s, user = case.substrate, case.user()
    victim = await s.enqueue(user, {"a": "victim"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "dead", count=1, block_ms=100)
    await case.fill(user, 250, maxlen=1)
    claimed = await s.autoclaim(user, "alive", min_idle_ms=60_000, start="0-0", count=10)
    assert claimed == Claimed("0-0", (), (victim,))
    assert await s.read_pending(user, "dead", count=10) == []
    again = await s.autoclaim(user, "alive", min_idle_ms=0, start="0-0", count=10)
    assert again == Claimed("0-0", (), ())


async def test_autoclaim_cursor_walks_the_pending_entries_list(case: Case) -> None:
    s, user = case.substrate, case.user()
    ids = [await s.enqueue(user, {"n": str(i)}, maxlen=GROUP_MAXLEN) for i in range(3)]
    await s.read_new(user, "dead", count=10, block_ms=100)
    first = await s.autoclaim(user, "alive", min_idle_ms=0, start="0-0", count=1)
    assert [e.entry_id for e in first.entries] == ids[:1]
    assert first.next_start == ids[1]
    second = await s.autoclaim(user, "alive", min_idle_ms=0, start=first.next_start, count=1)
    assert [e.entry_id for e in second.entries] == ids[1:2]
    third = await s.autoclaim(user, "alive", min_idle_ms=0, start=second.next_start, count=5)
    assert [e.entry_id for e in third.entries] == ids[2:]
    assert third.next_start == "0-0"


# -- NOGROUP self-heal ---------------------------------------------------------------------


async def test_reads_on_a_missing_group_heal_and_return_nothing(case: Case) -> None:
    s, user = case.substrate, case.user()
    assert await s.read_pending(user, "c1", count=10) == []
    await case.delete_stream(user)
    assert await s.read_new(user, "c1", count=10, block_ms=1) == []
    await case.delete_stream(user)
    assert await s.autoclaim(user, "c1", min_idle_ms=0, start="0-0", count=10) == Claimed(
        "0-0", (), ()
    )
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=10, block_ms=500)] == [entry_id]


async def _read_all(case: Case, user: str, consumer: str) -> list[Entry]:
    """Read until a read comes back empty (a NOGROUP heal returns [] once first)."""
    out: list[Entry] = []
    empty = 0
    with trio.fail_after(5):
        while empty < 2:
            got = await case.substrate.read_new(user, consumer, count=10, block_ms=100)
            out += got
            empty = 0 if got else empty + 1
    return out


@pytest.mark.parametrize("order", ["read-first", "enqueue-first"])
async def test_stream_deleted_then_next_entry_is_read_exactly_once(case: Case, order: str) -> None:
    s, user = case.substrate, case.user()
    old = await s.enqueue(user, {"a": "old"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=10, block_ms=100)] == [old]
    await case.delete_stream(user)  # Redis restarted without persistence
    if order == "read-first":
        assert await s.read_new(user, "c1", count=10, block_ms=1) == []
    new = await s.enqueue(user, {"a": "new"}, maxlen=GROUP_MAXLEN)
    assert await _read_all(case, user, "c1") == [Entry(new, {"a": "new"})]
    assert await s.read_pending(user, "c1", count=10) == [Entry(new, {"a": "new"})]
    assert await s.ack(user, new) == 1


async def test_stream_deleted_while_a_reader_blocks(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    got: list[list[Entry]] = []

    async def reader() -> None:
        got.append(await s.read_new(user, "c1", count=10, block_ms=10_000))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await case.wait_blocked("xreadgroup")
            await case.delete_stream(user)
    assert got == [[]]
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await _read_all(case, user, "c1")] == [entry_id]


# -- cancellation --------------------------------------------------------------------------


async def test_cancelled_read_new_leaves_no_waiter_to_steal_the_next_entry(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    for round_ in range(10):
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    await s.read_new(user, "c1", count=10, block_ms=30_000)
                    raise AssertionError("the read was not cancelled")

                nursery.start_soon(reader)
                await case.wait_blocked("xreadgroup")
                nursery.cancel_scope.cancel()
            if case.is_redis:  # the socket was closed before the cancellation completed
                assert not await case.blocked("xreadgroup")
            entry_id = await s.enqueue(user, {"round": str(round_)}, maxlen=GROUP_MAXLEN)
            got = await s.read_new(user, "c2", count=10, block_ms=1000)
        assert [e.entry_id for e in got] == [entry_id]
        assert await s.read_pending(user, "c1", count=10) == []


async def test_many_cancelled_reads_do_not_exhaust_connections(case: Case) -> None:
    s, user = case.substrate, case.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    for _ in range(80):  # more than coredis' default pool of 64
        with trio.move_on_after(0.005):
            await s.read_new(user, "c1", count=10, block_ms=30_000)
    with trio.fail_after(5):
        entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
        got = await s.read_new(user, "c2", count=10, block_ms=1000)
    assert [e.entry_id for e in got] == [entry_id]


async def test_cancelled_wait_result_takes_nothing(case: Case) -> None:
    s, job = case.substrate, case.job()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                await s.wait_result(job, timeout_s=30)
                raise AssertionError("the wait was not cancelled")

            nursery.start_soon(waiter)
            await case.wait_blocked("blpop")
            nursery.cancel_scope.cancel()
        if case.is_redis:
            assert not await case.blocked("blpop")
        await s.publish_result(job, "payload", ttl_s=30)
        assert await s.wait_result(job, timeout_s=1) == "payload"


# -- results -------------------------------------------------------------------------------


async def test_publish_then_wait_result_round_trip(case: Case) -> None:
    s, job = case.substrate, case.job()
    await s.publish_result(job, '{"ok": true}', ttl_s=300)
    if case.is_redis:
        ttl_ms = await case.raw("PTTL", result_key(job))
        assert 299_000 < ttl_ms <= 300_000
    await s.publish_result(job, "second", ttl_s=300)
    with trio.fail_after(3):
        assert await s.wait_result(job, timeout_s=1) == '{"ok": true}'
        assert await s.wait_result(job, timeout_s=1) == "second"
    if case.is_redis:
        assert await case.raw("EXISTS", result_key(job)) == 0


async def test_wait_result_wakes_when_published(case: Case) -> None:
    s, job = case.substrate, case.job()
    got: list[str | None] = []

    async def waiter() -> None:
        got.append(await s.wait_result(job, timeout_s=10))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await case.wait_blocked("blpop")
            await s.publish_result(job, "done", ttl_s=30)
    assert got == ["done"]


async def test_wait_result_times_out_with_none(case: Case) -> None:
    s, job = case.substrate, case.job()
    with trio.fail_after(3):
        start = trio.current_time()
        assert await s.wait_result(job, timeout_s=0.15) is None
        assert trio.current_time() - start >= 0.14


async def test_result_expires_after_ttl(case: Case) -> None:
    s, job = case.substrate, case.job()
    await s.publish_result(job, "late", ttl_s=0.1)
    await trio.sleep(0.15)
    assert await s.wait_result(job, timeout_s=0.01) is None


async def test_ping(case: Case) -> None:
    await case.substrate.ping()


# -- unavailable ---------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_unavailable_is_reported_quickly_without_the_password(case: Case) -> None:
    if isinstance(case.substrate, MemorySubstrate):
        case.substrate.set_unavailable(True)
        down: MemorySubstrate | RedisSubstrate = case.substrate
    else:
        port = _closed_port()
        down = RedisSubstrate.from_url(f"redis://:hunter2@127.0.0.1:{port}/0")
    user, job = case.user(), case.job()
    calls = [
        lambda: down.get_presence(user),
        lambda: down.enqueue(user, {"a": "1"}, maxlen=10),
        lambda: down.wait_result(job, timeout_s=5),
        lambda: down.read_new(user, "c1", count=1, block_ms=5000),
        lambda: down.ping(),
    ]
    for call in calls:
        with trio.fail_after(3):
            with pytest.raises(SubstrateUnavailable) as info:
                await call()
        assert "hunter2" not in str(info.value)
        if case.is_redis:
            assert f"127.0.0.1:{port}" in str(info.value)


# -- bookkeeping: the entry index, job state, cancel flag, catalogue -------------------------


async def test_index_maps_entries_to_jobs_until_acked(case: Case) -> None:
    user, job = case.user(), case.job()
    entry_id = await case.substrate.enqueue(user, {"job_id": job, "name": "x"}, maxlen=100)
    other = await case.substrate.enqueue(user, {"filler": "1"}, maxlen=100)  # no job id
    assert await case.substrate.job_ids(user, [entry_id, other, "1-1"]) == {entry_id: job}
    await case.substrate.read_new(user, "c1", count=10, block_ms=1)
    assert await case.substrate.ack(user, entry_id) == 1
    assert await case.substrate.job_ids(user, [entry_id]) == {}
    assert await case.substrate.trimmed(user) == []


async def test_trimmed_lists_indexed_entries_older_than_the_stream(case: Case) -> None:
    user = case.user()
    jobs = [case.job() for _ in range(3)]
    ids = [await case.substrate.enqueue(user, {"job_id": j}, maxlen=1000) for j in jobs]
    assert await case.substrate.trimmed(user) == []
    # MAXLEN ~ trims whole macro nodes in Redis: push enough to trim the first three away
    await case.fill(user, 300, maxlen=50)
    lost = await case.substrate.trimmed(user)
    assert lost == list(zip(ids, jobs, strict=True))
    assert await case.substrate.forget(user, ids[0]) is True
    assert await case.substrate.forget(user, ids[0]) is False  # only one caller owns it
    assert [e for e, _ in await case.substrate.trimmed(user)] == ids[1:]


async def test_trimmed_lists_everything_when_the_stream_is_gone(case: Case) -> None:
    user, job = case.user(), case.job()
    entry_id = await case.substrate.enqueue(user, {"job_id": job}, maxlen=100)
    await case.delete_stream(user)
    assert await case.substrate.trimmed(user) == [(entry_id, job)]


async def test_job_state_and_cancel_flag(case: Case) -> None:
    job = case.job()
    assert await case.substrate.get_job_state(job) is None
    await case.substrate.set_job_state(job, "queued", ttl_s=60)
    assert await case.substrate.get_job_state(job) == "queued"
    marked = await case.substrate.mark_delivered(job, "delivered", ttl_s=60)
    assert marked.verdict == "delivered"
    assert await case.substrate.get_job_state(job) == "delivered"
    await case.substrate.set_job_state(job, "queued", ttl_s=60)
    await case.substrate.request_cancel(job, ttl_s=60)
    marked = await case.substrate.mark_delivered(job, "delivered", ttl_s=60)
    assert marked.verdict == "cancelled"
    assert await case.substrate.get_job_state(job) == "queued"  # not forwarded: untouched


async def test_deadline_is_set_and_judged_on_the_substrate_clock(case: Case) -> None:
    """enqueue(start_within_s) stamps deadline/enqueued_at from the substrate's clock
    (Redis TIME); mark_delivered compares the deadline with that same clock."""
    user, job = case.user(), case.job()
    await case.substrate.enqueue(user, {"job_id": job}, maxlen=100, start_within_s=30.0)
    (entry,) = await case.substrate.read_new(user, "c1", count=1, block_ms=1)
    assert entry.fields is not None
    deadline, enqueued_at = float(entry.fields["deadline"]), float(entry.fields["enqueued_at"])
    assert deadline - enqueued_at == pytest.approx(30.0, abs=0.002)
    marked = await case.substrate.mark_delivered(job, "delivered", ttl_s=60, deadline=deadline)
    assert marked.verdict == "delivered"
    assert enqueued_at - 0.002 <= marked.server_time < enqueued_at + 5.0
    assert await case.substrate.get_job_state(job) == "delivered"
    # a deadline already passed on the substrate's clock: expired, state untouched
    other = case.job()
    await case.substrate.set_job_state(other, "queued", ttl_s=60)
    marked = await case.substrate.mark_delivered(
        other, "delivered", ttl_s=60, deadline=enqueued_at - 1.0
    )
    assert marked.verdict == "expired"
    assert await case.substrate.get_job_state(other) == "queued"
    # start_within_s=0: expired as soon as it is read
    await case.substrate.enqueue(user, {"job_id": other}, maxlen=100, start_within_s=0.0)
    (late,) = await case.substrate.read_new(user, "c1", count=1, block_ms=1)
    assert late.fields is not None
    marked = await case.substrate.mark_delivered(
        other, "delivered", ttl_s=60, deadline=float(late.fields["deadline"])
    )
    assert marked.verdict == "expired"


async def test_catalogue_round_trips(case: Case) -> None:
    user = case.user()
    assert await case.substrate.get_catalogue(user) is None
    await case.substrate.set_catalogue(user, '[{"name": "echo"}]')
    assert await case.substrate.get_catalogue(user) == '[{"name": "echo"}]'


async def test_refresh_presence_never_steals_it_from_another_session(case: Case) -> None:
    user = case.user()
    assert await case.substrate.refresh_presence(user, "s1", 30) is True  # absent: taken
    assert await case.substrate.get_presence(user) == "s1"
    assert await case.substrate.refresh_presence(user, "s1", 30) is True  # ours: refreshed
    await case.substrate.set_presence(user, "s2", 30)  # a newer session took over
    assert await case.substrate.refresh_presence(user, "s1", 30) is False
    assert await case.substrate.get_presence(user) == "s2"


async def test_prune_consumers_drops_idle_empty_consumers_only(case: Case) -> None:
    user = case.user()
    for _ in range(3):
        await case.substrate.enqueue(user, {"job_id": case.job()}, maxlen=100)
    (first,) = await case.substrate.read_new(user, "dead-acked", count=1, block_ms=1)
    await case.substrate.ack(user, first.entry_id)
    await case.substrate.read_new(user, "dead-pending", count=1, block_ms=1)
    await case.substrate.read_new(user, "me", count=1, block_ms=1)
    # "dead-pending" still owns an entry (reclaim takes it later); "me" is kept
    assert await case.substrate.prune_consumers(user, idle_ms=0, keep="me") == 1  # dead-acked
    assert await case.substrate.prune_consumers(user, idle_ms=0, keep="me") == 0
    assert await case.substrate.prune_consumers(user, idle_ms=3_600_000, keep="x") == 0
    if case.is_redis:
        names = {
            c[1] for c in await case.raw("XINFO", "CONSUMERS", jobs_key(user), "bridge-workers")
        }
        assert names == {"dead-pending", "me"}
