"""The process reader's exact behaviour, part 2 (issue 15: mutation testing of
``_reader``): its loops, on a scripted substrate (``reader_kit.Script``) and MockClock
(autojump). What each loop calls and with what, when, what it does after each error
(back-off, log level and line, retry), and how a recovery is noticed."""

from __future__ import annotations

import logging
from collections import deque

import pytest
import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._errors import SubstrateMisconfigured
from deskbridge_hub._own_liveness import own_liveness
from deskbridge_hub._reader import (
    DAEMON_RECORD_TTL_S,
    DISPATCHED_REMEMBERED,
    DRAIN,
    NEW,
    READ_BATCH,
    TAKEOVER,
    WAKE_BATCH,
    WORKERS,
)
from deskbridge_hub._retry import (
    CLEANUP_TIMEOUT_S,
    HEARTBEAT_RETRY_S,
    PROCESS_LIVENESS_REFRESH_S,
    PROCESS_LIVENESS_RETRY_S,
    PROCESS_LIVENESS_TTL_S,
    READ_ERROR_BACKOFF_S,
)
from deskbridge_hub._substrate_values import Beat, BeatReply, Claimed, Entry, Marked, Pushed

from .reader_kit import (
    READER_LOG,
    Desk,
    Hang,
    Script,
    attached,
    entries,
    levels,
    lines,
    make_reader,
    recorded,
    sample,
)

UNAVAILABLE = "deskbridge_presence_write_failures_total"
OUTAGE_LOG = "deskbridge.hub.outage"


def outage_lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == OUTAGE_LOG]


def boom() -> SubstrateUnavailable:
    return SubstrateUnavailable("boom")


def test_the_retry_constants_the_loops_are_pinned_against():
    assert (PROCESS_LIVENESS_REFRESH_S, PROCESS_LIVENESS_TTL_S, CLEANUP_TIMEOUT_S) == (
        1.0,
        3.0,
        2.0,
    )
    assert (HEARTBEAT_RETRY_S, PROCESS_LIVENESS_RETRY_S) == (1.0, 0.25)
    assert READ_ERROR_BACKOFF_S == (0.1, 0.25, 0.5, 1.0)
    assert (WORKERS, WAKE_BATCH) == (8, 1000)


# -- run ------------------------------------------------------------------------------------


async def test_run_writes_liveness_first_starts_the_workers_and_clears_liveness_at_the_end(
    autojump_clock,
):
    script = Script()
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            assert script.calls[0][1:] == (
                "set_liveness",
                ("h1", 3.0),
                {"consumer": "c1", "max_pending": 32},
            )
            assert script.calls[0][0] == 0.0 and reader.running is True
            await trio.testing.wait_all_tasks_blocked()
            assert reader._idle.statistics().tasks_waiting == WORKERS
            assert script.of("wait_wakes") == [(("h1",), {"timeout_s": 2.0, "count": 1000})]
            await trio.sleep(2.5)
            nursery.cancel_scope.cancel()
    assert reader.running is False
    assert script.calls[-1][1:] == ("clear_liveness", ("h1",), {})
    assert script.done[-1] == "clear_liveness"


async def test_run_starts_after_a_second_when_the_first_liveness_write_hangs(autojump_clock):
    script = Script()
    script.queue("set_liveness", Hang())
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            assert trio.current_time() == PROCESS_LIVENESS_REFRESH_S
            nursery.cancel_scope.cancel()


async def test_run_starts_when_the_first_liveness_write_fails(autojump_clock):
    script = Script()
    script.queue("set_liveness", boom())
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            assert trio.current_time() == 0.0 and reader.running
            nursery.cancel_scope.cancel()


async def test_run_refuses_to_start_on_a_misconfigured_substrate(autojump_clock):
    script = Script()
    script.queue("set_liveness", SubstrateMisconfigured("no database 99"))
    reader = make_reader(script)
    with trio.fail_after(10), pytest.raises(SubstrateMisconfigured):
        await reader.run()
    assert not reader.running and script.names() == ["set_liveness"]


