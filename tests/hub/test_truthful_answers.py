"""The hub never tells a caller or a reader something untrue about a job (its stage, a
cancel's answer, its outcome) when the desktop vanished, the store was rewound or the
job finished meanwhile (docs/outcomes.md). MemorySubstrate, memory sockets, MockClock."""

from __future__ import annotations

import json

import trio
import trio.testing
from deskbridge_hub._jobstate import JobState, Stage

from tests.hub import test_outcomes
from tests.hub.test_session import wall

state = test_outcomes.state  # the fixtures: one hub process, a Bridge on its substrate
bridge = test_outcomes.bridge


async def test_a_cancel_of_a_job_that_finished_after_its_state_was_read_says_finished(
    autojump_clock,
    state,
    bridge,
):
    """The cancel read ``delivered``; the job's answer was written before the cancel
    flag (the holder finished it in between). Before: 202 ``delivered`` (the cancel
    was "requested" for a job that had its answer). Now ``finished`` (409)."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: bridge.dispatch("u1", "click", {}, job_id="job-f", timeout_s=60))
        await trio.sleep(1)
        delivered = JobState(Stage.DELIVERED, "u1", at=wall(), session_id="ghost")
        marked = await s.mark_delivered("u1", "job-f", delivered, ttl_s=300)
        real_request_cancel = s.request_cancel

        async def finished_first(user_id: str, job_id: str, *, ttl_s: float) -> None:
            done = JobState(Stage.FINISHED, "u1", at=wall())
            payload = json.dumps({"status": "completed", "result": 1})
            await s.finish("u1", "job-f", payload, done, ttl_s=300, epoch=marked.epoch)
            await real_request_cancel(user_id, job_id, ttl_s=ttl_s)

        s.request_cancel = finished_first  # type: ignore[method-assign]
        assert await bridge.cancel("job-f") == "finished"
        nursery.cancel_scope.cancel()


async def test_a_cancel_that_read_queued_for_a_job_delivered_and_answered_since_says_finished(
    autojump_clock,
    state,
    bridge,
):
    """The cancel read ``queued``; before its flag the job was delivered and answered.
    Its own answer was refused (a delivery's epoch exists) and it said ``delivered``
    (202) about a job that had its answer. Now ``finished``."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: bridge.dispatch("u1", "click", {}, job_id="job-q", timeout_s=60))
        await trio.sleep(1)
        real_request_cancel = s.request_cancel

        async def delivered_and_finished_first(user_id: str, job_id: str, *, ttl_s: float):
            delivered = JobState(Stage.DELIVERED, "u1", at=wall(), session_id="ghost")
            marked = await s.mark_delivered("u1", "job-q", delivered, ttl_s=300)
            done = JobState(Stage.FINISHED, "u1", at=wall())
            payload = json.dumps({"status": "completed", "result": 1})
            await s.finish("u1", "job-q", payload, done, ttl_s=300, epoch=marked.epoch)
            await real_request_cancel(user_id, job_id, ttl_s=ttl_s)

        s.request_cancel = delivered_and_finished_first  # type: ignore[method-assign]
        assert await bridge.cancel("job-q") == "finished"
        nursery.cancel_scope.cancel()
