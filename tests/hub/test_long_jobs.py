"""A job that is legitimately still alive keeps every record the hub relies on: one
running longer than the result TTL (300 s), one answered after its deadline. Before,
those records lapsed on lifetimes counted from the delivery or the deadline (MockClock,
the memory substrate, the real hub session; the Redis side is the contract suite's
``keep_job_*`` and ``finish_keeps_the_owner_record_as_long_as_the_state``)."""

from __future__ import annotations

import functools

import pytest
import trio
from deskbridge_common import Cancel, Job, JobResult

from tests.hub.test_outcomes import bridge, connect, sidecar, state  # noqa: F401 - fixtures

#: How long the desktop's job runs: longer than the result TTL and than timeout + TTL.
RUN_S = 800.0


@pytest.mark.parametrize("job_id", [None, "chosen-1"])
async def test_a_job_running_longer_than_the_result_ttl_keeps_its_records(
    autojump_clock, state, bridge, job_id  # noqa: F811
):
    """At 700 s into a run (result TTL 300 s, timeout 30 s): the job is found with its
    stage (was: 404, the state and a chosen id's owner record had lapsed), a retry with
    its idempotency key attaches to it (was: a second job), a cancel reaches the
    desktop (was: UnknownJob), and the answer is kept afterwards."""
    ttl_s = state.timings.result_ttl_s
    assert RUN_S > 30 + ttl_s
    async with trio.open_nursery() as nursery:
        desk = await connect(nursery, state)
        jobs: list[Job] = []
        cancels: list[str] = []
        answer = trio.Event()

        async def run(frame):
            if isinstance(frame, Cancel):
                cancels.append(frame.id)
            elif isinstance(frame, Job):
                jobs.append(frame)
                await answer.wait()
                await desk.send(JobResult(frame.id, True, {"ran": frame.job_id}))

        nursery.start_soon(sidecar, desk, run)
        call = functools.partial(
            bridge.dispatch, "u1", "click", {}, idempotency_key="k-long", timeout_s=30
        )
        nursery.start_soon(functools.partial(call, job_id=job_id))
        await trio.sleep(700)
        (job,) = jobs
        found = await bridge.job_state(job.job_id)
        assert found is not None and found.stage.value == "delivered", found

        retried = []

        async def retry():
            retried.append(await call(timeout_s=RUN_S))

        nursery.start_soon(retry)
        assert await bridge.cancel(job.job_id) == "delivered"
        await trio.sleep(1)
        assert cancels == [job.id]  # the delivery on the desktop
        await trio.sleep(RUN_S - 701)
        answer.set()
        await trio.sleep(1)
        assert [j.job_id for j in jobs] == [job.job_id]  # the retry attached: one job
        assert [(o.job_id, o.status) for o in retried] == [(job.job_id, "completed")]
        await trio.sleep(ttl_s - 10)  # the answer and the state are kept the result TTL
        assert (await bridge.job_state(job.job_id)).stage.value == "finished"
        assert await bridge.answer_of(job.job_id) is not None
        nursery.cancel_scope.cancel()


async def test_a_chosen_job_id_answered_after_its_deadline_is_found_as_long_as_its_state(
    autojump_clock, state, bridge  # noqa: F811
):
    """A job may start until its deadline and answer after it: its owner record
    (timeout + result TTL from the call) lapsed before the state its answer recorded
    (result TTL from the answer), and GET / DELETE of its id said 404 while the answer
    was kept. The job here runs 60 s, less than the keep-alive period, so only the
    answer's step can keep the owner record."""
    ttl_s = state.timings.result_ttl_s
    async with trio.open_nursery() as nursery:
        desk = await connect(nursery, state)

        async def run(frame):
            if isinstance(frame, Job):
                await trio.sleep(60)
                await desk.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, desk, run)
        outcome = await bridge.dispatch("u1", "click", {}, job_id="late-1", timeout_s=10)
        assert outcome.status == "timeout"
        await trio.sleep(60)  # answered at 60 s
        await trio.sleep(10 + ttl_s - 60 + 20)  # past timeout + TTL, within answer + TTL
        found = await bridge.job_state("late-1")
        assert found is not None and found.stage.value == "finished"
        assert await bridge.cancel("late-1") == "finished"
        nursery.cancel_scope.cancel()