async def test_clearing_liveness_at_the_end_is_shielded_and_bounded(autojump_clock):
    script = Script()
    script.queue("clear_liveness", Hang(0.5))
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            nursery.cancel_scope.cancel()
    assert trio.current_time() == 0.5 and script.done[-1] == "clear_liveness"

    script = Script()
    script.queue("clear_liveness", Hang())
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            start = trio.current_time()
            nursery.cancel_scope.cancel()
    assert trio.current_time() - start == CLEANUP_TIMEOUT_S


async def test_a_failed_liveness_clear_at_the_end_is_ignored(autojump_clock):
    script = Script()
    script.queue("clear_liveness", boom())
    reader = make_reader(script)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            nursery.cancel_scope.cancel()
    assert script.done[-1] == "clear_liveness" and not reader.running


class Timers:
    def __init__(self) -> None:
        self.started = False
        self.cancelled = False

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        self.started = True
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled = True


async def test_the_session_timers_run_before_the_reader_counts_as_started(autojump_clock):
    timers = Timers()
    reader = make_reader(timers=timers)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            assert timers.started and not timers.cancelled
            nursery.cancel_scope.cancel()
    assert timers.cancelled


# -- liveness -------------------------------------------------------------------------------


async def run_loop(loop, seconds):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_liveness_is_refreshed_every_second_and_a_quarter_second_after_a_failure(
    autojump_clock, caplog
):
    script = Script()
    script.queue("set_liveness", True, boom(), True)
    reader = make_reader(script)
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._liveness_loop, 3.5)
    assert script.times("set_liveness") == [0.0, 1.0, 1.25, 2.25, 3.25]
    assert script.of("set_liveness") == [(("h1", 3.0), {"consumer": "c1", "max_pending": 32})] * 5
    assert lines(caplog) == ["liveness refresh failed: boom"]
    assert script.of("get_presence") == []


async def test_a_lapsed_liveness_key_without_sessions_is_only_refreshed(autojump_clock):
    script = Script()
    script.queue("set_liveness", False, False)
    reader = make_reader(script)
    await run_loop(reader._liveness_loop, 1.5)
    assert script.of("get_presence") == [] and not reader._schedule.full


def beating(reader, *desks):
    reader.running = True
    for desk in desks:
        reader.attach(desk.listener)


async def test_a_lapsed_liveness_key_with_presence_gone_beats_every_session_now(
    autojump_clock, caplog
):
    script = Script()
    script.queue("set_liveness", False, True)
    script.presence = {"u1": "h1.u1", "u2": "h1.other"}  # the newest write lost
    reader = make_reader(script)
    beating(reader, Desk("u1"), Desk("u2"))
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._liveness_loop, 1.5)
    assert script.of("get_presence") == [(("u2",), {})]  # one sample: the newest session
    assert reader._schedule.full and reader._beat_now.is_set()
    assert lines(caplog) == [
        "this process's liveness key had lapsed and a presence is gone (Redis lost its data?): "
        "rewriting the presence of 2 sessions now"
    ]
    assert levels(caplog, "rewriting") == [logging.WARNING]


async def test_a_failover_seen_by_the_probe_beats_every_session_now(autojump_clock, caplog):
    """The liveness key survived (replicated), no command failed (Sentinel's CLIENT KILL,
    commands sent again on new connections), but the probe found another replication
    history: presence written last may be gone, every session is beaten at once."""
    script = Script()
    reader = make_reader(script)
    beating(reader, Desk("u1"), Desk("u2"))
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader._liveness_loop)
            await trio.sleep(1.5)
            assert not reader._schedule.full  # nothing happened yet
            script.history = 1
            await trio.sleep(1.1)
            nursery.cancel_scope.cancel()
    assert reader._schedule.full and reader._beat_now.is_set()
    assert script.of("get_presence") == []  # no sample: the probe said it
    assert lines(caplog) == [
        "Redis failed over or restarted: rewriting the presence of 2 sessions now (the "
        "writes it acknowledged last may be lost)"
    ]
    assert levels(caplog, "rewriting") == [logging.WARNING]


