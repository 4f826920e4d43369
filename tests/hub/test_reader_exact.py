"""The process reader's exact behaviour, part 1 (issue 15: mutation testing of
``_reader``): sessions (attach, detach, hand-over), what is due (``schedule``,
``served``), what a heartbeat's replies lead to (``_answered``), and one user's pump
(takeover, drain, reclaim, sweep, new reads) and its dispatch, call by call, on a
scripted substrate (``reader_kit.Script``) and MockClock. The loops are in
``test_reader_loops.py``."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from deskbridge_hub._jobstate import JobState
from deskbridge_hub._reader import (
    ALL,
    CHECK,
    DAEMON_RECORD_TTL_S,
    DOUBT_ASKS,
    DRAIN,
    NEW,
    READ_BATCH,
    RECLAIM,
    RECLAIM_MAX_BATCHES,
    RECORD,
    TAKEOVER,
    TAKEOVER_BATCH,
    TRIMMED,
)
from deskbridge_hub._substrate_values import Beat, BeatReply, Claimed

from .reader_kit import READER_LOG, Desk, Script, attached, entries, lines, make_reader, sample

RECLAIMED = "deskbridge_reclaimed_entries_total"


def test_the_kinds_of_reads_are_five_distinct_names():
    assert ALL == {"takeover", "drain", "new", "reclaim", "trimmed"}
    assert (TAKEOVER, DRAIN, NEW, RECLAIM, TRIMMED) == (
        "takeover", "drain", "new", "reclaim", "trimmed",
    )  # fmt: skip


# -- sessions ------------------------------------------------------------------------------


async def test_attach_refuses_a_reader_that_is_not_running(autojump_clock):
    reader = make_reader()
    with pytest.raises(
        RuntimeError, match=r"^the process reader is not running \(start ProcessReader\.run\)$"
    ):
        reader.attach(Desk().listener)
    assert reader._listeners == {} and reader._beating == {} and not reader._due


async def test_attach_reads_everything_at_once_and_beats_a_heartbeat_later(autojump_clock):
    reader = make_reader()
    reader.running = True
    await trio.sleep(7)
    desk = Desk()
    reader.attach(desk.listener)
    assert reader._listeners == {"u1": desk.listener}
    assert reader._beating == {"h1.u1": desk.listener}
    assert desk.listener.due_s == 37.0 and len(reader._schedule) == 1
    assert reader._due == {"u1": set(ALL)} and list(reader._queue) == ["u1"]


async def test_detach_of_an_older_session_keeps_the_newer_one_reading(autojump_clock):
    reader = make_reader()
    reader.running = True
    old, new = Desk(session="h1.old"), Desk(session="h1.new")
    reader.attach(old.listener)
    reader.attach(new.listener)
    reader.detach(old.listener)
    assert old.listener.stopped.is_set() and not new.listener.stopped.is_set()
    assert reader._listeners == {"u1": new.listener}
    assert reader._beating == {"h1.new": new.listener}
    reader.detach(new.listener)
    assert reader._listeners == {} and reader._beating == {}
    reader.detach(new.listener)  # twice: nothing left to remove, no error
    reader.stop_beating(new.listener)


async def test_stop_beating_keeps_reading_for_the_session(autojump_clock):
    reader = make_reader()
    reader.running = True
    desk = Desk()
    reader.attach(desk.listener)
    reader.stop_beating(desk.listener)
    reader.stop_beating(desk.listener)  # twice: no error
    assert reader._beating == {} and reader._listeners == {"u1": desk.listener}
    assert not desk.listener.stopped.is_set()


def test_schedule_merges_the_kinds_and_queues_a_user_once():
    reader = make_reader()
    reader.schedule("u1", NEW)
    reader.schedule("u1", DRAIN, RECLAIM)
    reader.schedule("u2")
    assert reader._due == {"u1": {NEW, DRAIN, RECLAIM}, "u2": set()}
    assert list(reader._queue) == ["u1", "u2"]


def test_schedule_of_a_busy_user_leaves_it_to_the_worker_serving_it():
    reader = make_reader()
    reader._busy.add("u1")
    reader.schedule("u1", NEW)
    assert reader._due == {"u1": {NEW}} and list(reader._queue) == []


async def test_served_drains_after_an_unanswered_entry_and_reads_when_the_session_was_full(
    autojump_clock,
):
    reader = make_reader()
    reader.served("ghost", answered=True)  # no session, answered: nothing to do
    assert reader._due == {} and list(reader._queue) == []
    reader.served("ghost", answered=False)  # the entry is pending and ours
    assert reader._due == {"ghost": {DRAIN}}

    desk = Desk()
    attached(reader, desk)
    reader.served("u1", answered=True)  # not full: nothing
    assert reader._due == {}
    desk.listener.wants_more = True
    reader.served("u1", answered=True)
    assert reader._due == {"u1": {NEW}} and desk.listener.wants_more is False
    reader._due.clear()
    reader.served("u1", answered=True)  # wants_more was reset
    assert reader._due == {}
    desk.listener.wants_more = True
    reader.served("u1", answered=False)
    assert reader._due == {"u1": {DRAIN, NEW}} and desk.listener.wants_more is False


# -- a heartbeat's replies -------------------------------------------------------------------


async def test_a_reply_naming_another_holder_checks_that_holder_before_handing_over(
    autojump_clock,
):
    """The store may have lost its last writes and named an older session again: the
    first such beat checks the holder (``CHECK``) and beats again a second on, without
    handing over (that stopped a connected desktop for good: its sidecar exits on 4001)."""
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    await trio.sleep(5)
    before = sample("deskbridge_presence_write_failures_total", reason="not_holder")
    beat = desk.listener.beat(full=False)
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=False, backlog=True)])
    assert sample("deskbridge_presence_write_failures_total", reason="not_holder") == before + 1
    assert (CHECK, DOUBT_ASKS) == ("check", 5)
    assert desk.events == [] and desk.listener.checking and desk.listener.doubt == 0
    assert reader._due == {"u1": {CHECK}} and desk.listener.due_s == 6.0
    assert reader._beating == {"h1.u1": desk.listener}
    # a second such beat while the check runs: no second check, beaten again a second on
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=False)])
    assert desk.events == [] and reader._due == {"u1": {CHECK}}
    # a beat that finds presence ours again ends the doubt
    desk.listener.doubt = DOUBT_ASKS - 1
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=True)])
    assert desk.listener.doubt == 0 and desk.events == []


async def test_a_reply_naming_a_holder_found_possibly_real_hands_the_session_over(
    autojump_clock,
):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    desk.listener.doubt = DOUBT_ASKS
    before = sample("deskbridge_presence_write_failures_total", reason="not_holder")
    written = sample("deskbridge_presence_writes_total", kind="refresh")
    beat = desk.listener.beat(full=False)
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=False, backlog=True)])
    assert sample("deskbridge_presence_write_failures_total", reason="not_holder") == before + 1
    assert sample("deskbridge_presence_writes_total", kind="refresh") == written
    assert desk.events == [("superseded",)]
    assert reader._beating == {} and reader._listeners == {"u1": desk.listener}
    assert desk.listener.beats == 0  # not answered: nothing else happens
    assert reader._due == {} and not reader._beat_now.is_set()


async def test_a_handed_over_session_does_not_hold_up_the_replies_after_it(autojump_clock):
    reader = make_reader()
    gone, desk = Desk("u0"), Desk()
    attached(reader, gone, desk)
    gone.listener.doubt = DOUBT_ASKS
    reader._answered(
        [gone.listener, desk.listener],
        [gone.listener.beat(full=False), desk.listener.beat(full=False)],
        [0, 0],
        [BeatReply(ours=False), BeatReply(ours=True, backlog=True)],
    )
    assert gone.events == [("superseded",)] and desk.listener.beats == 1
    assert reader._due == {"u1": {NEW}} and desk.listener.due_s == 60.0


async def test_an_answered_beat_counts_and_comes_again_a_heartbeat_on(autojump_clock):
    reader = make_reader()
    other, desk = Desk("u0"), Desk()
    attached(reader, other, desk)
    desk.listener.reads = 5
    beat = desk.listener.beat(full=False)
    assert beat.deep
    desk.listener.reads = 7  # read meanwhile: the next beat is deep again
    written = sample("deskbridge_presence_writes_total", kind="refresh")
    reader._answered(
        [other.listener, desk.listener],
        [other.listener.beat(full=False), beat],
        [0, 5],
        [BeatReply(ours=True), BeatReply(ours=True)],
    )
    assert sample("deskbridge_presence_writes_total", kind="refresh") == written + 2
    assert desk.listener.beats == 1 and desk.listener.reads_checked == 5
    assert desk.listener.due_s == 60.0 and other.listener.due_s == 60.0
    assert len(reader._schedule) == 4  # each pushed again (the attach's entries are stale)
    assert reader._due == {} and not reader._beat_now.is_set()
    assert desk.events == [] and other.events == []


@pytest.mark.parametrize(
    ("reply", "kinds"),
    [
        (BeatReply(ours=True, backlog=True), {NEW}),
        (BeatReply(ours=True, reclaim_due=True), {RECLAIM}),
        (BeatReply(ours=True, trimmed_due=True), {TRIMMED}),
        (
            BeatReply(ours=True, backlog=True, reclaim_due=True, trimmed_due=True),
            {NEW, RECLAIM, TRIMMED},
        ),
    ],
)
async def test_what_a_beat_finds_waiting_is_read(autojump_clock, reply, kinds):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    reader._answered([desk.listener], [desk.listener.beat(full=False)], [0], [reply])
    assert reader._due == {"u1": kinds} and list(reader._queue) == ["u1"]


async def test_a_beat_that_took_presence_back_beats_again_at_once_with_the_catalogue(
    autojump_clock,
):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    await trio.sleep(29)
    beat = desk.listener.beat(full=False)
    assert beat.catalogue is None
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=True, taken=True)])
    assert desk.listener.catalogue_due and desk.listener.due_s == 29.0
    assert reader._beat_now.is_set()
    assert desk.listener.beat(full=False).catalogue == "[catalogue of u1]"
    # and its daemon is recorded again: the record may have gone with presence
    assert RECORD == "record" and reader._due == {"u1": {RECORD}}


async def test_a_reply_for_a_session_that_stopped_beating_meanwhile_is_not_rescheduled(
    autojump_clock,
):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    beat = desk.listener.beat(full=False)
    reader.stop_beating(desk.listener)
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=True, taken=True, backlog=True)])
    assert desk.listener.beats == 1 and desk.listener.due_s == 30.0
    assert len(reader._schedule) == 1 and not reader._beat_now.is_set()
    assert reader._due == {"u1": {NEW, RECORD}}  # its reads still happen


async def test_fewer_replies_than_beats_is_an_error(autojump_clock):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    with pytest.raises(ValueError):
        reader._answered([desk.listener], [Beat("u1", "h1.u1")], [0], [])


# -- one user's pump ------------------------------------------------------------------------


async def test_a_session_start_records_its_daemon_and_takes_over_its_gone_sockets_entries(
    autojump_clock, caplog
):
    script = Script()
    script.queue("take_over", Claimed("0-0", tuple(entries("1-0", "2-0")), ("3-0",)))
    reader = make_reader(script)
    desk = Desk(daemon_id="d1")
    before = sample(RECLAIMED)
    with caplog.at_level(logging.INFO, logger=READER_LOG):
        await reader._pump(desk.listener, {TAKEOVER})
    assert script.of("take_over") == [
        (("u1", "c1"), {"daemon_id": "d1", "session_id": "h1.u1", "count": TAKEOVER_BATCH,
                        "record_ttl_s": DAEMON_RECORD_TTL_S, "again": False}),
    ]  # fmt: skip
    assert (TAKEOVER_BATCH, DAEMON_RECORD_TTL_S) == (256, 604_800.0)
    assert script.names() == ["take_over"]  # not quiet, but nothing else was due
    assert desk.events == [("dispatch", "1-0"), ("dispatch", "2-0"), ("deleted", ["3-0"])]
    assert reader.inflight == {"u1": {"1-0", "2-0"}} and desk.listener.reads == 2
    assert sample(RECLAIMED) == before + 2
    assert lines(caplog) == [
        "session h1.u1 of u1: took over 3 entries from its daemon's gone sockets"
    ]


async def test_a_record_again_is_the_takeover_step_with_again_and_takes_over_too(
    autojump_clock, caplog
):
    """A running session whose beat wrote lost presence back records its daemon again
    (Redis lost its data: without the record, this process's deliveries to the daemon
    waited the reclaim idle when it died); what the step claims is served as at a start."""
    script = Script()
    script.queue("take_over", Claimed("0-0", tuple(entries("1-0")), ()))
    reader = make_reader(script)
    desk = Desk(daemon_id="d1")
    with caplog.at_level(logging.INFO, logger=READER_LOG):
        await reader._pump(desk.listener, {RECORD})
    assert script.of("take_over") == [
        (("u1", "c1"), {"daemon_id": "d1", "session_id": "h1.u1", "count": TAKEOVER_BATCH,
                        "record_ttl_s": DAEMON_RECORD_TTL_S, "again": True}),
    ]  # fmt: skip
    assert desk.events == [("dispatch", "1-0")]
    # due at a session's start as well: the start's rule (nothing recorded yet)
    await reader._pump(desk.listener, {RECORD, TAKEOVER})
    assert script.of("take_over")[1][1]["again"] is False


@pytest.mark.parametrize(
    ("claimed", "logged", "events"),
    [
        (Claimed("0-0", (), ("3-0",)), "took over 1 entries", [("deleted", ["3-0"])]),
        (Claimed("0-0", tuple(entries("1-0")), ()), "took over 1 entries", [("dispatch", "1-0")]),
        (Claimed("0-0", (), ()), None, []),
    ],
)
async def test_a_takeover_logs_only_what_it_took(autojump_clock, caplog, claimed, logged, events):
    script = Script()
    script.queue("take_over", claimed)
    reader = make_reader(script)
    desk = Desk()
    before = sample(RECLAIMED)
    with caplog.at_level(logging.INFO, logger=READER_LOG):
        await reader._pump(desk.listener, {TAKEOVER})
    assert [line for line in lines(caplog) if "took over" in line] == (
        [f"session h1.u1 of u1: {logged} from its daemon's gone sockets"] if logged else []
    )
    assert desk.events == events
    assert sample(RECLAIMED) == before + len(claimed.entries)
    assert script.of("take_over")[0][1]["daemon_id"] is None


async def test_a_quiet_takeover_is_the_whole_session_start(autojump_clock):
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    await reader._pump(desk.listener, set(ALL))
    assert script.names() == ["take_over"] and desk.events == []


async def test_a_session_start_that_is_not_quiet_drains_reclaims_and_reads_in_that_order(
    autojump_clock,
):
    script = Script()
    script.queue("take_over", Claimed("0-0", tuple(entries("1-0")), ()))
    script.queue("read_pending", entries("1-0", "2-0"))
    script.queue("autoclaim", Claimed("0-0", tuple(entries("3-0")), ("4-0",)))
    script.queue("read_new", entries("5-0"))
    reader = make_reader(script)
    desk = Desk()
    await reader._pump(desk.listener, set(ALL))
    assert script.names() == ["take_over", "read_pending", "autoclaim", "read_new"]
    assert script.of("read_pending") == [(("u1", "c1"), {"count": READ_BATCH})]
    assert script.of("read_new") == [(("u1", "c1"), {"count": 8, "block_ms": None})]
    assert desk.events == [
        ("dispatch", "1-0"),  # taken over; the drain finds it in flight and skips it
        ("dispatch", "2-0"),
        ("dispatch", "3-0"),
        ("deleted", ["4-0"]),
        ("dispatch", "5-0"),
    ]
    assert READ_BATCH == 32


async def test_a_drain_alone_also_reads_new_entries_and_reclaims_nothing(autojump_clock):
    script = Script()
    reader = make_reader(script)
    await reader._pump(Desk().listener, {DRAIN})
    assert script.names() == ["read_pending", "read_new"]


async def test_a_reclaim_alone_reads_nothing_new(autojump_clock):
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    before = sample(RECLAIMED)
    await reader._pump(desk.listener, {RECLAIM})
    assert script.names() == ["autoclaim"]
    assert desk.events == [("deleted", [])]  # answered even when nothing was deleted
    assert sample(RECLAIMED) == before


async def test_a_sweep_alone_hands_the_trimmed_entries_to_the_session(autojump_clock):
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    await reader._pump(desk.listener, {TRIMMED})
    assert script.names() == [] and desk.events == [("deleted", [])]
    desk.events.clear()
    await reader._pump(desk.listener, {TRIMMED, RECLAIM})  # the reclaim's answer covers it
    assert desk.events == [("deleted", [])]


async def test_a_reclaim_pass_follows_the_cursor_to_its_end(autojump_clock):
    script = Script()
    script.queue(
        "autoclaim",
        Claimed("7-0", tuple(entries("1-0")), ("2-0",)),
        Claimed("9-0", (), ("3-0",)),
        Claimed("0-0", tuple(entries("4-0", "5-0")), ()),
    )
    reader = make_reader(script)
    desk = Desk()
    before = sample(RECLAIMED)
    await reader._pump(desk.listener, {RECLAIM})
    assert [kw["start"] for _, kw in script.of("autoclaim")] == ["0-0", "7-0", "9-0"]
    assert script.of("autoclaim")[0] == (
        ("u1", "c1"), {"min_idle_ms": 180_000, "start": "0-0", "count": READ_BATCH},
    )  # fmt: skip
    assert desk.events == [
        ("dispatch", "1-0"), ("dispatch", "4-0"), ("dispatch", "5-0"), ("deleted", ["2-0", "3-0"]),
    ]  # fmt: skip
    assert sample(RECLAIMED) == before + 3


async def test_a_reclaim_pass_also_ends_at_the_cursor_0(autojump_clock):
    script = Script()
    script.queue("autoclaim", Claimed("7-0", (), ()), Claimed("0", (), ()), Claimed("8-0", (), ()))
    reader = make_reader(script)
    await reader._pump(Desk().listener, {RECLAIM})
    assert len(script.of("autoclaim")) == 2


async def test_a_reclaim_pass_is_bounded(autojump_clock):
    script = Script()
    script.queue(
        "autoclaim", *[Claimed(f"{i + 1}-0", (), ()) for i in range(RECLAIM_MAX_BATCHES + 5)]
    )
    reader = make_reader(script)
    await reader._pump(Desk().listener, {RECLAIM})
    assert len(script.of("autoclaim")) == RECLAIM_MAX_BATCHES == 100


async def test_new_entries_are_read_while_reads_come_back_full(autojump_clock):
    script = Script()
    desk = Desk()
    desk.capacity = 100
    script.queue("read_new", entries(*[f"{i}-0" for i in range(32)]), entries("40-0"))
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW})
    assert script.of("read_new") == [(("u1", "c1"), {"count": 32, "block_ms": None})] * 2
    assert len(desk.dispatched()) == 33 and not desk.listener.wants_more


async def test_a_read_that_fills_the_sessions_room_exactly_reads_again(autojump_clock):
    script = Script()
    desk = Desk()
    desk.capacity = 3
    script.queue("read_new", entries("1-0", "2-0", "3-0"), [])
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW})
    assert [kw["count"] for _, kw in script.of("read_new")] == [3, 3]


async def test_a_session_with_room_for_one_entry_reads_one(autojump_clock):
    script = Script()
    desk = Desk()
    desk.capacity = 1
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW})
    assert script.of("read_new") == [(("u1", "c1"), {"count": 1, "block_ms": None})]
    assert desk.listener.wants_more is False


@pytest.mark.parametrize("capacity", [0, -1])
async def test_a_full_session_reads_nothing_and_asks_for_a_read_when_it_has_room(
    autojump_clock, capacity
):
    script = Script()
    desk = Desk()
    desk.capacity = capacity
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW})
    assert script.names() == [] and desk.listener.wants_more is True


async def test_a_stopped_session_reads_nothing_new(autojump_clock):
    script = Script()
    desk = Desk()
    desk.listener.stopped.set()
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW, DRAIN})
    assert script.names() == ["read_pending"] and not desk.listener.wants_more


async def test_a_session_that_marks_deliveries_reads_and_marks_in_one_step(autojump_clock):
    script = Script()
    state = JobState("delivered", user_id="u1", session_id="h1.u1")
    desk = Desk(delivered_state=lambda: state)
    script.queue("read_new_delivered", entries("1-0"))
    reader = make_reader(script)
    await reader._pump(desk.listener, {NEW})
    assert script.of("read_new_delivered") == [
        (("u1", "c1"), {"count": 8, "state": state, "ttl_s": 86_700.0, "session_id": "h1.u1"}),
    ]
    assert script.names() == ["read_new_delivered"] and desk.dispatched() == ["1-0"]


# -- dispatch -------------------------------------------------------------------------------


async def test_dispatch_skips_entries_in_flight_and_stops_for_a_stopped_session(autojump_clock):
    script = Script()
    desk = Desk()
    script.queue("read_pending", entries("1-0", "2-0", "3-0"))
    reader = make_reader(script)
    reader.inflight["u1"] = {"1-0"}
    real = desk.listener.dispatch

    async def dispatch(entry):
        await real(entry)
        if entry.entry_id == "2-0":
            desk.listener.stopped.set()

    desk.listener.dispatch = dispatch
    await reader._pump(desk.listener, {DRAIN})
    assert desk.dispatched() == ["2-0"]
    assert reader.inflight == {"u1": {"1-0", "2-0"}} and desk.listener.reads == 1


async def test_an_entry_whose_dispatch_fails_is_not_left_in_flight(autojump_clock):
    script = Script()
    desk = Desk()
    desk.fail = RuntimeError("no slot")
    script.queue("read_pending", entries("1-0", "2-0"))
    reader = make_reader(script)
    with pytest.raises(RuntimeError, match="no slot"):
        await reader._pump(desk.listener, {DRAIN})
    assert reader.inflight == {"u1": set()} and desk.dispatched() == ["1-0"]


async def test_an_entry_whose_dispatch_is_cancelled_is_not_left_in_flight(autojump_clock):
    script = Script()
    desk = Desk()
    desk.block = trio.Event()
    script.queue("read_pending", entries("1-0"))
    reader = make_reader(script)
    with trio.move_on_after(1):
        await reader._pump(desk.listener, {DRAIN})
    assert reader.inflight == {"u1": set()} and desk.dispatched() == ["1-0"]


def test_the_daemons_handed_entries_are_remembered_up_to_a_bound_per_user():
    """Found by review: 1,024 per user over 10,000 users was up to ~10 M entries a
    process; the bound is HANDED_PER_USER (128), oldest forgotten first."""
    from deskbridge_hub._reader import HANDED_PER_USER

    reader = make_reader()
    desk = Desk(daemon_id="d1")
    for n in range(HANDED_PER_USER + 1):
        reader._note_handed(desk.listener, f"{n}-0")
    handed = reader._handed_to["u1"]
    assert HANDED_PER_USER == 128
    assert len(handed) == HANDED_PER_USER
    assert "0-0" not in handed and f"{HANDED_PER_USER}-0" in handed
    assert set(handed.values()) == {"d1"}


async def test_an_answered_entry_is_forgotten_by_the_record_of_handed_entries(autojump_clock):
    """Which daemon each entry went to was pruned only by the bound, not when the entry
    was answered (XACKed): a stale record of another daemon then made a session of this
    daemon whose beat wrote lost presence back skip recording its daemon again
    (``again`` False), so its deliveries here waited the reclaim idle if this process
    died."""
    script = Script()
    script.queue("read_pending", entries("1-0", "2-0"))
    reader = make_reader(script)
    other = Desk(daemon_id="d2")
    await reader._pump(other.listener, {DRAIN})
    assert other.dispatched() == ["1-0", "2-0"]
    reader.inflight["u1"].clear()
    reader.served("u1", answered=True, entry_id="1-0")
    reader.served("u1", answered=False, entry_id="2-0")  # still pending: remembered
    assert reader._handed_to["u1"] == {"2-0": "d2"}
    reader.served("u1", answered=True, entry_id="2-0")
    assert reader._handed_to["u1"] == {}
    reader.served("u9", answered=True, entry_id="1-0")  # nothing remembered: no error
    desk = Desk(daemon_id="d1")
    await reader._pump(desk.listener, {RECORD})
    assert script.of("take_over")[0][1]["again"] is True
