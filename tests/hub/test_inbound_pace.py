"""One sidecar cannot make its hub process parse frames as fast as it can send them
(``_inbound``): a session reads its peer's messages within a budget and, past it, stops
reading for a while (TCP backpressure on the peer, nothing dropped). Found by fault
injection: one user's raw client sending ~4,400 bogus ``job_result`` frames a second took
~30 % of a hub core and another user's echo p50 from 88 to 220 ms."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import JobResult
from deskbridge_hub import Bridge
from deskbridge_hub._inbound import BURST, FRAMES_PER_S, InboundBudget

from tests.hub.test_peer_noise import _pong
from tests.hub.test_session import answer_jobs, connect, make_state, wall


def test_the_budget_lets_a_burst_through_then_paces_to_its_rate():
    budget = InboundBudget(frames_per_s=100, burst=5, bytes_per_s=1_000, bytes_burst=10_000)
    assert [budget.charge(0.0, 10) for _ in range(5)] == [0.0] * 5
    assert budget.charge(0.0, 10) == 0.01  # one frame over: 1/100 s
    assert budget.charge(0.01, 10) == 0.01  # refilled one, spent one: still one over
    assert budget.charge(10.0, 10) == 0.0  # refilled to the burst, not past it
    assert budget.charge(10.0, 10_500) == 0.51  # bytes: 510 over at 1,000 a second


async def test_answers_to_the_hubs_deliveries_are_never_paced(autojump_clock):
    """A desktop answering jobs as fast as callers send them (the compare bench's 1x64
    shape: ~1,300 jobs a second through one socket) is not held to the budget: its
    answers are bounded by what the hub sends. Charging every message had paced it to
    FRAMES_PER_S (768 answers took seconds)."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [])
        start = trio.current_time()
        for wave in range(12):  # 64 callers at a time, under the queue's bound
            async with trio.open_nursery() as callers:
                for n in range(64):
                    callers.start_soon(bridge.dispatch, "u1", "echo", {"n": wave * 64 + n})
        assert trio.current_time() - start < 0.5
        nursery.cancel_scope.cancel()


async def test_a_flooding_sidecar_is_read_at_its_budget(autojump_clock):
    state = make_state()
    async with trio.open_nursery() as nursery:
        evil, _ = await connect(nursery, state, "evil")  # a socket buffer of 1,000
        nursery.start_soon(_pong, evil)
        frames = 3 * BURST + 1000
        start = trio.current_time()
        for i in range(frames):  # blocks once the hub stops reading and the buffer is full
            await evil.send(JobResult(f"never-{i}", True, 1))
        took_s = trio.current_time() - start
        # the hub read the burst at once, then FRAMES_PER_S a second; 1,000 in the buffer
        assert took_s >= (frames - BURST - 1000 - 2) / FRAMES_PER_S, took_s
        nursery.cancel_scope.cancel()