async def test_a_failover_seen_by_the_probe_puts_the_held_desktops_presence_in_doubt(
    autojump_clock,
):
    """Until the beats land, an absent presence of a desktop held here is looked at
    again (``_own_liveness``), not answered ``offline`` to this process's own callers;
    a desktop held elsewhere is not this process's to doubt."""
    script = Script()
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._liveness_loop)
        await trio.sleep(1.5)
        assert not own_liveness().in_doubt("u1")
        script.history = 1
        await trio.sleep(1.1)
        assert own_liveness().in_doubt("u1") and not own_liveness().in_doubt("u9")
        nursery.cancel_scope.cancel()


async def test_a_lapsed_liveness_key_with_presence_intact_waits_for_the_beats_due(
    autojump_clock, caplog
):
    script = Script()
    script.queue("set_liveness", False)
    script.presence = {"u1": "h1.other", "u2": "h1.u2"}
    reader = make_reader(script)
    beating(reader, Desk("u1"), Desk("u2"))
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._liveness_loop, 1.5)
    assert script.of("get_presence") == [(("u2",), {})]
    assert not reader._schedule.full and not reader._beat_now.is_set()
    assert lines(caplog) == [
        "this process's liveness key had lapsed; presence intact (Redis was unreachable, "
        "or this process stalled, past the key's 3 s TTL)"
    ]
    assert levels(caplog, "intact") == [logging.INFO]


async def test_presence_that_cannot_be_read_counts_as_gone(autojump_clock):
    script = Script()
    script.queue("set_liveness", False)
    script.queue("get_presence", boom())
    script.presence = {"u1": "h1.u1"}
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    await run_loop(reader._liveness_loop, 0.5)
    assert reader._schedule.full and reader._beat_now.is_set()


async def test_after_an_outage_the_next_refresh_looks_at_one_presence_once(autojump_clock, caplog):
    script = Script()
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    reader._check_presence = True
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._liveness_loop, 2.5)
    assert script.times("get_presence") == [0.0]
    assert not reader._check_presence
    assert lines(caplog) == [
        "this process's outage ended and a presence is gone (Redis lost its data?): "
        "rewriting the presence of 1 sessions now"
    ]


async def test_an_outage_noticed_while_the_refresh_fails_is_checked_after_it(autojump_clock):
    script = Script()
    script.queue("set_liveness", boom())
    script.presence = {"u1": "h1.u1"}
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    reader._check_presence = True
    await run_loop(reader._liveness_loop, 1.5)
    assert script.times("get_presence") == [0.25]


# -- wake-ups -------------------------------------------------------------------------------


async def test_a_wake_up_schedules_a_read_for_each_attached_user_once(autojump_clock):
    script = Script()
    reader = make_reader(script)
    attached(reader, Desk("u1"), Desk("u2"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._wake_loop)
        await trio.testing.wait_all_tasks_blocked()
        await script.wakes_in.send(["u2", "ghost", "u1", "u2"])
        await trio.testing.wait_all_tasks_blocked()
        assert reader._due == {"u2": {NEW}, "u1": {NEW}} and list(reader._queue) == ["u2", "u1"]
        await trio.sleep(2.5)  # a wait that times out (WAKE_BLOCK_S) answers [] and is made again
        nursery.cancel_scope.cancel()
    assert script.of("wait_wakes") == [(("h1",), {"timeout_s": 2.0, "count": WAKE_BATCH})] * 3


async def test_pushed_entries_are_dispatched_in_order_without_a_read(autojump_clock):
    """Entries a caller's step read and marked for this process come with the wake-up:
    the attached user's session gets them as they are (marked), no read is made; one
    for a user whose session is gone here is left pending (the next drain serves it)."""
    script = Script()
    reader = make_reader(script)
    desk = Desk("u1")
    attached(reader, desk, Desk("u2"))
    marked = Marked("delivered", 5.0, 1)
    first, second = Entry("1-0", {"job_id": "a"}, marked), Entry("2-0", {"job_id": "b"}, marked)
    got = recorded(desk)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._wake_loop)
        nursery.start_soon(reader._worker)
        await trio.testing.wait_all_tasks_blocked()
        await script.wakes_in.send([Pushed("u1", first), Pushed("ghost", first), "u2"])
        await script.wakes_in.send([Pushed("u1", second)])
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert got == [first, second]  # as pushed, marks included
    # the one read is the plain wake-up's, for u2
    assert [args[0] for args, _ in script.of("read_new")] == ["u2"]
    assert "read_new_delivered" not in script.names() and "read_pending" not in script.names()
    assert reader._pushed == {} and reader.inflight["u1"] == {"1-0", "2-0"}


