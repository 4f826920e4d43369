"""The process reader's heartbeat (issue 10: idle desktops cost almost nothing), on
MemorySubstrate, memory sockets and MockClock (autojump): each session is beaten every
``heartbeat_s`` from its own handshake (spread, not one burst), idle beats carry no
catalogue, presence or a catalogue the store lost comes back at once, a missed wake-up
is found within one heartbeat, and beats look at the entry index after reads."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_common import Ping, Pong, decode_frame
from deskbridge_hub import Bridge
from deskbridge_hub._beats import DEEP_EVERY
from deskbridge_hub._substrate import presence_key, tools_key

from .test_session import answer_jobs, connect, enqueue, make_state, wall


def spy_beats(state):
    """Record every heartbeat call: (trio time, [(user, catalogue given, deep)])."""
    calls = []
    real = state.substrate.heartbeat

    async def heartbeat(beats, **kw):
        calls.append(
            (trio.current_time(), [(b.user_id, b.catalogue is not None, b.deep) for b in beats])
        )
        return await real(beats, **kw)

    state.substrate.heartbeat = heartbeat
    return calls


class FailingBeats:
    """The substrate's heartbeat, wrapped: records each call as (trio time, beats) and
    raises (a fault that is no outage) while ``failing(beats)`` says so."""

    def __init__(self, state, failing) -> None:
        self.real, self.failing = state.substrate.heartbeat, failing
        self.calls: list[tuple[float, list]] = []
        state.substrate.heartbeat = self.heartbeat

    async def heartbeat(self, beats, **kw):
        self.calls.append((trio.current_time(), list(beats)))
        if self.failing(beats):
            raise RuntimeError("a fault that persists")
        return await self.real(beats, **kw)

    def times(self, user: str) -> list[float]:
        """When ``user`` was in a call."""
        return [t for t, beats in self.calls if any(b.user_id == user for b in beats)]


async def pong_only(peer):
    async for raw in peer._inbox:
        frame = decode_frame(raw)
        if isinstance(frame, Ping):
            await peer.send(Pong(frame.nonce))


async def test_each_session_is_beaten_every_heartbeat_from_its_handshake(autojump_clock):
    state = make_state()  # heartbeat 30 s, presence TTL 90 s
    calls = spy_beats(state)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        peer1, _ = await connect(nursery, state, "u1")
        nursery.start_soon(pong_only, peer1)
        await trio.sleep(12)
        peer2, _ = await connect(nursery, state, "u2")
        nursery.start_soon(pong_only, peer2)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    beaten = {
        user: [round(t - start) for t, beats in calls for u, _, _ in beats if u == user]
        for user in ("u1", "u2")
    }
    # spread: u2's beats follow its own handshake (give or take the 1 s batch window)
    expected = {"u1": [30, 60, 90], "u2": [42, 72, 102]}
    assert all(
        len(beaten[u]) == 3
        and all(abs(a - b) <= 1 for a, b in zip(beaten[u], expected[u], strict=True))
        for u in expected
    ), beaten
    assert len(calls) == 6  # never together
    # idle beats never resend the catalogue (the handshake wrote it)
    assert not any(cat for _, beats in calls for _, cat, _ in beats)


async def test_sessions_spread_over_time_are_beaten_in_one_write_per_batch_window(
    autojump_clock,
):
    """Handshakes every 0.1 s (a population arriving over time): the beats go out at most
    one write per batch window (each at most a window early, never late), not one write
    per couple of sessions (issue 10: 10,000 idle desktops were ~150 writes a second)."""
    state = make_state()  # heartbeat 30 s, batch window 1 s
    calls = spy_beats(state)
    welcomed: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        for i in range(40):
            peer, _ = await connect(nursery, state, f"u{i}")
            welcomed[f"u{i}"] = trio.current_time()
            nursery.start_soon(pong_only, peer)
            await trio.sleep(0.1)
        await trio.sleep(65)
        nursery.cancel_scope.cancel()
    times = [t for t, _ in calls]
    assert all(b - a >= 1.0 for a, b in zip(times, times[1:], strict=False)), times
    assert 6 <= len(calls) <= 12  # 40 sessions over 4 s, twice: ~5 writes each time
    for user, at in welcomed.items():  # every session beaten each heartbeat, on time
        beaten = [t - at for t, beats in calls for u, _, _ in beats if u == user]
        assert len(beaten) == 2 and all(
            0 <= n * 30 - b <= 1.0 for n, b in zip((1, 2), beaten, strict=True)
        ), (user, beaten)


async def test_presence_and_catalogue_lost_by_the_store_come_back_within_a_second(
    autojump_clock,
):
    """Redis restarted empty between two calls of ours (no failure seen): the process's
    liveness key is gone too, so every presence and catalogue is rewritten at once, not
    a heartbeat later."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(pong_only, peer)
        await trio.sleep(5)
        catalogue = await state.substrate.get_catalogue("u1")
        state.substrate._kv.clear()
        lost = trio.current_time()
        while not (await bridge.presence("u1")).online:  # noqa: ASYNC110 - mock clock
            await trio.sleep(0.05)
        assert trio.current_time() - lost <= 1.1
        assert await state.substrate.get_catalogue("u1") == catalogue
        nursery.cancel_scope.cancel()


