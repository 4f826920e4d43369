"""The drain watcher (``_shutdown.drain_on_sigterm``) stopped from outside, as a bare
``hypercorn -k trio -w 1 ... deskbridge_hub.asgi:app`` (README) stops it on Ctrl-C:
Hypercorn's shutdown cancels the app's tasks. The watcher's nursery turned that into a
group of ``trio.Cancelled``, and quart-trio's background-task wrapper logs any exception
group: "ERROR deskbridge_hub: Exception" and 60 lines of Cancelled tracebacks on every
such stop. MockClock (autojump); no real signal is sent."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState
from deskbridge_hub._shutdown import drain_on_sigterm


async def test_a_cancelled_watcher_raises_a_bare_cancelled_not_a_group(autojump_clock):
    state = HubState(
        substrate=MemorySubstrate(clock=trio.current_time),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=trio.current_time,
    )
    seen: list[BaseException] = []

    async def watcher() -> None:
        try:
            await drain_on_sigterm(state, 1.0, lambda: None)
        except BaseException as exc:
            seen.append(exc)
            raise

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert len(seen) == 1
    assert type(seen[0]) is trio.Cancelled, repr(seen[0])