async def test_the_wake_up_loop_leaves_a_pushed_entry_to_a_worker_when_it_must_wait(
    autojump_clock,
):
    """Dispatched from the wake-up loop only with room and nothing of the user's
    waiting; else queued for a worker, in order (a full session, a due read)."""
    script = Script()
    reader = make_reader(script)
    full, due = Desk("u1"), Desk("u2")
    full.capacity = 0
    attached(reader, full, due)
    reader._due["u2"] = {NEW}
    marked = Marked("delivered", 5.0, 1)
    one, two = Entry("1-0", {"job_id": "a"}, marked), Entry("2-0", {"job_id": "b"}, marked)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._wake_loop)
        await trio.testing.wait_all_tasks_blocked()
        await script.wakes_in.send([Pushed("u1", one), Pushed("u2", two)])
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert full.dispatched() == [] and due.dispatched() == []
    assert reader._pushed == {"u1": [one], "u2": [two]}
    assert reader._due == {"u1": {"pushed"}, "u2": {NEW, "pushed"}}


async def test_a_pushed_copy_of_an_entry_a_read_dispatched_first_is_not_sent_again(
    autojump_clock,
):
    """A drain (after an outage) can find a pushed entry pending before its wake-up is
    popped: the read serves it, and the copy that arrives later is dropped (its older
    claim epoch would send the job out twice); a read skips a copy still waiting."""
    script = Script()
    reader = make_reader(script)
    desk = Desk("u1")
    beating(reader, desk)
    marked = Marked("delivered", 5.0, 1)
    script.queue("read_pending", entries("1-0"))
    await reader._pump(desk.listener, {DRAIN})
    reader.inflight["u1"].clear()  # served and answered meanwhile
    reader._pushed["u1"] = [Entry("1-0", {"job_id": "job-1-0"}, marked)]
    await reader._pump(desk.listener, {"pushed"})
    assert desk.dispatched() == ["1-0"]
    # the other way round: a copy waits, so the drain leaves the entry to it
    reader._pushed["u1"] = [Entry("2-0", {"job_id": "job-2-0"}, marked)]
    script.queue("read_pending", entries("2-0"))
    await reader._pump(desk.listener, {DRAIN})
    assert desk.dispatched() == ["1-0"]
    await reader._pump(desk.listener, {"pushed"})
    assert desk.dispatched() == ["1-0", "2-0"]


async def test_a_failed_wake_up_wait_backs_off_warns_and_is_made_again(autojump_clock, caplog):
    script = Script()
    script.queue("wait_wakes", boom(), boom(), ["u1"])
    reader = make_reader(script)
    attached(reader, Desk("u1"))
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._wake_loop, 1)
    assert script.times("wait_wakes")[:3] == [0.0, 0.1, 0.35]
    assert lines(caplog) == [
        "wake-up wait: boom; retrying in 0.10 s (failure 1)",
        "wake-up wait: boom; retrying in 0.25 s (failure 2)",
        "substrate back after 2 failures",
    ]
    assert levels(caplog, "wake-up wait") == [logging.DEBUG, logging.DEBUG]
    assert outage_lines(caplog) == [
        (logging.WARNING, "Redis unavailable: wake-up wait failed: boom; retrying (each retry "
         "at DEBUG, a summary every 60 s)"),
        (logging.WARNING, "Redis available again after 0.3 s (2 failed attempts; waiting: "
         "wake-up wait)"),
    ]  # fmt: skip
    assert reader._failures == 0 and reader._check_presence is True
    # the failed wait may have popped wake-ups into the void: drained once (_wait_lost)
    assert reader._due == {"u1": {NEW, DRAIN}}


