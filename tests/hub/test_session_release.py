"""An ended session is freed at once: nothing in the hub's timer heaps (``_pacer``,
``_beats``) or a reader worker's locals keeps it, its socket and Hypercorn's stream (with any
unfinished message in its buffer) until their next visit. MockClock, memory substrate."""

from __future__ import annotations

import gc
import weakref

import trio
import trio.testing
from deskbridge_common import Hello, Timings, Welcome
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import socket_pair

EPOCH = 1_700_000_000.0


def _wall() -> float:
    return EPOCH + trio.current_time()


async def _ended_sessions_are_released() -> int:
    state = HubState(
        substrate=MemorySubstrate(clock=_wall), timings=Timings(), consumer="hub-1",
        wall_clock=_wall,
    )  # fmt: skip
    refs: list[weakref.ref[object]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        await nursery.start(state.pacer.run)
        for _ in range(20):
            hub_side, peer = socket_pair()
            nursery.start_soon(serve_sidecar, state, hub_side, "churn")
            await peer.send(Hello(protocol_version=1, sidecar_version="t"))
            assert isinstance(await peer.receive(), Welcome)
            await trio.testing.wait_all_tasks_blocked()
            (session,) = state.sessions.values()
            refs.append(weakref.ref(session))
            del session
            await peer.disconnect()  # the peer goes away: the session ends at once
            await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)  # well before any session's next timer (its ping, 30 s on)
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        nursery.cancel_scope.cancel()
    return alive


def test_an_ended_session_is_released_at_once_not_at_its_next_timer():
    """Before: the pacer kept every ended session (and through its socket Hypercorn's
    stream, with any partial message in its buffer) until the session's next planned visit,
    up to ping_interval_s + ping_timeout_s / 2 later: 60 sockets each leaving 1.5 MB of an
    unfinished message took a real hub from 74 MB to 163 MB."""
    alive = trio.run(
        _ended_sessions_are_released, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert alive == 0
