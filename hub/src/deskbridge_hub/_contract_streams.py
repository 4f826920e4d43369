"""Contract checks of the streams part of the substrate (``_substrate.StreamSubstrate``):
enqueue and reads, XAUTOCLAIM, NOGROUP self-heal, cancellation. Registered into
``_contract.CHECKS``; run them with ``deskbridge_hub.testing.check_substrate``."""

from __future__ import annotations

import secrets

import attrs
import trio
import trio.testing

from ._contract import GROUP_MAXLEN, SubstrateHarness, check, read_all
from ._contract_caller import _submission
from ._jobstate import JobState, Stage
from ._substrate import (
    Beat,
    CancelAsked,
    Claimed,
    Entry,
    Pushed,
    Submission,
    Superseded,
    WakeItem,
    jobs_key,
)

# -- enqueue and reads ---------------------------------------------------------------------


@check
async def check_enqueue_then_read_new_delivers_fields(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    entry_id = await s.enqueue(user, {"job_id": "j1", "name": "echo"}, maxlen=GROUP_MAXLEN)
    with trio.fail_after(3):
        got = await s.read_new(user, "c1", count=10, block_ms=1000)
    assert got == [Entry(entry_id, {"job_id": "j1", "name": "echo"})]


@check
async def check_read_new_times_out_with_empty_list(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "c1", count=10, block_ms=100)
    with trio.fail_after(3):
        start = trio.current_time()
        assert await s.read_new(user, "c1", count=10, block_ms=150) == []
        assert trio.current_time() - start >= 0.14


@check
async def check_read_new_wakes_when_an_entry_arrives_during_the_block(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.read_new(user, "c1", count=10, block_ms=1)  # group exists
    got: list[Entry] = []

    async def reader() -> None:
        got.extend(await s.read_new(user, "c1", count=10, block_ms=10_000))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await h.wait_blocked("xreadgroup")
            entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert got == [Entry(entry_id, {"a": "1"})]


@check
async def check_one_entry_goes_to_exactly_one_of_two_consumers(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
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


@check
async def check_read_pending_returns_own_unacked_entries_until_acked(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
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


@check
async def check_ack_of_unknown_entry_or_stream_is_zero(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.ack(user, "1-1") == 0
    await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert await s.ack(user, "1-1") == 0


@check
async def check_trimmed_pending_entry_comes_back_without_fields(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    victim = await s.enqueue(user, {"a": "victim"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=1, block_ms=100)] == [victim]
    # MAXLEN ~ trims whole stream nodes (100 entries by default), so overflow generously.
    await h.fill(user, 250, maxlen=1)
    pending = await s.read_pending(user, "c1", count=10)
    assert pending == [Entry(victim, None)]
    assert await s.ack(user, victim) == 1
    assert await s.read_pending(user, "c1", count=10) == []


# -- XAUTOCLAIM ----------------------------------------------------------------------------


@check
async def check_autoclaim_respects_min_idle(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
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


@check
async def check_read_pending_leaves_the_idle_time_of_the_real_delivery(
    h: SubstrateHarness,
) -> None:
    # A drain looks at this consumer's pending entries; it must not push back their
    # reclaim (it did: XREADGROUP 0 restarts the idle time, so a desktop that re-attached
    # every few seconds kept a gone desktop's withheld job from ever being reclaimed).
    s, user = h.substrate, h.user()
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "c1", count=10, block_ms=100)
    for _ in range(3):
        await trio.sleep(0.06)
        assert await s.read_pending(user, "c1", count=10) == [Entry(entry_id, {"a": "1"})]
    claimed = await s.autoclaim(user, "c2", min_idle_ms=150, start="0-0", count=10)
    assert claimed.entries == (Entry(entry_id, {"a": "1"}),)
    assert await s.read_pending(user, "c1", count=10) == []


@check
async def check_autoclaim_reports_and_drops_deleted_entries_whatever_their_idle(
    h: SubstrateHarness,
) -> None:
    s, user = h.substrate, h.user()
    victim = await s.enqueue(user, {"a": "victim"}, maxlen=GROUP_MAXLEN)
    await s.read_new(user, "dead", count=1, block_ms=100)
    await h.fill(user, 250, maxlen=1)
    claimed = await s.autoclaim(user, "alive", min_idle_ms=60_000, start="0-0", count=10)
    assert claimed == Claimed("0-0", (), (victim,))
    assert await s.read_pending(user, "dead", count=10) == []
    again = await s.autoclaim(user, "alive", min_idle_ms=0, start="0-0", count=10)
    assert again == Claimed("0-0", (), ())


@check
async def check_autoclaim_cursor_walks_the_pending_entries_list(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
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


@check
async def check_reads_on_a_missing_group_heal_and_return_nothing(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.read_pending(user, "c1", count=10) == []
    await h.delete_stream(user)
    assert await s.read_new(user, "c1", count=10, block_ms=1) == []
    await h.delete_stream(user)
    assert await s.autoclaim(user, "c1", min_idle_ms=0, start="0-0", count=10) == Claimed(
        "0-0", (), ()
    )
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=10, block_ms=500)] == [entry_id]


async def _stream_deleted_then_next_entry_is_read_exactly_once(
    h: SubstrateHarness, order: str
) -> None:
    s, user = h.substrate, h.user()
    old = await s.enqueue(user, {"a": "old"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await s.read_new(user, "c1", count=10, block_ms=100)] == [old]
    await h.delete_stream(user)  # Redis restarted without persistence
    if order == "read-first":
        assert await s.read_new(user, "c1", count=10, block_ms=1) == []
    new = await s.enqueue(user, {"a": "new"}, maxlen=GROUP_MAXLEN)
    assert await read_all(h, user, "c1") == [Entry(new, {"a": "new"})]
    assert await s.read_pending(user, "c1", count=10) == [Entry(new, {"a": "new"})]
    assert await s.ack(user, new) == 1


@check
async def check_stream_deleted_then_read_then_next_entry_is_read_exactly_once(
    h: SubstrateHarness,
) -> None:
    await _stream_deleted_then_next_entry_is_read_exactly_once(h, "read-first")


@check
async def check_stream_deleted_then_enqueue_then_next_entry_is_read_exactly_once(
    h: SubstrateHarness,
) -> None:
    await _stream_deleted_then_next_entry_is_read_exactly_once(h, "enqueue-first")


@check
async def check_stream_deleted_while_a_reader_blocks(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    got: list[list[Entry]] = []

    async def reader() -> None:
        got.append(await s.read_new(user, "c1", count=10, block_ms=10_000))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await h.wait_blocked("xreadgroup")
            await h.delete_stream(user)
    assert got == [[]]
    entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
    assert [e.entry_id for e in await read_all(h, user, "c1")] == [entry_id]


# -- cancellation --------------------------------------------------------------------------


@check
async def check_cancelled_read_new_leaves_no_waiter_to_steal_the_next_entry(
    h: SubstrateHarness,
) -> None:
    s, user = h.substrate, h.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    for round_ in range(10):
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    await s.read_new(user, "c1", count=10, block_ms=30_000)
                    raise AssertionError("the read was not cancelled")

                nursery.start_soon(reader)
                await h.wait_blocked("xreadgroup")
                nursery.cancel_scope.cancel()
            if h.is_blocked is not None:  # no server-side waiter outlived the cancellation
                assert not await h.is_blocked("xreadgroup")
            entry_id = await s.enqueue(user, {"round": str(round_)}, maxlen=GROUP_MAXLEN)
            got = await s.read_new(user, "c2", count=10, block_ms=1000)
        assert [e.entry_id for e in got] == [entry_id]
        assert await s.read_pending(user, "c1", count=10) == []


@check
async def check_many_cancelled_reads_do_not_exhaust_connections(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.read_new(user, "c1", count=10, block_ms=1)
    for _ in range(80):  # more than coredis' default pool of 64
        with trio.move_on_after(0.005):
            await s.read_new(user, "c1", count=10, block_ms=30_000)
    with trio.fail_after(5):
        entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
        got = await s.read_new(user, "c2", count=10, block_ms=1000)
    assert [e.entry_id for e in got] == [entry_id]


# -- reading at scale: wake-ups and the pipelined heartbeat ---------------------------------


@check
async def check_wakes_are_popped_in_order_and_a_wait_times_out(h: SubstrateHarness) -> None:
    s, holder = h.substrate, f"holder-{h.user()}"
    h.on_user(holder)
    await s.wake(holder, "u1", ttl_s=30)
    await s.wake(holder, "u2", ttl_s=30)
    await s.wake(holder, "u1", ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1, count=2) == ["u1", "u2"]
        assert await s.wait_wakes(holder, timeout_s=1, count=10) == ["u1"]
        start = trio.current_time()
        assert await s.wait_wakes(holder, timeout_s=0.15, count=10) == []
        assert trio.current_time() - start >= 0.14


@check
async def check_a_wake_wakes_a_blocked_waiter_and_a_cancelled_wait_pops_nothing(
    h: SubstrateHarness,
) -> None:
    s, holder = h.substrate, f"holder-{h.user()}"
    h.on_user(holder)
    got: list[list[WakeItem]] = []

    async def waiter() -> None:
        got.append(await s.wait_wakes(holder, timeout_s=10, count=10))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await h.wait_blocked("blmpop")
            await s.wake(holder, "u1", ttl_s=30)
        assert got == [["u1"]]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await h.wait_blocked("blmpop")
            nursery.cancel_scope.cancel()
        await s.wake(holder, "u2", ttl_s=30)
        assert await s.wait_wakes(holder, timeout_s=1, count=10) == ["u2"]


@check
async def check_a_supersede_notice_is_popped_in_push_order_with_the_wakes(
    h: SubstrateHarness,
) -> None:
    s, holder = h.substrate, f"holder-{h.user()}"
    h.on_user(holder)
    await s.wake(holder, "u1", ttl_s=30)
    await s.notify_superseded(holder, "u1", "h1.s1", ttl_s=30)
    await s.notify_superseded(holder, "u3", "h1.s3", ttl_s=30, check=True)
    await s.wake(holder, "u2", ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1, count=10) == [
            "u1",
            Superseded("u1", "h1.s1"),
            Superseded("u3", "h1.s3", check=True),
            "u2",
        ]


@check
async def check_a_cancel_notice_is_popped_behind_its_user_s_wake_up(
    h: SubstrateHarness,
) -> None:
    """``notify_cancel`` pushes the user id (a hub of an older version reads the stream)
    and the notice, in that order, in one step."""
    s, holder = h.substrate, f"holder-{h.user()}"
    h.on_user(holder)
    await s.wake(holder, "u1", ttl_s=30)
    await s.notify_cancel(holder, "u2", "job-9", ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1, count=10) == [
            "u1",
            "u2",
            CancelAsked("u2", "job-9"),
        ]


@check
async def check_set_presence_returns_the_session_it_replaced(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.set_presence(user, "h1.s1", 30) is None
    assert await s.set_presence(user, "h2.s2", 30) == "h1.s1"
    assert await s.get_presence(user) == "h2.s2"


@check
async def check_heartbeat_refreshes_presence_only_if_ours_and_keeps_the_catalogue(
    h: SubstrateHarness,
) -> None:
    s, mine, theirs = h.substrate, h.user(), h.user()
    await s.set_presence(theirs, "other", 30)
    beats = [Beat(mine, "s1", '["a"]'), Beat(theirs, "s1", '["b"]')]
    replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
    assert [r.ours for r in replies] == [True, False]
    assert await s.get_presence(mine) == "s1" and await s.get_presence(theirs) == "other"
    assert await s.get_catalogue(mine) == '["a"]' and await s.get_catalogue(theirs) is None
    await s.set_catalogue(mine, '["rival"]')  # a short-lived rival wrote it
    await s.heartbeat(beats[:1], ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
    assert await s.get_catalogue(mine) == '["a"]'
    assert await s.heartbeat([], ttl_s=30, consumer="c1", reclaim_idle_ms=1) == []


@check
async def check_heartbeat_finds_backlog_reclaim_and_trimmed_entries(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    beat = [Beat(user, "s1", "null")]

    async def probe(idle_ms: int = 60_000) -> tuple[bool, bool, bool]:
        (reply,) = await s.heartbeat(beat, ttl_s=30, consumer="c1", reclaim_idle_ms=idle_ms)
        return reply.backlog, reply.reclaim_due, reply.trimmed_due

    assert await probe() == (False, False, False)  # no stream at all
    job = h.job()
    await s.enqueue(user, {"job_id": job}, maxlen=GROUP_MAXLEN)
    assert await probe() == (True, False, False)  # never delivered: a missed wake
    await s.read_new(user, "dead", count=10, block_ms=None)
    assert await probe() == (False, False, False)
    await trio.sleep(0.15)
    assert await probe(idle_ms=100) == (False, True, False)  # pending past the idle
    await h.delete_stream(user)
    assert await probe() == (False, False, True)  # indexed, stream gone


@check
async def check_heartbeat_of_many_users_answers_each_for_its_own_keys(
    h: SubstrateHarness,
) -> None:
    """Hundreds of beats in one call (an implementation may cover many users per
    script and per write) answer each user for its own keys, in the order given."""
    s = h.substrate
    users = [h.user() for _ in range(230)]
    kinds = ["held", "theirs", "absent", "backlog"]
    for n, user in enumerate(users):
        kind = kinds[n % 4] if n % 7 else "backlog"
        if kind != "absent":
            await s.set_presence(user, "other" if kind == "theirs" else f"s{n}", 30)
            await s.set_catalogue(user, "[]")  # as the handshake does (else deep: taken)
        if kind == "backlog":
            await s.enqueue(user, {"job_id": h.job()}, maxlen=GROUP_MAXLEN)
    beats = [Beat(user, f"s{n}", deep=n % 2 == 0) for n, user in enumerate(users)]
    replies = await s.heartbeat(beats, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
    got = [(r.ours, r.backlog, r.taken) for r in replies]
    want = []
    for n in range(len(users)):
        kind = kinds[n % 4] if n % 7 else "backlog"
        want.append((kind != "theirs", kind == "backlog", kind == "absent"))
    assert got == want
    present = [await s.get_presence(user) for user in users[:8]]
    assert present == ["s0", "other", "s2", "s3", "s4", "other", "s6", "s7"]


@check
async def check_heartbeat_writes_the_catalogue_only_when_given_and_says_it_took_presence(
    h: SubstrateHarness,
) -> None:
    s, mine, theirs = h.substrate, h.user(), h.user()
    (first,) = await s.heartbeat([Beat(mine, "s1")], ttl_s=30, consumer="c1", reclaim_idle_ms=1)
    assert (first.ours, first.taken) == (True, True)  # absent: taken, catalogue not given
    assert await s.get_presence(mine) == "s1" and await s.get_catalogue(mine) is None
    (again,) = await s.heartbeat([Beat(mine, "s1")], ttl_s=30, consumer="c1", reclaim_idle_ms=1)
    assert (again.ours, again.taken) == (True, False)
    # a deep beat without a catalogue looks for the stored one: gone (evicted) is taken
    deep = Beat(mine, "s1", deep=True)
    (gone,) = await s.heartbeat([deep], ttl_s=30, consumer="c1", reclaim_idle_ms=1)
    assert (gone.ours, gone.taken) == (True, True)
    await s.heartbeat([Beat(mine, "s1", '["a"]')], ttl_s=30, consumer="c1", reclaim_idle_ms=1)
    assert await s.get_catalogue(mine) == '["a"]'
    (kept,) = await s.heartbeat([deep], ttl_s=30, consumer="c1", reclaim_idle_ms=1)
    assert (kept.ours, kept.taken) == (True, False)
    await s.set_presence(theirs, "other", 0.5)
    (lost,) = await s.heartbeat(
        [Beat(theirs, "s1", '["b"]')], ttl_s=30, consumer="c1", reclaim_idle_ms=1
    )
    assert (lost.ours, lost.taken) == (False, False)
    await trio.sleep(0.6)  # the newer session keeps its value, and at least our TTL
    assert await s.get_presence(theirs) == "other" and await s.get_catalogue(theirs) is None


@check
async def check_deep_heartbeat_finds_an_entry_trimmed_before_it_was_read(
    h: SubstrateHarness,
) -> None:
    s, user = h.substrate, h.user()
    await s.enqueue(user, {"job_id": h.job()}, maxlen=GROUP_MAXLEN)  # indexed
    await h.fill(user, 250, maxlen=1)  # trims it (MAXLEN ~ trims whole nodes)
    while await s.read_new(user, "c1", count=100, block_ms=None):
        pass
    for entry in await s.read_pending(user, "c1", count=300):
        await s.ack(user, entry.entry_id)
    deep = [Beat(user, "s1", deep=True)]
    (reply,) = await s.heartbeat(deep, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
    assert (reply.backlog, reply.reclaim_due, reply.trimmed_due) == (False, False, True)


@check
async def check_heartbeat_prunes_idle_empty_consumers_but_not_this_one(
    h: SubstrateHarness,
) -> None:
    s, user = h.substrate, h.user()
    for _ in range(3):
        await s.enqueue(user, {"job_id": h.job()}, maxlen=GROUP_MAXLEN)
    (first,) = await s.read_new(user, "dead-acked", count=1, block_ms=None)
    await s.ack(user, first.entry_id)
    await s.read_new(user, "dead-pending", count=1, block_ms=None)
    await s.read_new(user, "me", count=1, block_ms=None)
    await s.heartbeat([Beat(user, "s1", "null")], ttl_s=30, consumer="me", reclaim_idle_ms=0)
    # dead-acked is gone: nothing left to prune but the one still owning an entry
    assert await s.prune_consumers(user, idle_ms=0, keep="me") == 0
    if h.raw is not None:
        names = {c[1] for c in await h.raw("XINFO", "CONSUMERS", jobs_key(user), "bridge-workers")}
        assert names == {"dead-pending", "me"}


@check
async def check_read_new_without_block_answers_at_once(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    with trio.fail_after(1):
        assert await s.read_new(user, "c1", count=10, block_ms=None) == []
        entry_id = await s.enqueue(user, {"a": "1"}, maxlen=GROUP_MAXLEN)
        got = await s.read_new(user, "c1", count=10, block_ms=None)
    assert [e.entry_id for e in got] == [entry_id]


# -- push delivery: the caller's step reads for the holder (single Redis) -------------------


def _push_submission(user: str, job: str, holder: str) -> Submission:
    """The Bridge's submission shape (no owner record, no catalogue check), to ``holder``."""
    return attrs.evolve(
        _submission(user, job, sha1=None),
        write_owner=False,
        alive_holder=holder,
        wake_ttl_s=30.0,
        delivered_ttl_s=60.0,
    )


@check
async def check_submit_pushes_the_read_and_marked_entry_to_a_registered_holder(
    h: SubstrateHarness,
) -> None:
    """A holder process whose liveness names its consumer gets the new entry itself on
    its wake list: already in that consumer's pending entries list, marked delivered
    under the presence's session and the desktop its consumer serves (the daemon
    record), claim epoch 1; nothing is left for a read."""
    s, user, job = h.substrate, h.user(), h.job()
    holder, consumer = f"h{secrets.token_hex(4)}", f"c-{secrets.token_hex(4)}"
    h.on_user(holder)
    await s.set_liveness(holder, 30, consumer=consumer)
    await s.set_presence(user, f"{holder}.s1", 30)
    await s.take_over(
        user, consumer, daemon_id="d7", session_id=f"{holder}.s1", count=10, record_ttl_s=60
    )
    got = await s.submit(user, _push_submission(user, job, holder))
    assert (got.verdict, got.pushed) == ("queued", True)
    with trio.fail_after(3):
        (item,) = await s.wait_wakes(holder, timeout_s=1.0, count=10)
    assert isinstance(item, Pushed) and item.user_id == user
    entry = item.entry
    assert entry.entry_id == got.entry_id and entry.fields is not None
    assert (entry.fields["job_id"], entry.fields["name"]) == (job, "echo")
    assert float(entry.fields["deadline"]) > 0
    assert entry.marked is not None
    assert (entry.marked.verdict, entry.marked.epoch) == ("delivered", 1)
    assert abs(entry.marked.server_time - float(entry.fields["enqueued_at"])) < 5
    state = await s.get_job_state(user, job)
    assert state is not None
    assert (state.stage, state.session_id, state.user_id) == (Stage.DELIVERED, f"{holder}.s1", user)
    assert state.daemon_id == "d7"
    pending = await s.read_pending(user, consumer, count=10)
    assert [e.entry_id for e in pending] == [got.entry_id]
    assert await s.read_new(user, "another", count=10, block_ms=None) == []
    # the epoch it carries is the newest: the finishing step accepts it
    done = JobState(Stage.FINISHED, user)
    finished = await s.finish(user, job, '{"status":"completed"}', done, ttl_s=60, epoch=1)
    assert finished.verdict != "stale"


@check
async def check_submit_pushes_only_to_a_registered_holder_without_a_backlog(
    h: SubstrateHarness,
) -> None:
    """No consumer registered (liveness ``1``), no ``delivered_ttl_s``, an older entry
    still undelivered (the holder left it for want of room), or as many entries pending
    as the holder's sessions take at once: the wake list gets the user id, and the new
    entry stays unread."""
    s, user = h.substrate, h.user()
    holder, consumer = f"h{secrets.token_hex(4)}", f"c-{secrets.token_hex(4)}"
    h.on_user(holder)
    await s.set_presence(user, f"{holder}.s1", 30)
    await s.set_liveness(holder, 30)  # an older hub: no consumer named
    got = await s.submit(user, _push_submission(user, h.job(), holder))
    assert (got.verdict, got.pushed) == ("queued", False)
    # a backlog: the entry above is still undelivered
    await s.set_liveness(holder, 30, consumer=consumer)
    got = await s.submit(user, _push_submission(user, h.job(), holder))
    assert (got.verdict, got.pushed) == ("queued", False)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1.0, count=10) == [user, user]
    assert await s.read_pending(user, consumer, count=10) == []
    read = await s.read_new(user, consumer, count=10, block_ms=None)
    assert len(read) == 2
    # nothing undelivered now, but the caller asked for no push
    sub = attrs.evolve(_push_submission(user, h.job(), holder), delivered_ttl_s=None)
    got = await s.submit(user, sub)
    assert (got.verdict, got.pushed) == ("queued", False)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1.0, count=10) == [user]
    # the session is full: as many entries pending as it takes at once
    await s.read_new(user, consumer, count=10, block_ms=None)  # 3 pending now
    await s.set_liveness(holder, 30, consumer=consumer, max_pending=3)
    got = await s.submit(user, _push_submission(user, h.job(), holder))
    assert (got.verdict, got.pushed) == ("queued", False)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1.0, count=10) == [user]


@check
async def check_submit_pushes_while_the_group_has_fewer_pending_than_the_holder_takes(
    h: SubstrateHarness,
) -> None:
    s, user = h.substrate, h.user()
    holder, consumer = f"h{secrets.token_hex(4)}", f"c-{secrets.token_hex(4)}"
    h.on_user(holder)
    await s.set_presence(user, f"{holder}.s1", 30)
    await s.set_liveness(holder, 30, consumer=consumer, max_pending=2)
    pushed = []
    for _ in range(3):
        pushed.append((await s.submit(user, _push_submission(user, h.job(), holder))).pushed)
    assert pushed == [True, True, False]  # the third found 2 pending: the session is full
    with trio.fail_after(3):
        woken = await s.wait_wakes(holder, timeout_s=1.0, count=10)
    assert [isinstance(w, Pushed) for w in woken] == [True, True, False] and woken[2] == user
    assert len(await s.read_pending(user, consumer, count=10)) == 2


@check
async def check_submit_to_a_holder_whose_liveness_is_gone_writes_nothing(
    h: SubstrateHarness,
) -> None:
    """The caller trusts a process it saw alive, but its liveness key is gone (the
    process died): the step answers ``holder`` and writes nothing, so the caller checks
    that process and answers offline; found alive, the reply says so."""
    s, user = h.substrate, h.user()
    holder = f"h{secrets.token_hex(4)}"
    h.on_user(holder)
    await s.set_presence(user, f"{holder}.s1", 30)
    job = h.job()
    got = await s.submit(user, _push_submission(user, job, holder))
    assert (got.verdict, got.presence) == ("holder", f"{holder}.s1")
    assert await s.get_job_state(user, job) is None
    assert (await s.queue_info(user)).length == 0
    await s.set_liveness(holder, 30)
    got = await s.submit(user, _push_submission(user, job, holder))
    assert (got.verdict, got.holder_alive) == ("queued", True)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1.0, count=10) == [user]
