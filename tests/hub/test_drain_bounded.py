"""A graceful shutdown ends within the time it promises, whatever the clients do: the
grace, then at most ``ANSWER_WAIT_S`` for released calls' answers, then at most
``close_timeout_s`` for the sockets' close frames. A socket's write can block past every
cancel scope (Hypercorn writes shielded: a sidecar that stopped reading, its TCP window
shut, holds the close frame's write for as long as it stays connected), so the process
exits when that bound passes even if the drain is stuck. MockClock (autojump); the
signal is raised in-process and caught by the watcher's receiver."""

from __future__ import annotations

import signal

import pytest
import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState
from deskbridge_hub._shutdown import ANSWER_WAIT_S, OVERDUE_MARGIN_S, drain_on_sigterm


class StuckSocketSession:
    """A session whose close frame's write never ends, even when cancelled (shielded),
    until ``unstick`` is set."""

    def __init__(self) -> None:
        self.unstick = trio.Event()

    def stop_reading(self) -> None:
        pass

    async def wait_idle(self) -> None:
        pass

    async def close(self, code: int, reason: str) -> None:
        with trio.CancelScope(shield=True):
            await self.unstick.wait()


async def test_a_drain_stuck_on_a_socket_exits_when_its_bound_passes(autojump_clock):
    timings = Timings()
    state = HubState(
        substrate=MemorySubstrate(clock=trio.current_time),
        timings=timings,
        consumer="hub-1",
        wall_clock=trio.current_time,
    )
    stuck = StuckSocketSession()
    state.sessions["s1"] = stuck  # type: ignore[assignment]
    exited: list[float] = []
    gone = trio.Event()
    grace_s = 3.0

    def exit_process() -> None:
        exited.append(trio.current_time())
        gone.set()

    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_on_sigterm, state, grace_s, exit_process)
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            signal.raise_signal(signal.SIGTERM)
            with trio.move_on_after(600):
                await gone.wait()
            stuck.unstick.set()  # let the test end either way
    bound = grace_s + ANSWER_WAIT_S + timings.close_timeout_s + OVERDUE_MARGIN_S
    assert exited, "never exited"
    assert exited[0] - started == pytest.approx(bound, abs=0.2)


async def test_a_drain_that_ends_in_time_exits_once(autojump_clock):
    state = HubState(
        substrate=MemorySubstrate(clock=trio.current_time),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=trio.current_time,
    )
    exited: list[float] = []
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                drain_on_sigterm, state, 3.0, lambda: exited.append(trio.current_time())
            )
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            signal.raise_signal(signal.SIGTERM)
    assert exited == [started]  # nothing to wait for: at once, and only once