async def test_failures_back_off_to_one_second_and_are_summed_up_once_a_minute(
    autojump_clock, caplog
):
    script = Script()
    script.queue("wait_wakes", *[boom() for _ in range(66)])
    reader = make_reader(script)
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._wake_loop, 70)
    times = script.times("wait_wakes")
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:], strict=False)]
    assert gaps[:6] == [0.1, 0.25, 0.5, 1.0, 1.0, 1.0] and set(gaps[3:66]) == {1.0}
    assert levels(caplog, "wake-up wait") == [logging.DEBUG] * 66
    assert lines(caplog)[30] == "wake-up wait: boom; retrying in 1.00 s (failure 31)"
    outage = outage_lines(caplog)
    # the 67th wait answers [] after its block (WAKE_BLOCK_S): the outage ends
    assert [level for level, _ in outage] == [logging.WARNING] * 3
    assert outage[1][1] == (  # the 64th failure, at 60.85 s
        "Redis still unavailable after 61 s: 64 failed attempts; waiting: wake-up wait; "
        "last error: boom"
    )
    assert outage[2][1].startswith("Redis available again after ")


async def test_a_success_without_failures_before_it_changes_nothing(autojump_clock, caplog):
    reader = make_reader()
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        reader._recovered()
    assert lines(caplog) == [] and reader._check_presence is False


# -- heartbeat ------------------------------------------------------------------------------


async def test_a_beat_goes_a_heartbeat_after_the_handshake_with_the_substrates_settings(
    autojump_clock,
):
    script = Script()
    reader = make_reader(script)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._beat_loop)
        await trio.sleep(45)  # nobody to beat: the loop only looks again
        beating(reader, Desk("u1"))
        reader._beat_now.set()  # a wake-up of the loop with nothing due beats nothing
        await trio.sleep(80)
        nursery.cancel_scope.cancel()
    assert script.times("heartbeat") == [74.0, 104.0]  # due at 75, 105: batch window 1 s
    (beats,), kw = script.of("heartbeat")[0]
    assert beats == [Beat("u1", "h1.u1", None, deep=False)]
    assert kw == {
        "ttl_s": 90.0,
        "consumer": "c1",
        "reclaim_idle_ms": 180_000,
        "prune": True,
        "record_ttl_s": DAEMON_RECORD_TTL_S,  # a deep beat keeps the daemon record
    }


async def test_a_failed_beat_is_counted_retried_in_a_second_with_catalogues_and_logged(
    autojump_clock, caplog
):
    script = Script()
    script.queue("heartbeat", boom(), boom())
    reader = make_reader(script)
    beating(reader, Desk("u1"), Desk("u2"))
    before = sample(UNAVAILABLE, reason="unavailable")
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._beat_loop, 62)
    assert script.times("heartbeat") == [29.0, 30.0, 31.0, 59.0]  # then each on its own grid
    assert sample(UNAVAILABLE, reason="unavailable") == before + 4
    full = [[b.catalogue for b in beats] for (beats,), _ in script.of("heartbeat")]
    assert full[:3] == [[None, None], ["[catalogue of u1]", "[catalogue of u2]"],
                        ["[catalogue of u1]", "[catalogue of u2]"]]  # fmt: skip
    assert lines(caplog)[:2] == [
        "heartbeat of 2 sessions failed: boom",
        "heartbeat of 2 sessions failed: boom",
    ]
    assert levels(caplog, "heartbeat of") == [logging.DEBUG, logging.DEBUG]
    assert "substrate back after 2 failures" in lines(caplog)
    assert outage_lines(caplog) == [
        (logging.WARNING, "Redis unavailable: heartbeat failed: boom; retrying (each retry "
         "at DEBUG, a summary every 60 s)"),
        (logging.WARNING, "Redis available again after 2.0 s (2 failed attempts; waiting: "
         "heartbeat)"),
    ]  # fmt: skip
    assert reader._failures == 0 and reader._check_presence is False  # that beat was full


async def test_a_failed_beat_retries_within_a_short_heartbeat(autojump_clock):
    script = Script()
    script.queue("heartbeat", boom())
    reader = make_reader(script, Timings(heartbeat_s=0.5, presence_ttl_s=1.5))
    beating(reader, Desk("u1"))
    await run_loop(reader._beat_loop, 1.0)
    assert script.times("heartbeat")[:2] == pytest.approx([0.45, 0.95])