async def test_a_beat_that_finds_presence_gone_writes_the_catalogue_right_after(autojump_clock):
    """Presence and catalogue deleted (the process's liveness key kept): the next beat
    takes presence back and, told it had been absent, writes the catalogue at once."""
    state = make_state()
    calls = spy_beats(state)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(pong_only, peer)
        await trio.sleep(5)
        del state.substrate._kv[presence_key("u1")]
        del state.substrate._kv[tools_key("u1")]
        await trio.sleep(30)
        assert await state.substrate.get_presence("u1") is not None
        assert await state.substrate.get_catalogue("u1") is not None
        nursery.cancel_scope.cancel()
    assert [cat for _, beats in calls for _, cat, _ in beats] == [False, True]
    assert calls[1][0] - calls[0][0] < 0.1


async def test_an_entry_whose_wake_up_was_lost_is_delivered_at_the_next_beat(autojump_clock):
    state = make_state()
    executed = []
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, executed)
        await trio.sleep(1)
        enqueued = trio.current_time()
        await enqueue(state, "u1", key="k-no-wake")  # no wake-up pushed
        while not executed:  # noqa: ASYNC110 - mock clock
            await trio.sleep(0.5)
        assert trio.current_time() - enqueued <= state.timings.heartbeat_s
        nursery.cancel_scope.cancel()


async def test_beats_look_at_the_entry_index_after_reads_and_every_tenth_beat(autojump_clock):
    state = make_state()
    calls = spy_beats(state)
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [])
        await trio.sleep(95)  # three quiet beats
        await bridge.call("u1", "echo", {}, timeout_s=10)
        await trio.sleep(30 * (DEEP_EVERY + 2))
        nursery.cancel_scope.cancel()
    deep = [d for _, beats in calls for _, _, d in beats]
    assert deep[:3] == [False, False, False]
    assert deep[3] is True  # the beat after the job was read
    assert deep[4:].count(True) == 1 and deep[DEEP_EVERY - 1] is True  # then every tenth


async def test_a_lapsed_liveness_key_with_presence_intact_beats_nobody_early(autojump_clock):
    """The process stalled past the liveness TTL but Redis kept its data: no burst of
    beats (at 10,000 sessions it would only stall a busy process further)."""
    from deskbridge_hub._substrate import proc_key

    state = make_state()
    calls = spy_beats(state)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(pong_only, peer)
        await trio.sleep(5)
        del state.substrate._kv[proc_key(state.holder_id)]
        await trio.sleep(20)
        assert calls == []  # the first beat is due at 30 s
        nursery.cancel_scope.cancel()


