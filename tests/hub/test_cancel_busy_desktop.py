"""A cancel reaches the holder whatever room its session has (``_cancel_notice``).

The holder learned of a cancel only from the job's control entry, read with the stream,
and the control entry sits behind every job queued before it: a session whose in-flight
window is full reads nothing. Since a cancel of a ``queued`` job defers to a live holder
(cancel round), the caller of a job queued behind a long tool was answered only when
that tool ended (300 s here), not at once; and a running job's ``cancel`` frame waited
the same way behind the jobs queued after it (before that round too). A real hub
session and process reader on ``MemorySubstrate``, a fake sidecar, MockClock; a window
of 1 stands for the default 32 deliveries outstanding."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio
from deskbridge_common import Cancel, Job, JobError, JobResult, Timings
from deskbridge_hub import Bridge, MemorySubstrate
from deskbridge_hub._session import HubState

from tests.hub.test_outcomes import connect, sidecar
from tests.hub.test_session import wall

LONG_TOOL_S = 300.0
#: What "at once" allows: a wake-up and a few Redis steps (the tool runs 300 s).
PROMPT_S = 5.0


@attrs.define
class _Desk:
    """One user's desktop with a window of one delivery, a tool of ``LONG_TOOL_S`` that
    a ``cancel`` frame stops, and the callers' outcomes as they come."""

    bridge: Bridge
    nursery: trio.Nursery
    started: trio.Event = attrs.field(factory=trio.Event)
    outcomes: dict[str, Any] = attrs.field(factory=dict)
    answered: dict[str, trio.Event] = attrs.field(factory=dict)
    answered_at: dict[str, float] = attrs.field(factory=dict)

    def call(self, job_id: str) -> None:
        self.answered[job_id] = trio.Event()

        async def run() -> None:
            self.outcomes[job_id] = await self.bridge.dispatch(
                "u1", "w", {}, job_id=job_id, timeout_s=600
            )
            self.answered_at[job_id] = trio.current_time()
            self.answered[job_id].set()

        self.nursery.start_soon(run)


@contextlib.asynccontextmanager
async def _busy_desk() -> AsyncIterator[_Desk]:
    sub = MemorySubstrate(clock=wall)
    state = HubState(
        substrate=sub, timings=Timings(), consumer="hub-1", wall_clock=wall,
        max_inflight_per_session=1,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        desk = _Desk(Bridge(sub, state.timings, wall_clock=wall), nursery)
        peer = await connect(nursery, state)
        running: dict[str, trio.CancelScope] = {}

        async def long_tool(frame: Any) -> None:
            if isinstance(frame, Cancel):
                running[frame.id].cancel()
            elif isinstance(frame, Job):
                desk.started.set()
                with trio.CancelScope() as running[frame.id]:
                    await trio.sleep(LONG_TOOL_S)
                    await peer.send(JobResult(frame.id, True, {"done": True}))
                    return
                await peer.send(JobResult(frame.id, False, error=JobError("cancelled", "x")))

        nursery.start_soon(sidecar, peer, long_tool)
        desk.call("job-a")
        with trio.fail_after(30):
            await desk.started.wait()
        desk.call("job-b")
        await trio.sleep(1)  # job-b queued behind job-a (window of 1)
        yield desk
        nursery.cancel_scope.cancel()


async def test_a_queued_job_behind_a_busy_desktop_is_answered_cancelled_at_once(
    autojump_clock: Any,
) -> None:
    async with _busy_desk() as desk:
        t0 = trio.current_time()
        assert await desk.bridge.cancel("job-b") == "queued"  # the live holder answers
        with trio.fail_after(LONG_TOOL_S):
            await desk.answered["job-b"].wait()
        assert desk.outcomes["job-b"].status == "cancelled"
        assert desk.answered_at["job-b"] - t0 < PROMPT_S  # was: 300 s, when job-a ended
        assert "job-a" not in desk.outcomes  # still running: nothing else answered it


async def test_a_running_job_behind_a_full_window_gets_its_cancel_frame_at_once(
    autojump_clock: Any,
) -> None:
    async with _busy_desk() as desk:
        t0 = trio.current_time()
        assert await desk.bridge.cancel("job-a") == "delivered"
        with trio.fail_after(LONG_TOOL_S):
            await desk.answered["job-a"].wait()
        assert desk.outcomes["job-a"].status == "cancelled"
        assert desk.answered_at["job-a"] - t0 < PROMPT_S  # was: 300 s, the tool ran on