async def test_heartbeat_failures_are_debug_lines_and_one_outage(autojump_clock, caplog):
    script = Script()
    script.queue("heartbeat", *[boom() for _ in range(31)])
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    with caplog.at_level(logging.DEBUG, logger=READER_LOG):
        await run_loop(reader._beat_loop, 29 + 31)
    assert levels(caplog, "heartbeat of") == [logging.DEBUG] * 31
    assert [level for level, _ in outage_lines(caplog)] == [logging.WARNING]  # 30 s: no summary
    assert reader._failures == 31


async def test_a_regular_beat_after_other_failures_has_one_presence_looked_at(autojump_clock):
    script = Script()
    reader = make_reader(script)
    beating(reader, Desk("u1"))
    reader._failures = 3
    await run_loop(reader._beat_loop, 29.5)
    assert reader._failures == 0 and reader._check_presence is True


async def test_a_beats_replies_reach_the_sessions(autojump_clock):
    script = Script()
    script.queue("heartbeat", [BeatReply(ours=False)], [BeatReply(ours=True)])
    reader = make_reader(script)
    gone, desk = Desk("u1"), Desk("u2")
    gone.listener.doubt = 5  # its holder was found possibly real: it hands over
    beating(reader, gone)
    await trio.sleep(10)
    beating(reader, desk)
    await run_loop(reader._beat_loop, 45)
    assert gone.events == [("superseded",)] and desk.listener.beats == 1
    assert [len(b) for (b,), _ in script.of("heartbeat")] == [1, 1]


# -- workers --------------------------------------------------------------------------------


async def test_a_read_that_fails_is_retried_with_the_same_kinds_after_the_back_off(
    autojump_clock, caplog
):
    script = Script()
    script.queue("take_over", Claimed("0-0", (), ()), Claimed("0-0", (), ()))
    script.queue("read_pending", boom())
    reader = make_reader(script)
    desk = Desk()
    with caplog.at_level(logging.DEBUG, logger=READER_LOG), trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            await trio.sleep(0.5)
            await script.wakes_in.send([])  # the wake-up wait answers: Redis is back
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert script.names("set_liveness", "wait_wakes", "clear_liveness") == [
        "take_over", "read_pending", "take_over", "read_pending", "autoclaim", "read_new",
    ]  # fmt: skip
    assert script.times("take_over") == [0.0, 0.1]
    assert "read for u1: boom; retrying in 0.10 s (failure 1)" in lines(caplog)
    # the outage names the operation, and its kind (the user's reads) as what waits
    assert outage_lines(caplog) == [
        (logging.WARNING, "Redis unavailable: read for u1 failed: boom; retrying (each retry "
         "at DEBUG, a summary every 60 s)"),
        (logging.WARNING, "Redis available again after 0.5 s (1 failed attempts; waiting: "
         "read)"),
    ]  # fmt: skip
    assert reader._busy == set() and reader._due == {}


