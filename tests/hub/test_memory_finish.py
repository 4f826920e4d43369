"""``MemorySubstrate``'s finishing step (``_memory_finish``: ``finish``,
``publish_result``) exactly, on MockClock (autojump; issue 15: mutation testing): the
fence, what each write keeps and for how long (state, result list, the idempotency
record's expiry), the XACK's count, the progress log's last event and the mailbox. The
semantics shared with Redis are the contract suite's (``_contract_finish``); these pin
the in-memory model's edges the contract cannot reach cheaply (exact expiry instants,
the progress log's sequence, a waiter woken by the write)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_hub._jobstate import JobState
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._memory_finish import WrongType
from deskbridge_hub._substrate import (
    MAILBOX_TTL_S,
    Finished,
    fence_key,
    idem_key,
    result_key,
    state_key,
)

STATE = JobState("finished", user_id="u1", session_id="h1.s")
TICK_S = 0.001


async def pending_entry(s: MemorySubstrate) -> str:
    entry_id = await s.enqueue("u1", {"job_id": "j1"}, maxlen=10)
    assert [e.entry_id for e in await s.read_new("u1", "c1", count=1, block_ms=None)] == [entry_id]
    return entry_id


@pytest.mark.parametrize("ttl_s", [0, -1.0])
async def test_finish_and_publish_refuse_a_ttl_that_is_not_positive(autojump_clock, ttl_s):
    s = MemorySubstrate()
    with pytest.raises(ValueError, match=rf"^ttl_s must be > 0, got {ttl_s!r}$"):
        await s.finish("u1", "j1", "p", STATE, ttl_s=ttl_s)
    with pytest.raises(ValueError, match=rf"^ttl_s must be > 0, got {ttl_s!r}$"):
        await s.publish_result("u1", "j1", "p", ttl_s=ttl_s)
    assert s._kv == {} and s._results == {}


async def test_a_short_ttl_is_a_ttl(autojump_clock):
    s = MemorySubstrate()
    assert await s.finish("u1", "j1", "p", STATE, ttl_s=0.5) == Finished("done", acked=False)
    await s.publish_result("u1", "j2", "q", ttl_s=0.5)
    assert await s.get_result("u1", "j1") == "p" and await s.get_result("u1", "j2") == "q"


async def test_finish_writes_result_and_state_for_ttl_s_and_acks_the_entry(autojump_clock):
    s = MemorySubstrate()
    entry_id = await pending_entry(s)
    start = trio.current_time()
    done = await s.finish("u1", "j1", "p1", STATE, ttl_s=10.0, entry_id=entry_id)
    assert done == Finished("done", acked=True)
    assert s.pending_count("u1") == 0
    assert await s.get_job_state("u1", "j1") == STATE
    assert s._kv[state_key("u1", "j1")] == (STATE.encode(), start + 10.0)
    assert s._results[result_key("u1", "j1")].expires_at == start + 10.0
    await trio.sleep_until(start + 10.0 - TICK_S)
    assert await s.get_result("u1", "j1") == "p1"
    await trio.sleep_until(start + 10.0)
    assert await s.get_result("u1", "j1") is None and await s.get_job_state("u1", "j1") is None
    # acked already: the XACK finds nothing pending
    again = await s.finish("u1", "j1", "p1", STATE, ttl_s=10.0, entry_id=entry_id)
    assert again == Finished("done", acked=False)


async def test_finish_without_payload_or_entry_writes_only_the_state(autojump_clock):
    s = MemorySubstrate()
    entry_id = await pending_entry(s)
    await s.publish_progress("j1", "50%", ttl_s=60.0)
    done = await s.finish("u1", "j1", None, STATE, ttl_s=10.0, notify="box")
    assert done == Finished("done", acked=False)
    assert s.pending_count("u1") == 1 and s._results == {}
    assert await s.get_job_state("u1", "j1") == STATE
    assert [p for _, p in await s.read_progress("j1", "0", block_ms=1)] == ["50%"]
    assert await s.read_notifications("box", count=10, block_ms=1) == []
    assert entry_id


async def test_the_fence_refuses_an_older_delivery_and_lets_the_newest_through(autojump_clock):
    s = MemorySubstrate()
    entry_id = await pending_entry(s)
    s._set(fence_key("u1", "j1"), "3", trio.current_time(), 60.0)
    stale = await s.finish("u1", "j1", "old", STATE, ttl_s=10.0, entry_id=entry_id, epoch=2)
    assert stale == Finished("stale", newest=3)
    assert s._results == {} and state_key("u1", "j1") not in s._kv
    assert s.pending_count("u1") == 1
    done = await s.finish("u1", "j1", "new", STATE, ttl_s=10.0, entry_id=entry_id, epoch=3)
    assert done == Finished("done", acked=True)
    assert await s.get_result("u1", "j1") == "new"


async def test_no_fence_or_no_epoch_finishes(autojump_clock):
    s = MemorySubstrate()
    assert await s.finish("u1", "j1", "p", STATE, ttl_s=10.0, epoch=7) == Finished("done")
    s._set(fence_key("u1", "j2"), "3", trio.current_time(), 60.0)
    assert await s.finish("u1", "j2", "p", STATE, ttl_s=10.0) == Finished("done")


async def test_a_spoiled_result_key_stops_the_step_at_the_result_write(autojump_clock):
    s = MemorySubstrate()
    entry_id = await pending_entry(s)
    s.spoil_key(result_key("u1", "j1"))
    with pytest.raises(
        WrongType, match=r"^WRONGTYPE bridge:result:\{u1\}:j1 holds a string, not a list$"
    ):
        await s.finish("u1", "j1", "p", STATE, ttl_s=10.0, entry_id=entry_id, notify="box")
    assert state_key("u1", "j1") not in s._kv and s.pending_count("u1") == 1
    with pytest.raises(WrongType):
        await s.publish_result("u1", "j1", "p", ttl_s=10.0, notify="box")
    assert await s.read_notifications("box", count=10, block_ms=1) == []
    await trio.sleep(86_400 * 365)  # the spoiled value never expires
    with pytest.raises(WrongType):
        await s.publish_result("u1", "j1", "p", ttl_s=10.0)


async def test_results_queue_in_order_and_the_list_lives_ttl_s_from_the_last_write(autojump_clock):
    s = MemorySubstrate()
    start = trio.current_time()
    await s.publish_result("u1", "j1", "a", ttl_s=10.0)
    await trio.sleep(4)
    await s.publish_result("u1", "j1", "b", ttl_s=10.0)
    assert list(s._results[result_key("u1", "j1")].items) == ["a", "b"]
    await trio.sleep_until(start + 14.0 - TICK_S)
    assert await s.get_result("u1", "j1") == "a"
    await trio.sleep_until(start + 14.0)
    assert await s.get_result("u1", "j1") is None
    await s.publish_result("u1", "j1", "c", ttl_s=10.0)  # a new list after the old expired
    assert list(s._results[result_key("u1", "j1")].items) == ["c"]


async def test_a_result_wakes_the_caller_waiting_for_it(autojump_clock):
    s = MemorySubstrate()
    got = []

    async def wait():
        got.append(await s.wait_result("u1", "j1", timeout_s=0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await s.publish_result("u1", "j2", "other", ttl_s=10.0)  # another job's: still waits
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await s.finish("u1", "j1", "p", STATE, ttl_s=10.0)
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["p"] and s._result_waiters == {}


def record(s: MemorySubstrate, key: str, value: str, expires_at: float) -> None:
    s._kv[idem_key("u1", key)] = (value, expires_at)


async def test_the_idempotency_record_lives_at_least_as_long_as_the_result(autojump_clock):
    s = MemorySubstrate()
    now = trio.current_time()
    record(s, "k1", "j1 rest", now + 5.0)  # names this job, expires before the result
    await s.publish_result("u1", "j1", "p", ttl_s=10.0, idempotency_key="k1")
    assert s._kv[idem_key("u1", "k1")] == ("j1 rest", now + 10.0)
    assert s._results[result_key("u1", "j1")].expires_at == now + 10.0


async def test_a_longer_lived_idempotency_record_keeps_the_result_as_long(autojump_clock):
    s = MemorySubstrate()
    now = trio.current_time()
    record(s, "k1", "j1 rest", now + 50.0)
    await s.finish("u1", "j1", "p", STATE, ttl_s=10.0, idempotency_key="k1")
    assert s._kv[idem_key("u1", "k1")] == ("j1 rest", now + 50.0)
    assert s._results[result_key("u1", "j1")].expires_at == now + 50.0
    assert s._kv[state_key("u1", "j1")][1] == now + 10.0  # the state keeps its own ttl


@pytest.mark.parametrize("value", ["j2 rest", "j1x rest", "j1"])
async def test_an_idempotency_record_naming_another_job_is_left_alone(autojump_clock, value):
    s = MemorySubstrate()
    now = trio.current_time()
    record(s, "k1", value, now + 50.0)
    await s.publish_result("u1", "j1", "p", ttl_s=10.0, idempotency_key="k1")
    assert s._kv[idem_key("u1", "k1")] == (value, now + 50.0)
    assert s._results[result_key("u1", "j1")].expires_at == now + 10.0


async def test_without_an_idempotency_key_no_record_is_looked_at(autojump_clock):
    s = MemorySubstrate()
    now = trio.current_time()
    record(s, "j1", "j1 rest", now + 50.0)  # a record under the job id itself
    await s.publish_result("u1", "j1", "p", ttl_s=10.0)
    assert s._kv[idem_key("u1", "j1")] == ("j1 rest", now + 50.0)
    assert s._results[result_key("u1", "j1")].expires_at == now + 10.0


async def test_an_expired_idempotency_record_is_not_revived(autojump_clock):
    s = MemorySubstrate()
    now = trio.current_time()
    record(s, "k1", "j1 rest", now)
    await s.publish_result("u1", "j1", "p", ttl_s=10.0, idempotency_key="k1")
    assert idem_key("u1", "k1") not in s._kv


async def test_the_outcome_ends_the_progress_log_and_wakes_its_reader(autojump_clock):
    s = MemorySubstrate()
    await s.publish_progress("j1", "10%", ttl_s=60.0)
    got = []

    async def follow():
        got.extend(await s.read_progress("j1", "1-0", block_ms=0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        await s.finish("u1", "j1", '{"ok":true}', STATE, ttl_s=10.0)
    assert got == [("2-0", '{"outcome":{"ok":true}}')]
    await s.publish_progress("j1", "late", ttl_s=60.0)
    assert [n for n, _ in await s.read_progress("j1", "0", block_ms=1)] == ["1-0", "2-0", "3-0"]
    await s.publish_result("u1", "j1", '"again"', ttl_s=10.0)
    assert (await s.read_progress("j1", "3-0", block_ms=1)) == [("4-0", '{"outcome":"again"}')]


async def test_no_progress_log_is_created_and_an_expired_one_is_not_written(autojump_clock):
    s = MemorySubstrate()
    await s.finish("u1", "j1", "p", STATE, ttl_s=10.0)
    assert s._progress == {}
    await s.publish_progress("j2", "10%", ttl_s=5.0)
    await trio.sleep(5.0)  # expires exactly now
    await s.publish_result("u1", "j2", "p", ttl_s=10.0)
    assert list(s._progress["j2"].entries) == [(1, "10%")]


async def test_the_callers_mailbox_gets_job_and_payload_and_lives_on_after_it(autojump_clock):
    s = MemorySubstrate()
    got = []

    async def listen():
        got.extend(await s.read_notifications("box", count=10, block_ms=0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        await trio.testing.wait_all_tasks_blocked()
        await s.finish("u1", "j1", "p1", STATE, ttl_s=10.0, notify="box")
    assert got == [("j1", "p1")]
    start = trio.current_time()
    await s.publish_result("u1", "j2", "p2", ttl_s=10.0, notify="box")
    assert s._mailboxes["box"].expires_at == start + MAILBOX_TTL_S
    await trio.sleep_until(start + MAILBOX_TTL_S - TICK_S)
    await s.finish("u1", "j3", "p3", STATE, ttl_s=10.0, notify="box")
    assert await s.read_notifications("box", count=10, block_ms=1) == [("j2", "p2"), ("j3", "p3")]
    await s.publish_result("u1", "j4", "p4", ttl_s=10.0, notify="")  # no mailbox: none
    assert set(s._mailboxes) == {"box"}


async def test_a_provisional_finish_goes_only_to_the_caller(autojump_clock):
    """Not the job's last word (an in_doubt at a hand-over): no result list, so the
    result and a retry by the idempotency key wait for the real outcome; the state, the
    XACK, the progress log's end and the mailbox as for any finish."""
    s = MemorySubstrate()
    entry_id = await pending_entry(s)
    await s.publish_progress("j1", "10%", ttl_s=60.0)
    now = trio.current_time()
    record(s, "k1", "j1 rest", now + 5.0)
    s.spoil_key(result_key("u1", "j2"))  # never written: no WRONGTYPE either
    done = await s.finish(
        "u1", "j1", "maybe", STATE, ttl_s=10.0, entry_id=entry_id, notify="box",
        idempotency_key="k1", provisional=True,
    )  # fmt: skip
    assert done == Finished("done", acked=True)
    assert s._results == {} and await s.get_result("u1", "j1") is None
    assert s._kv[idem_key("u1", "k1")] == ("j1 rest", now + 5.0)
    assert await s.get_job_state("u1", "j1") == STATE and s.pending_count("u1") == 0
    assert await s.read_notifications("box", count=10, block_ms=1) == [("j1", "maybe")]
    assert [p for _, p in await s.read_progress("j1", "1-0", block_ms=1)] == ['{"outcome":maybe}']
    assert await s.finish("u1", "j2", "x", STATE, ttl_s=10.0, provisional=True) == Finished("done")
