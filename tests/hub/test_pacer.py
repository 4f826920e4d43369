"""The process's one timer task (``_pacer``), on MockClock (autojump): it visits each
paced thing when asked, drops those that answer None, survives one that raises, and
wakes early for a sooner visit; and through it every session of a process is pinged
on time with no timer task of its own."""

from __future__ import annotations

import math

import trio
import trio.testing
from deskbridge_common import Ping, Pong, decode_frame
from deskbridge_hub._pacer import PACE_GRID_S, Pacer

from .test_session import connect, make_state


class Every:
    def __init__(self, period_s: float, times: int, fail_at: int | None = None) -> None:
        self.period_s, self.left, self.fail_at = period_s, times, fail_at
        self.visits: list[float] = []

    def pace(self, now_s: float) -> float | None:
        self.visits.append(now_s)
        if self.fail_at is not None and len(self.visits) == self.fail_at:
            raise RuntimeError("boom")
        self.left -= 1
        return None if self.left == 0 else now_s + self.period_s


async def test_visits_when_asked_drops_the_done_and_survives_a_failure(autojump_clock):
    pacer = Pacer()
    a, b, c = Every(10, 3), Every(4, 100, fail_at=2), Every(1, 2)
    async with trio.open_nursery() as nursery:
        await nursery.start(pacer.run)
        start = trio.current_time()
        pacer.add(a, start + 10)
        pacer.add(b, start + 4)
        await trio.sleep(0.5)
        pacer.add(c, start + 1)  # sooner than anything queued: the task wakes for it
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert [v - start for v in a.visits] == [10, 20, 30]  # then it answered None
    assert [v - start for v in b.visits] == [4, 8]  # raised at its second visit: dropped
    assert [v - start for v in c.visits] == [1, 2]
    assert len(pacer) == 0


async def test_every_session_is_pinged_on_time_by_the_one_timer_task(autojump_clock):
    state = make_state()
    pings: dict[str, list[float]] = {}

    async def answer(user, peer):
        async for raw in peer._inbox:
            frame = decode_frame(raw)
            if isinstance(frame, Ping):
                pings.setdefault(user, []).append(trio.current_time())
                await peer.send(Pong(frame.nonce))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            peer, _ = await connect(nursery, state, f"u{i}")
            nursery.start_soon(answer, f"u{i}", peer)
            await trio.sleep(3)
        await trio.sleep(4.5 * state.timings.ping_interval_s)
        assert len(state.pacer) == 3  # one entry per session, no timer task each
        nursery.cancel_scope.cancel()
    # peers that never ping are pinged after an interval of silence (the first time
    # half a timeout later: a sidecar's own first ping may be on its way)
    interval = state.timings.ping_interval_s
    for times in pings.values():
        assert len(times) >= 4
        assert all(abs(b - a - interval) < 0.01 for a, b in zip(times, times[1:], strict=False))


async def test_a_sooner_visit_replaces_the_later_one_and_each_thing_keeps_one_visit(
    autojump_clock,
):
    pacer = Pacer()
    a = Every(10, 3)
    async with trio.open_nursery() as nursery:
        await nursery.start(pacer.run)
        start = trio.current_time()
        pacer.add(a, start + 10)
        pacer.add(a, start + 20)  # later than the one pending: ignored
        pacer.add(a, start + 2)  # sooner: replaces it
        assert len(pacer) == 1
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    # visited at 2 (the sooner), never at the replaced 10 or 20, then every 10 s
    assert [v - start for v in a.visits] == [2, 12, 22]
    assert len(pacer) == 0


async def test_visits_due_within_one_grid_step_are_made_together_never_early(autojump_clock):
    """At 10,000 desktops the visits fall at hundreds of distinct times a second: the
    pacer wakes on its grid (``PACE_GRID_S``) and makes every visit due by then, at most
    one step late; a visit asked for now is made at once."""
    pacer = Pacer()
    step = PACE_GRID_S
    things = [Every(100, 1) for _ in range(4)]
    now_thing = Every(100, 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pacer.run)
        base = math.ceil(trio.current_time() / step) * step + 10 * step  # a grid point
        for n, thing in enumerate(things):
            pacer.add(thing, base + step * (0.1 + 0.2 * n))  # all within one step
        await trio.sleep_until(base - 0.5 * step)
        pacer.add(now_thing, trio.current_time())  # off the grid, due now
        asked_at = trio.current_time()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    visits = [thing.visits[0] for thing in things]
    assert visits == [base + step] * 4  # together, at the next grid point
    assert now_thing.visits == [asked_at]  # not held for the grid
