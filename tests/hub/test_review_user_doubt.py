"""The per-user doubt of ``_own_liveness`` is held only for users with a session beating
here: a beat answered after its session ended (by another path than the beat loop: the
socket closed, a detach) must leave nothing behind, or the dict grows with every such
user for the process's life and that user reads ``unavailable``, not ``offline``."""

from __future__ import annotations

import trio
from deskbridge_hub._own_liveness import own_liveness
from deskbridge_hub._substrate_values import BeatReply

from tests.hub.reader_kit import Desk, Hang, Script, make_reader


async def test_a_beat_answered_after_its_session_ended_leaves_no_doubt(autojump_clock):
    script = Script()
    # the beat in flight finds the presence lapsed and writes it again (taken)
    script.queue("heartbeat", Hang(5.0, [BeatReply(ours=True, taken=True)]))
    reader = make_reader(script)
    desk = Desk("u1")
    reader.running = True
    reader.attach(desk.listener)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader._beat_loop)
        await trio.sleep(31)  # the beat went at 29 s (due at 30, batch window 1 s)
        assert script.times("heartbeat") == [29.0] and "heartbeat" not in script.done
        reader.detach(desk.listener)  # the session ends while its beat is in flight
        await trio.sleep(10)  # the beat's reply comes
        nursery.cancel_scope.cancel()
    assert len(script.of("heartbeat")) == 1
    doubt = own_liveness()
    assert "u1" not in doubt._user_doubt_at and "u1" not in doubt._missed_since
    assert not doubt.in_doubt("u1")  # no session here: an absent presence is offline
