"""MemorySubstrate on trio's MockClock (autojump): exact TTL and idle boundaries with no
real sleeps, plus its test helpers. The shared contract is test_substrate_contract.py."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._substrate import Claimed, Entry

T = Timings()
PRESENCE_TTL_S = T.presence_ttl_s
RECLAIM_IDLE_MS = int(T.reclaim_idle_s * 1000)
RESULT_TTL_S = T.result_ttl_s
TICK_S = 0.001


async def test_presence_expires_exactly_at_the_ttl(autojump_clock: trio.testing.MockClock) -> None:
    s = MemorySubstrate()
    set_at = trio.current_time()
    await s.set_presence("u", "session", PRESENCE_TTL_S)
    await trio.sleep_until(set_at + PRESENCE_TTL_S - TICK_S)
    assert await s.get_presence("u") == "session"
    await trio.sleep_until(set_at + PRESENCE_TTL_S)
    assert await s.get_presence("u") is None
    assert await s.clear_presence("u", "session") is False


async def test_heartbeat_extends_presence(autojump_clock: trio.testing.MockClock) -> None:
    s = MemorySubstrate()
    await s.set_presence("u", "session", PRESENCE_TTL_S)
    await trio.sleep(PRESENCE_TTL_S - TICK_S)
    renewed_at = trio.current_time()
    await s.set_presence("u", "session", PRESENCE_TTL_S)
    await trio.sleep_until(renewed_at + PRESENCE_TTL_S - TICK_S)
    assert await s.get_presence("u") == "session"
    await trio.sleep_until(renewed_at + PRESENCE_TTL_S)
    assert await s.get_presence("u") is None


async def test_autoclaim_takes_an_entry_exactly_at_the_reclaim_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    entry_id = await s.enqueue("u", {"a": "1"}, maxlen=500)
    delivered_at = trio.current_time()
    assert len(await s.read_new("u", "dead", count=10, block_ms=0)) == 1
    await trio.sleep_until(delivered_at + T.reclaim_idle_s - TICK_S)
    early = await s.autoclaim("u", "alive", min_idle_ms=RECLAIM_IDLE_MS, start="0-0", count=10)
    assert early == Claimed("0-0", (), ())
    await trio.sleep_until(delivered_at + T.reclaim_idle_s)
    claimed = await s.autoclaim("u", "alive", min_idle_ms=RECLAIM_IDLE_MS, start="0-0", count=10)
    assert claimed == Claimed("0-0", (Entry(entry_id, {"a": "1"}),), ())


async def test_reading_pending_entries_leaves_the_idle_clock_of_the_real_delivery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # (was: a pending read restarted it, so a drain every few seconds kept an entry
    # from ever reaching the reclaim idle)
    s = MemorySubstrate()
    await s.enqueue("u", {"a": "1"}, maxlen=500)
    await s.read_new("u", "c1", count=10, block_ms=0)
    delivered_at = trio.current_time()
    while trio.current_time() < delivered_at + T.reclaim_idle_s - 1:
        await trio.sleep(1)
        assert len(await s.read_pending("u", "c1", count=10)) == 1
    await trio.sleep_until(delivered_at + T.reclaim_idle_s - TICK_S)
    claimed = await s.autoclaim("u", "c2", min_idle_ms=RECLAIM_IDLE_MS, start="0-0", count=10)
    assert claimed.entries == ()
    await trio.sleep_until(delivered_at + T.reclaim_idle_s)
    claimed = await s.autoclaim("u", "c2", min_idle_ms=RECLAIM_IDLE_MS, start="0-0", count=10)
    assert len(claimed.entries) == 1


async def test_trimmed_pending_entries_are_not_redelivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    victim = await s.enqueue("u", {"a": "victim"}, maxlen=500)
    await s.read_new("u", "c1", count=10, block_ms=0)
    delivered_at = trio.current_time()
    await s.enqueue("u", {"a": "next"}, maxlen=1)  # exact trim: the victim's body goes
    await trio.sleep(10)
    assert await s.read_pending("u", "c1", count=10) == [Entry(victim, None)]
    # a body-less entry keeps its idle time (Redis does not touch it on re-read) ...
    assert s.pending_count("u") == 1
    await trio.sleep_until(delivered_at + 20)
    # ... and XAUTOCLAIM drops it at any idle time
    claimed = await s.autoclaim("u", "c2", min_idle_ms=RECLAIM_IDLE_MS, start="0-0", count=10)
    assert claimed == Claimed("0-0", (), (victim,))
    assert s.pending_count("u") == 0


async def test_enqueue_trims_exactly_to_maxlen_oldest_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    ids = [await s.enqueue("u", {"n": str(i)}, maxlen=3) for i in range(5)]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert len(set(ids)) == 5
    got = await s.read_new("u", "c1", count=10, block_ms=0)
    assert [e.entry_id for e in got] == ids[2:]


async def test_result_is_gone_after_its_ttl(autojump_clock: trio.testing.MockClock) -> None:
    s = MemorySubstrate()
    published_at = trio.current_time()
    await s.publish_result("u", "j1", "kept", ttl_s=RESULT_TTL_S)
    await s.publish_result("u", "j2", "lost", ttl_s=RESULT_TTL_S)
    await trio.sleep_until(published_at + RESULT_TTL_S - TICK_S)
    assert await s.wait_result("u", "j1", timeout_s=TICK_S / 10) == "kept"
    await trio.sleep_until(published_at + RESULT_TTL_S)
    assert await s.wait_result("u", "j2", timeout_s=1) is None


async def test_blocking_reads_time_out_exactly(autojump_clock: trio.testing.MockClock) -> None:
    s = MemorySubstrate()
    start = trio.current_time()
    assert await s.read_new("u", "c1", count=10, block_ms=2000) == []  # creates the group
    assert trio.current_time() == start
    assert await s.read_new("u", "c1", count=10, block_ms=2000) == []
    assert trio.current_time() == start + 2.0
    assert await s.wait_result("u", "j", timeout_s=90) is None
    assert trio.current_time() == start + 92.0


async def test_zero_block_waits_until_an_entry_arrives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    await s.read_new("u", "c1", count=10, block_ms=1)
    got: list[Entry] = []
    async with trio.open_nursery() as nursery:

        async def reader() -> None:
            got.extend(await s.read_new("u", "c1", count=10, block_ms=0))

        nursery.start_soon(reader)
        await trio.sleep(3600)
        assert got == []
        entry_id = await s.enqueue("u", {"a": "1"}, maxlen=10)
    assert [e.entry_id for e in got] == [entry_id]


async def test_one_publish_wakes_one_of_two_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    got: list[str | None] = []

    async def waiter() -> None:
        got.append(await s.wait_result("u", "j", timeout_s=10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        await s.publish_result("u", "j", "only", ttl_s=30)
    assert sorted(got, key=str) == [None, "only"]


async def test_set_unavailable_fails_every_call_and_wakes_blocked_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    await s.read_new("u", "c1", count=10, block_ms=1)
    failures: list[str] = []

    async def expect_failure(name: str, call) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(SubstrateUnavailable):
            await call()
        failures.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            expect_failure, "read_new", lambda: s.read_new("u", "c1", count=1, block_ms=0)
        )
        nursery.start_soon(
            expect_failure, "wait_result", lambda: s.wait_result("u", "j", timeout_s=0)
        )
        await trio.testing.wait_all_tasks_blocked()
        s.set_unavailable(True)
    assert sorted(failures) == ["read_new", "wait_result"]
    for call in (
        lambda: s.ping(),
        lambda: s.get_presence("u"),
        lambda: s.set_presence("u", "x", 1),
        lambda: s.clear_presence("u", "x"),
        lambda: s.enqueue("u", {"a": "1"}, maxlen=1),
        lambda: s.read_pending("u", "c1", count=1),
        lambda: s.ack("u", "1-1"),
        lambda: s.autoclaim("u", "c1", min_idle_ms=0, start="0-0", count=1),
        lambda: s.publish_result("u", "j", "p", ttl_s=1),
    ):
        with pytest.raises(SubstrateUnavailable):
            await call()
    s.set_unavailable(False)
    await s.ping()


async def test_delete_stream_drops_the_pending_entries_list(
    autojump_clock: trio.testing.MockClock,
) -> None:
    s = MemorySubstrate()
    await s.enqueue("u", {"a": "1"}, maxlen=10)
    await s.read_new("u", "c1", count=10, block_ms=0)
    assert s.pending_count("u") == 1
    s.delete_stream("u")
    assert s.pending_count("u") == 0
    assert await s.read_pending("u", "c1", count=10) == []


async def test_arguments_are_checked() -> None:
    s = MemorySubstrate()
    with pytest.raises(ValueError):
        await s.set_presence("u", "x", 0)
    with pytest.raises(ValueError):
        await s.enqueue("u", {}, maxlen=10)
    with pytest.raises(ValueError):
        await s.ack("u", "not-an-id")
    with pytest.raises(ValueError):
        await s.wait_result("u", "j", timeout_s=-1)


async def test_usable_as_an_async_context_manager() -> None:
    async with MemorySubstrate() as s:
        await s.ping()
    await s.aclose()
    await s.ping()


async def test_an_indexed_submit_records_the_entry_s_own_deadline() -> None:
    """The idempotency record's deadline is the entry's, from the one clock reading the
    XADD stamped (as the Redis script appends the deadline it stamped). With a clock that
    moves 0.6 ms between readings, a second reading fell in the next millisecond: the
    record named another deadline than the job's (a contract check failed once in CI)."""
    from deskbridge_hub._contract_caller import _submission
    from deskbridge_hub._idempotency import IndexRecord

    readings = iter(range(1_000_000))
    s = MemorySubstrate(clock=lambda: 1_700_000_000.0 + next(readings) * 0.0006)
    await s.set_presence("u", "s1", 30)
    for n in range(5):  # each crossing of a millisecond boundary would have shown
        key = f"key-{n}"
        assert (await s.submit("u", _submission("u", f"job-{n}", key=key))).verdict == "queued"
        again = await s.submit("u", _submission("u", f"retry-{n}", key=key))
        assert again.verdict == "indexed"
        (entry,) = await s.read_new("u", "c1", count=10, block_ms=1)
        assert entry.fields is not None
        record = IndexRecord.decode(again.index_value or "")
        assert record.deadline == float(entry.fields["deadline"])