async def test_a_new_read_that_fails_drains_own_pending_entries_at_its_retry(autojump_clock):
    """A group read of new entries that fails may have taken entries whose reply was lost
    (a connection cut after Redis ran it; such reads are not sent again): they are pending
    on this consumer and no later read of *new* entries returns them. Its retry drains
    this consumer's pending entries first, so they are served now, not at the reclaim
    idle (180 s: past the caller's deadline)."""
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    script.queue("read_new", boom())  # Redis ran it (1-0 now pending here); reply lost
    script.queue("read_pending", entries("1-0"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            attached(reader, desk)
            reader.schedule("u1", NEW)
            await trio.sleep(1)  # past the back-off
            await script.wakes_in.send([])  # the wake-up wait answers: Redis is back
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    reads = [name for name in script.names() if name.startswith("read_")]
    assert reads == ["read_new", "read_pending", "read_new"]
    assert desk.dispatched() == ["1-0"]


async def test_a_users_fault_is_logged_and_the_workers_read_on(autojump_clock, caplog):
    script = Script()
    script.queue("take_over", RuntimeError("bug"))
    reader = make_reader(script)
    bad, good = Desk("u1"), Desk("u2")
    script.queue("read_pending", [], entries("1-0"))
    with caplog.at_level(logging.INFO, logger=READER_LOG), trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(bad.listener)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(WORKERS + 1):  # more reads than workers: none of them died
                reader.schedule("u1", DRAIN)
                await trio.testing.wait_all_tasks_blocked()
            reader.attach(good.listener)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert "reading for u1 failed; read again when its heartbeat finds a backlog" in lines(
        caplog, logging.ERROR
    )
    assert reader._busy == set() and "u1" not in reader._due
    assert len(script.of("read_pending")) == WORKERS + 1
    assert script.of("take_over")[-1][0] == ("u2", "c1")


async def test_a_user_due_again_while_it_is_read_is_read_again_after(autojump_clock):
    script = Script()
    script.queue("read_pending", entries("1-0"))
    reader = make_reader(script)
    desk = Desk()
    desk.block = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            reader._due["u1"] = {DRAIN}
            await trio.testing.wait_all_tasks_blocked()
            assert reader._busy == {"u1"}
            reader.schedule("u1", NEW)
            assert list(reader._queue) == [] and reader._due == {"u1": {NEW}}
            desk.block.set()
            await trio.testing.wait_all_tasks_blocked()
            assert reader._busy == set() and reader._due == {}
            nursery.cancel_scope.cancel()
    assert script.names("set_liveness", "wait_wakes", "clear_liveness") == [
        "read_pending", "read_new", "read_new",
    ]  # fmt: skip
    assert desk.dispatched() == ["1-0"]
    assert READ_BATCH == 32 and TAKEOVER == "takeover"


async def test_a_worker_skips_a_stopped_session_and_a_user_with_nothing_due(autojump_clock):
    script = Script()
    reader = make_reader(script)
    stopped, idle = Desk("u1"), Desk("u2")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(stopped.listener)
            reader.attach(idle.listener)
            stopped.listener.stopped.set()
            reader._due["u2"] = set()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert script.names("set_liveness", "wait_wakes", "clear_liveness") == []
    assert reader._busy == set()


class Queue(deque):
    """The reader's queue of due users, recording every user appended to it."""

    def __init__(self) -> None:
        super().__init__()
        self.appended: list[str] = []

    def append(self, user_id: str) -> None:
        self.appended.append(user_id)
        super().append(user_id)


async def test_a_user_is_queued_once_per_time_it_becomes_due(autojump_clock):
    script = Script()
    script.queue("take_over", Claimed("0-0", (), ()))
    reader = make_reader(script)
    reader._queue = queue = Queue()
    desk = Desk()
    desk.block = trio.Event()
    script.queue("read_pending", entries("1-0"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            reader.attach(desk.listener)
            await trio.testing.wait_all_tasks_blocked()
            reader.schedule("u1", NEW)  # while it is read: queued again when that ends
            desk.block.set()
            await trio.testing.wait_all_tasks_blocked()
            assert queue.appended == ["u1", "u1"]
            reader.served("u1", answered=True)  # nothing due: not queued
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert queue.appended == ["u1", "u1"] and reader._due == {}


async def test_a_pushed_copy_is_not_sent_again_after_other_users_dispatches(autojump_clock):
    """After an outage every user's drain runs while the wake list still holds the
    pushed copies (the wake-up loop is backing off). A drain serves u1's pushed entry;
    other users' drains dispatch more than ``DISPATCHED_REMEMBERED`` entries before u1's
    copy is popped: the copy (its older claim epoch) must still not be sent again."""
    script = Script()
    reader = make_reader(script)
    desk, other = Desk("u1"), Desk("u2")
    beating(reader, desk)
    beating(reader, other)
    script.queue("read_pending", entries("1-0"))
    await reader._pump(desk.listener, {DRAIN})
    reader.inflight["u1"].clear()  # served and answered meanwhile
    burst = [Entry(f"{n}-0", {"job_id": f"job-{n}"}) for n in range(DISPATCHED_REMEMBERED + 1)]
    await reader._dispatch(other.listener, reader.inflight.setdefault("u2", set()), burst)
    reader._pushed["u1"] = [Entry("1-0", {"job_id": "job-1-0"}, Marked("delivered", 5.0, 1))]
    await reader._pump(desk.listener, {"pushed"})
    assert desk.dispatched() == ["1-0"]
