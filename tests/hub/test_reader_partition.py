"""The process reader when this hub process is partitioned from Redis (its connections
black-holed: commands time out, nothing resets), on the scripted substrate of
``reader_kit`` and trio's MockClock. The same faults with real processes:
``tests/chaos/test_redis_partition.py``."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._reader import WAKE_BLOCK_S, WAKE_LATE_S
from deskbridge_hub._substrate_values import Entry, Marked, Pushed

from .reader_kit import TIMINGS, Desk, Hang, Script, attached, make_reader, recorded


def _cut_desk(user: str = "u1") -> Desk:
    desk = Desk(user)
    desk.listener.on_cut_off = lambda: desk.events.append(("cut_off",))
    return desk


async def test_a_process_that_cannot_refresh_its_liveness_ends_its_sessions_after_the_presence_ttl(
    autojump_clock,
):
    script = Script()
    # run's first write and the loop's at 0 s, the loop's at 1 s; then every refresh hangs
    script.queue("set_liveness", True, True, True, Hang())
    reader = make_reader(script)
    desk = _cut_desk()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            await trio.sleep(1.5)  # refreshed at 0 and 1 s; the one at 2 s hangs
            assert reader.cut_off_s == TIMINGS.presence_ttl_s == 90.0
            await trio.sleep(89.0)  # 89.5 s after the last refresh: within the bound
            assert ("cut_off",) not in desk.events
            await trio.sleep(1.0)  # the check at 90 s after it
            assert desk.events.count(("cut_off",)) == 1
            assert desk.listener.stopped.is_set()  # detached: nothing read for it here
            await trio.sleep(10)
            assert desk.events.count(("cut_off",)) == 1  # told once
            nursery.cancel_scope.cancel()


async def _events_over_three_cut_offs(script: Script) -> list[tuple[Any, ...]]:
    """Run the reader with one session attached for three cut-off bounds; its events."""
    reader = make_reader(script)
    desk = _cut_desk()
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            await trio.sleep(3 * reader.cut_off_s)
            nursery.cancel_scope.cancel()
    return desk.events


async def test_a_process_whose_liveness_refreshes_work_keeps_its_sessions(autojump_clock):
    assert ("cut_off",) not in await _events_over_three_cut_offs(Script())


async def test_a_failed_wake_up_wait_drains_every_attached_user_at_the_start_and_end_of_a_streak(
    autojump_clock,
):
    """Redis may have popped wake-ups into a wait whose reply never came (its connection
    black-holed with the BLMPOP in place): a pushed entry popped so is pending on this
    consumer, and only a drain finds it before the reclaim idle (180 s)."""
    script = Script()
    lost = Entry("1-0", {"job_id": "a"})
    script.queue("read_pending", [lost])
    script.queue(
        "wait_wakes",
        SubstrateUnavailable("BLMPOP timed out"),
        SubstrateUnavailable("connect timed out"),
    )
    reader = make_reader(script)
    desk, other = Desk("u1"), Desk("u2")
    attached(reader, desk, other)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader._wake_loop)
            nursery.start_soon(reader._worker)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
    drained = [args[0] for args, _ in script.of("read_pending")]
    assert sorted(drained) == ["u1", "u1", "u2", "u2"]  # as the streak starts, and ends
    assert desk.dispatched() == ["1-0"]


async def test_what_a_later_wait_of_the_streak_popped_is_drained_when_it_ends(autojump_clock):
    """Found by review: the drain ran only as a streak of failed waits began; a later
    wait of the same streak that reached Redis and popped a pushed entry, its reply
    lost, left that entry pending (marked delivered) until the reclaim idle (180 s)."""
    script = Script()
    lost = Entry("1-0", {"job_id": "a"})
    # the first drain (at the first failure) finds nothing: the entry is popped later
    script.queue("read_pending", [], [lost])
    script.queue(
        "wait_wakes",
        SubstrateUnavailable("connect refused"),  # popped nothing
        SubstrateUnavailable("BLMPOP timed out"),  # it popped the entry; its reply was lost
    )
    reader = make_reader(script)
    desk = Desk("u1")
    attached(reader, desk)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader._wake_loop)
            nursery.start_soon(reader._worker)
            await trio.sleep(30)  # far less than the reclaim idle
            nursery.cancel_scope.cancel()
    assert desk.dispatched() == ["1-0"]


async def _popped(script: Script) -> list[Entry]:
    """Run the wake-up loop and a worker; return the entries dispatched to u1."""
    reader = make_reader(script)
    desk = Desk("u1")
    attached(reader, desk)
    got = recorded(desk)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader._wake_loop)
            nursery.start_soon(reader._worker)
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
    return got


async def test_the_wake_up_wait_blocks_for_a_few_seconds_not_a_heartbeat(autojump_clock):
    script = Script()
    await _popped(script)
    blocks = {kw["timeout_s"] for _, kw in script.of("wait_wakes")}
    assert blocks == {WAKE_BLOCK_S} and WAKE_BLOCK_S < TIMINGS.heartbeat_s


MARKED = Marked("delivered", 5.0, 1)


async def test_pushed_entries_popped_after_a_failed_wait_are_marked_again_when_served(
    autojump_clock,
):
    """They may have sat in the wake list all the while no wait was in place: their
    submit-time mark (and the deadline counted from the pop) no longer says how long
    they waited."""
    script = Script()
    old = Entry("1-0", {"job_id": "a"}, MARKED, received_at=0.0)
    fresh = Entry("2-0", {"job_id": "b"}, MARKED, received_at=0.0)
    script.queue(
        "wait_wakes", SubstrateUnavailable("timed out"), [Pushed("u1", old)], [Pushed("u1", fresh)]
    )
    got = await _popped(script)
    assert [e.entry_id for e in got] == ["1-0", "2-0"]
    assert got[0].marked is None and got[0].received_at is None  # served: marked again
    assert got[1] == fresh  # a wait after a working one: as pushed


async def test_pushed_entries_in_a_late_reply_are_marked_again_when_served(autojump_clock):
    script = Script()
    entry = Entry("1-0", {"job_id": "a"}, MARKED, received_at=0.0)
    calls: list[float] = []

    async def wait_wakes(holder_id: str, *, timeout_s: float, count: int) -> list[Any]:
        calls.append(trio.current_time())
        if len(calls) == 1:  # the reply arrives well after the block: late in transit
            await trio.sleep(timeout_s + WAKE_LATE_S + 1.0)
            return [Pushed("u1", entry)]
        await trio.sleep_forever()
        raise AssertionError

    script.wait_wakes = wait_wakes  # type: ignore[method-assign]
    got = await _popped(script)
    assert len(got) == 1 and got[0].entry_id == "1-0"
    assert got[0].marked is None and got[0].received_at is None


async def test_refreshes_that_keep_finding_the_liveness_key_lapsed_end_the_sessions(
    autojump_clock,
):
    """A slow path: every refresh works, but lands after the key lapsed (callers read
    the desktops offline between): counted as no refresh at all."""
    script = Script()
    script.queue("set_liveness", True, True, *[False] * 200)
    reader = make_reader(script)
    desk = _cut_desk()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            await trio.sleep(89.5)  # lapsing since the refresh at 1 s
            assert ("cut_off",) not in desk.events
            await trio.sleep(2.0)
            assert desk.events == [("cut_off",)]
            nursery.cancel_scope.cancel()


async def test_one_refresh_that_finds_the_key_lapsed_changes_nothing(autojump_clock):
    """Redis restarted empty, or the process stalled once: the next refresh keeps it."""
    script = Script()
    script.queue("set_liveness", True, True, *([False] + [True] * 20) * 20)
    assert ("cut_off",) not in await _events_over_three_cut_offs(script)


async def test_a_session_attached_after_the_silence_began_is_cut_only_after_its_own_bound(
    autojump_clock,
):
    """Found by review: the cut-off judged every session by the process's silence, so a
    sidecar that reconnected right after a heal (its handshake wrote presence: Redis
    answered) was cut again while the stuck liveness refresh was still timing out. A
    session's silence counts from its attach at the earliest."""
    script = Script()
    script.queue("set_liveness", True, True, True, Hang())  # silent from 2 s on
    reader = make_reader(script)
    old, new = _cut_desk("u1"), _cut_desk("u2")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(old.listener)
            await trio.sleep(85.0)
            reader.attach(new.listener)  # handshake done: it reached Redis at 85 s
            await trio.sleep(7.0)  # 91 s: the process's bound passed, not the new one's
            assert old.events.count(("cut_off",)) == 1
            assert ("cut_off",) not in new.events
            await trio.sleep(reader.cut_off_s - 7.0 + 2.0)  # its own bound, and the next check
            assert new.events.count(("cut_off",)) == 1  # silent since: cut in its turn
            nursery.cancel_scope.cancel()