async def test_a_beat_the_store_refused_for_one_user_leaves_the_others_and_the_loop(
    autojump_clock, caplog
):
    """A user's keys of the wrong type (``BeatReply.error``) cost that user's beat only:
    its session stays and is beaten again next interval; and a heartbeat that raises
    something other than an outage (a bug) is logged and retried, never the end of the
    process's heartbeat (a WRONGTYPE used to escape the beat loop and stop the reader)."""
    from deskbridge_hub._substrate import BeatReply

    state = make_state()
    real = state.substrate.heartbeat
    calls: list[tuple[float, list[str]]] = []
    faults = {"raise_once": True}

    async def heartbeat(beats, **kw):
        calls.append((trio.current_time(), [b.user_id for b in beats]))
        if len(calls) == 2 and faults.pop("raise_once", False):
            raise RuntimeError("a bug in the beat")
        replies = await real(beats, **kw)
        return [
            BeatReply(False, error="WRONGTYPE") if b.user_id == "bad" else r
            for b, r in zip(beats, replies, strict=True)
        ]

    state.substrate.heartbeat = heartbeat
    async with trio.open_nursery() as nursery:
        for user in ("bad", "good"):
            peer, _ = await connect(nursery, state, user)
            nursery.start_soon(pong_only, peer)
        await trio.sleep(100)
        assert set(state.by_user) == {"bad", "good"}  # both still served
        assert await state.substrate.get_presence("good") is not None
        nursery.cancel_scope.cancel()
    beaten = [users for _, users in calls]
    assert beaten[0] == ["bad", "good"]
    assert beaten[1] == ["bad", "good"]  # raised: retried as a full beat ...
    assert calls[2][0] - calls[1][0] <= 1.01 and beaten[2] == ["bad", "good"]  # ... at once
    assert all(users == ["bad", "good"] for users in beaten[3:]) and len(beaten) >= 4
    assert "a bug in the beat" in caplog.text
    assert "for 1 user(s) (their own keys), e.g. bad (session" in caplog.text


async def test_a_heartbeat_that_keeps_failing_backs_off_and_logs_once(autojump_clock, caplog):
    """A fault that persists (not an outage: a bug, a refusal the store keeps giving)
    must not cost a full beat of every session and a traceback every second: the same
    sessions are retried after 1 s, doubling up to a heartbeat, logged once; after it
    clears, beats go back to one per session per heartbeat."""
    import logging

    caplog.set_level(logging.DEBUG)
    state = make_state()  # heartbeat 30 s
    failing = {"on": True}
    spy = FailingBeats(state, lambda beats: failing["on"])

    def calls() -> list[tuple[float, int, int]]:
        return [(t, len(b), sum(x.catalogue is not None for x in b)) for t, b in spy.calls]

    async with trio.open_nursery() as nursery:
        for user in ("a", "b", "c"):
            peer, _ = await connect(nursery, state, user)
            nursery.start_soon(pong_only, peer)
        await trio.sleep(30 + 90)
        failed = calls()
        failing["on"] = False
        await trio.sleep(65)
        assert await state.substrate.get_presence("a") is not None  # written again
        assert await state.substrate.get_catalogue("a") is not None
        nursery.cancel_scope.cancel()
    # 90 s of failures: retried after 1, 2, 4, 8, 16, 30, 30 ... s (each taken up to the
    # 1 s batch window early), never a catalogue resent
    gaps = [round(b[0] - a[0]) for a, b in zip(failed, failed[1:], strict=False)]
    assert gaps[:5] == [1, 1, 3, 7, 15] and all(g == 29 for g in gaps[5:]), gaps
    assert len(failed) <= 8 and not any(cats for _, _, cats in failed)
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING]
    assert len(tracebacks) == 1
    after = calls()[len(failed) :]
    assert 2 <= len(after) <= 5 and all(n == 3 for _, n, _ in after)  # every session beaten


