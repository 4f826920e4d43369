"""The scrape-time gauges of ``GET /metrics`` (``_metrics.refresh``) take a bounded time
whatever the number of users connected to the process, and whatever Redis does.

Found by the overload bench (``bench/overload.py``): the refresh read each connected
user's queue one after the other (two round trips each), so a scrape of a process holding
3,100 desktops took 6 s idle and over 30 s with the process overloaded: the one view of
the overload (the loop-lag histogram) was out of reach while it lasted, and a Prometheus
scrape (10 s timeout by default) failed at about 5,000 desktops on an idle machine.
"""

from __future__ import annotations

import attrs
import trio
from deskbridge_hub import _metrics
from deskbridge_hub._inspection import QueueInfo
from prometheus_client import REGISTRY

#: One Redis round trip of the fake, seconds (loopback under load: ~1-2 ms each).
ROUND_TRIP_S = 0.002


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@attrs.define
class Session:
    user_id: str


@attrs.define
class Drain:
    active: bool = False


@attrs.define(eq=False)
class SlowQueues:
    """``queue_info`` answers after two round trips (XLEN, XPENDING); ``hang`` never."""

    hang: bool = False
    calls: int = 0

    async def queue_info(self, user_id: str, *, count: int = 0) -> QueueInfo:
        self.calls += 1
        await trio.sleep(float("inf") if self.hang else 2 * ROUND_TRIP_S)
        return QueueInfo(length=3, pending_count=1)


@attrs.define
class State:
    substrate: SlowQueues
    sessions: dict[int, Session]
    drain: Drain = attrs.field(factory=Drain)


def state_with(users: int, substrate: SlowQueues) -> State:
    return State(substrate, {i: Session(f"u{i}") for i in range(users)})


async def test_a_scrape_of_ten_thousand_users_reads_their_queues_at_once(autojump_clock):
    state = state_with(10_000, SlowQueues())
    t0 = trio.current_time()
    with trio.fail_after(1.0):  # one after the other: 10,000 x 4 ms = 40 s
        await _metrics.refresh(state)  # type: ignore[arg-type]
    assert trio.current_time() - t0 <= 1.0
    assert state.substrate.calls == 10_000
    assert sample("deskbridge_connected_users") == 10_000
    assert sample("deskbridge_queue_entries") == 30_000
    assert sample("deskbridge_pending_entries") == 10_000


async def test_a_refresh_redis_does_not_answer_keeps_the_last_figures_and_answers(autojump_clock):
    await _metrics.refresh(state_with(2, SlowQueues()))  # type: ignore[arg-type]
    assert sample("deskbridge_queue_entries") == 6
    t0 = trio.current_time()
    with trio.fail_after(_metrics.REFRESH_BUDGET_S + 1):
        await _metrics.refresh(state_with(5, SlowQueues(hang=True)))  # type: ignore[arg-type]
    assert trio.current_time() - t0 <= _metrics.REFRESH_BUDGET_S + 0.01
    assert sample("deskbridge_connected_users") == 5  # known without Redis
    assert sample("deskbridge_queue_entries") == 6  # the last complete figures
    assert sample("deskbridge_pending_entries") == 2
