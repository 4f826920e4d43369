"""An entry handed to a session whose tasks have ended but whose end has not been
cleaned up yet (its nursery closed, its listener not yet detached: the window between
the session's last task ending and the session's own task resuming).

Found by fault injection (tests/chaos/test_takeover_during_pause.py): a sidecar gave up
a handshake Redis held (``CLIENT PAUSE``) and dialled again; the hub welcomed the
abandoned socket once Redis answered, and its takeover step handed the daemon's running
job to that session as it ended: ``RuntimeError: Nursery is closed to new arrivals``,
logged as an ERROR with its traceback ("reading for ... failed"), the rest of the step
dropped, and a pushed entry marked delivered for it never went back to ``queued``.
Now the session says :class:`SessionGone` (nothing started, its limiter slot given
back, reading stopped) and the reader treats it as a stopped session.
"""

from __future__ import annotations

import logging

import pytest
import trio
from deskbridge_hub._beats import SessionGone
from deskbridge_hub._reader import ProcessReader
from deskbridge_hub._substrate_values import Entry, Pushed

from .reader_kit import READER_LOG, Desk, attached, entries, make_reader
from .test_session import connect, make_state


async def _closed_nursery() -> trio.Nursery:
    async with trio.open_nursery() as nursery:
        pass
    return nursery


async def test_a_session_whose_tasks_ended_takes_nothing_and_says_so(autojump_clock):
    state = make_state()
    async with trio.open_nursery() as nursery:
        await connect(nursery, state)
        await trio.sleep(1)  # the session indexed and its listener attached
        (session,) = state.sessions.values()
        listener = session._listener
        room = session._limiter.available_tokens
        session._nursery = await _closed_nursery()  # its tasks over, its end not yet run
        with pytest.raises(SessionGone):
            await listener.dispatch(Entry("1-0", {"job_id": "j1"}))
        assert session._limiter.available_tokens == room  # the slot given back
        assert listener.stopped.is_set()  # nothing more is read for it
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("pushed", [True, False], ids=["pushed", "read"])
async def test_the_reader_treats_a_gone_session_as_stopped(
    autojump_clock, caplog, monkeypatch, pushed
):
    reader = make_reader()
    desk = Desk()
    attached(reader, desk)
    unmarked: list[Pushed] = []

    async def unmark(self, items: list[Pushed]) -> None:
        unmarked.extend(items)

    monkeypatch.setattr(ProcessReader, "_unmark", unmark)

    async def gone(entry: Entry) -> None:  # what the session does (see above)
        desk.events.append(("dispatch", entry.entry_id))
        desk.listener.stopped.set()
        raise SessionGone("session ended")

    desk.listener.dispatch = gone
    inflight: set[str] = set()
    with caplog.at_level(logging.INFO, logger=READER_LOG):
        await reader._dispatch(desk.listener, inflight, entries("1-0", "2-0"), pushed=pushed)
    assert desk.dispatched() == ["1-0"]  # the second is not offered to a gone session
    assert inflight == set()  # no stale in-flight mark hides either entry
    assert [p.entry.entry_id for p in unmarked] == (["1-0", "2-0"] if pushed else [])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_cancel_notice_for_a_session_whose_tasks_ended_is_left_to_its_end(
    autojump_clock,
):
    """The sibling: the reader's wake-up loop hands a cancel notice to the same session
    (``on_cancel``); it must not raise into that loop (as ``_cut_off_soon`` does not)."""
    state = make_state()
    async with trio.open_nursery() as nursery:
        await connect(nursery, state)
        await trio.sleep(1)
        (session,) = state.sessions.values()
        session._nursery = await _closed_nursery()
        session._listener.on_cancel("j1")  # no RuntimeError
        nursery.cancel_scope.cancel()
