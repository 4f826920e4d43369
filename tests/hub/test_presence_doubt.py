"""A beat that finds presence held by another session checks that session before the
session hands over (``_presence_doubt``, the reader's ``CHECK`` step): the store may have
lost its last writes (a replica promoted without them, an older snapshot restored) and
named the desktop's previous session again; handing over then stopped a connected
desktop for good (its sidecar exits 3 on 4001). Scripted substrate, MockClock."""

from __future__ import annotations

import logging

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._reader import CHECK, DOUBT_ASKS
from deskbridge_hub._substrate_values import BeatReply

from .reader_kit import READER_LOG, Desk, Script, lines, make_reader
from .test_reader_exact import attached


async def _check(script: Script, holder: str | None, desk: Desk | None = None):
    reader = make_reader(script)
    desk = desk or Desk()
    attached(reader, desk)
    if holder is not None:
        script.presence["u1"] = holder
    desk.listener.checking = True
    await reader._pump(desk.listener, {CHECK})
    assert not desk.listener.checking
    return reader, desk


async def test_a_holder_whose_process_is_gone_is_cleared_and_the_session_beats_now(
    autojump_clock, caplog
):
    script = Script()
    script.queue("holder_alive", False)
    with caplog.at_level(logging.WARNING, logger=READER_LOG):
        reader, desk = await _check(script, "h9.old")
    assert script.names() == ["get_presence", "holder_alive", "clear_presence"]
    assert script.of("clear_presence") == [(("u1", "h9.old"), {})]
    assert desk.listener.doubt == 0 and desk.events == []
    assert reader._beat_now.is_set() and desk.listener.due_s == 0.0
    assert lines(caplog) == [
        "presence of u1 named session h9.old, but its process is gone (the store lost its "
        "last writes: a replica promoted without them, an older snapshot restored?): "
        "cleared, so the desktop's current session takes it back"
    ]


async def test_a_session_that_ended_in_this_process_is_cleared(autojump_clock):
    script = Script()
    reader = make_reader(script)
    gone = Desk("u1", "h1.gone")
    attached(reader, gone)
    reader.detach(gone.listener)  # it ended here
    desk = Desk()
    attached(reader, desk)
    script.presence["u1"] = "h1.gone"
    await reader._pump(desk.listener, {CHECK})
    assert script.names() == ["get_presence", "clear_presence"]  # no liveness asked
    assert desk.listener.doubt == 0 and reader._beat_now.is_set()


async def test_a_session_of_this_process_not_attached_yet_is_real(autojump_clock):
    """Between its presence write and its attach (its welcome being sent) a newer
    session of this process is held by nobody: it must not be cleared."""
    script = Script()
    reader, desk = await _check(script, "h1.starting")
    assert script.names() == ["get_presence"]
    assert desk.listener.doubt == DOUBT_ASKS


async def test_a_session_this_process_holds_is_real(autojump_clock):
    script = Script()
    reader = make_reader(script)
    old, new = Desk("u1", "h1.old"), Desk("u2", "h1.new")
    attached(reader, old, new)
    script.presence["u1"] = "h1.new"
    await reader._pump(old.listener, {CHECK})
    assert script.names() == ["get_presence"]
    assert old.listener.doubt == DOUBT_ASKS and reader._beat_now.is_set()


async def test_a_holder_on_a_live_process_is_asked_and_the_next_beat_decides(autojump_clock):
    script = Script()
    reader, desk = await _check(script, "h9.s9")
    assert script.names() == ["get_presence", "holder_alive", "notify_superseded"]
    assert script.of("notify_superseded") == [
        (("h9", "u1", "h9.s9"), {"ttl_s": 90.0, "check": True})
    ]
    assert desk.listener.doubt == 1 and not reader._beat_now.is_set()


async def test_presence_absent_or_ours_again_ends_the_doubt(autojump_clock):
    for holder in (None, "h1.u1"):
        script = Script()
        reader, desk = await _check(script, holder)
        assert script.names() == ["get_presence"]
        assert desk.listener.doubt == 0 and reader._beat_now.is_set()


async def test_a_holder_without_a_process_is_real(autojump_clock):
    script = Script()
    reader, desk = await _check(script, "nodot")
    assert script.names() == ["get_presence"] and desk.listener.doubt == DOUBT_ASKS