async def test_a_heartbeat_failing_for_hours_keeps_its_backoff_bounded(autojump_clock):
    """Ten hours of failures (over a thousand in a row): the retry delay stays a
    heartbeat (the doubling is capped before it could overflow a float) and the loop
    beats again as soon as the fault clears."""
    state = make_state()  # heartbeat 30 s
    failing = {"on": True}
    spy = FailingBeats(state, lambda beats: failing["on"])
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state, "a")
        nursery.start_soon(pong_only, peer)
        await trio.sleep(10 * 3600)
        failed = len(spy.calls)
        failing["on"] = False
        await trio.sleep(40)
        assert await state.substrate.get_presence("a") is not None
        nursery.cancel_scope.cancel()
    assert 1100 <= failed <= 1300  # ~one every heartbeat, after the first few
    assert len(spy.calls) > failed


async def test_a_failing_batch_backs_off_while_other_batches_succeed(autojump_clock, caplog):
    """Each session counts its own failures: another batch's success (sessions beaten at
    other times) does not reset the backoff of the one that keeps failing, nor bring its
    traceback back every heartbeat (found by a review)."""
    import logging

    caplog.set_level(logging.DEBUG)
    state = make_state()  # heartbeat 30 s
    spy = FailingBeats(state, lambda beats: any(b.user_id == "bad" for b in beats))
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state, "bad")
        nursery.start_soon(pong_only, peer)
        await trio.sleep(15)
        peer, _ = await connect(nursery, state, "good")
        nursery.start_soon(pong_only, peer)
        await trio.sleep(300)
        assert await state.substrate.get_presence("good") is not None
        nursery.cancel_scope.cancel()
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING]
    assert len(tracebacks) == 1
    bad_calls = spy.times("bad")
    gaps = [round(b - a) for a, b in zip(bad_calls, bad_calls[1:], strict=False)]
    assert gaps[:5] == [1, 1, 3, 7, 15] and all(g >= 29 for g in gaps[5:]), gaps


async def test_a_beat_that_met_an_outage_of_its_node_is_retried_soon_alone(
    autojump_clock, caplog
):
    """On a Cluster, one node down fails only the script calls of its users
    (``BeatReply.unavailable``); the others' answers count (their ``taken`` kept: the
    whole write used to raise, losing them and failing every session of it). The missed
    session is beaten again after 1 s, doubling, alone; the rest keep their interval."""
    from deskbridge_hub._substrate import BeatReply

    state = make_state()  # heartbeat 30 s
    real = state.substrate.heartbeat
    calls: list[tuple[float, list[str]]] = []
    down = {"on": True}

    async def heartbeat(beats, **kw):
        calls.append((trio.current_time(), [b.user_id for b in beats]))
        replies = await real(beats, **kw)
        return [
            BeatReply(False, unavailable="CLUSTERDOWN The cluster is down")
            if down["on"] and b.user_id == "far" else r
            for b, r in zip(beats, replies, strict=True)
        ]  # fmt: skip

    state.substrate.heartbeat = heartbeat
    async with trio.open_nursery() as nursery:
        for user in ("far", "near"):
            peer, _ = await connect(nursery, state, user)
            nursery.start_soon(pong_only, peer)
        start = trio.current_time()
        await trio.sleep(40)
        down["on"] = False
        await trio.sleep(70)
        assert set(state.by_user) == {"far", "near"}
        nursery.cancel_scope.cancel()
    near = [round(t - start) for t, users in calls if "near" in users]
    far = [round(t - start, 1) for t, users in calls if users == ["far"]]
    assert len(near) <= 5  # its interval: not dragged into the far one's retries
    # 1 s, 2 s, 4 s, 8 s after each miss (a beat may go up to 1 s early: the batch window)
    assert far[0] == pytest.approx(31, abs=0.1)
    gaps = [b - a for a, b in zip(far[:3], far[1:4], strict=True)]
    assert gaps == sorted(gaps) and gaps[-1] >= 6, far
    assert "Traceback" not in caplog.text and "failed unexpectedly" not in caplog.text
    # once its node is back, it is beaten on its interval again
    assert all(b - a >= 29 for a, b in zip(far[4:-1], far[5:], strict=True))