async def test_a_check_notice_clears_a_session_that_ended_in_this_process(autojump_clock):
    script = Script()
    reader = make_reader(script)
    old, desk = Desk("u1", "h1.old"), Desk("u2")
    attached(reader, old, desk)
    reader.detach(old.listener)
    script.presence["u1"] = "h1.old"
    await reader._clear_ended("u2", "h1.u2")  # held: kept
    await reader._clear_ended("u1", "h1.never")  # not known to have ended: kept
    assert script.names() == []
    await reader._clear_ended("u1", "h1.old")
    assert script.of("clear_presence") == [(("u1", "h1.old"), {})]
    assert "u1" not in script.presence


async def test_a_wake_up_for_a_user_held_here_no_more_clears_its_ended_session(
    autojump_clock, caplog
):
    """A store that lost its last writes names a session that ended here: callers were
    pushed jobs no desktop received and told "delivered, may be running" until that
    presence expired. The wake-up their submits send clears it."""
    script = Script()
    reader = make_reader(script)
    old = Desk("u1", "h1.old")
    attached(reader, old)
    reader.detach(old.listener)
    script.presence["u1"] = "h1.old"
    script.queue("wait_wakes", ["u1"])
    with caplog.at_level(logging.WARNING, logger=READER_LOG):
        with trio.move_on_after(0.5):
            await reader._wake_loop()
    assert script.of("clear_presence") == [(("u1", "h1.old"), {})]
    assert lines(caplog) == [
        "presence of u1 named session h1.old, but it ended in this process (the store "
        "lost its last writes: a replica promoted without them, an older snapshot "
        "restored?): cleared, so the desktop's current session takes it back"
    ]


async def test_a_session_hands_over_after_its_holder_stayed_possibly_real_for_the_asks(
    autojump_clock,
):
    """A live process that holds the session never clears it: after ``DOUBT_ASKS``
    checks (a beat apart) the session hands over, as it did before the check. A dead
    holder's liveness key lapses within those (3 s), a live one answers within its wait."""
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    attached(reader, desk)
    script.presence["u1"] = "h9.newer"
    for n in range(1, DOUBT_ASKS + 1):
        reader._answered([desk.listener], [desk.listener.beat(full=False)], [0],
                         [BeatReply(ours=False)])  # fmt: skip
        assert desk.events == [] and reader._due == {"u1": {CHECK}}, n
        reader._due.clear()
        reader._queue.clear()
        await reader._pump(desk.listener, {CHECK})
        assert desk.listener.doubt == n
    beat = desk.listener.beat(full=False)
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=False)])
    assert desk.events == [("superseded",)]
    assert len(script.of("notify_superseded")) == DOUBT_ASKS


async def test_a_check_that_fails_is_due_again_at_the_next_beat(autojump_clock):
    script = Script()
    reader = make_reader(script)
    desk = Desk()
    attached(reader, desk)
    script.queue("get_presence", SubstrateUnavailable("down"))
    beat = desk.listener.beat(full=False)
    reader._answered([desk.listener], [beat], [0], [BeatReply(ours=False)])
    with pytest.raises(SubstrateUnavailable):
        await reader._pump(desk.listener, {CHECK})
    assert not desk.listener.checking and desk.listener.doubt == 0


async def test_a_process_remembers_a_bounded_number_of_ended_sessions(autojump_clock):
    from deskbridge_hub._reader import ENDED_REMEMBERED

    reader = make_reader(Script())
    assert ENDED_REMEMBERED == 4096
    desks = [Desk(f"u{n}", f"h1.s{n}") for n in range(ENDED_REMEMBERED + 1)]
    attached(reader, *desks)
    for desk in desks:
        reader.detach(desk.listener)
    assert len(reader._ended) == ENDED_REMEMBERED
    assert not reader._ended_here("h1.s0")  # the oldest is forgotten
    assert reader._ended_here("h1.s1") and reader._ended_here(f"h1.s{ENDED_REMEMBERED}")
    again = Desk("u1", "h1.s1")  # held again (a session id is never reused; defensive)
    attached(reader, again)
    assert not reader._ended_here("h1.s1")
    reader.stop_beating(again.listener)
    assert reader._held("h1.s1") and not reader._ended_here("h1.s1")  # still attached
