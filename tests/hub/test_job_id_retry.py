"""A request that names its ``job_id`` and an ``idempotency_key`` is one request: sent
again (a retry after a dropped connection) or twice at once (two replicas), it runs
once and every copy gets that job's answer, never ``409 job_id_in_use`` for its own job.
The id still names one job only: another request (another key, other arguments,
another user) naming it is refused. MemorySubstrate, memory sockets, MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobResult
from deskbridge_hub import Bridge, IdempotencyKeyReused, JobIdInUse

from tests.hub.test_outcomes import bridge, connect, sidecar, state  # noqa: F401 - fixtures


async def _desktop(nursery, state, ran, seconds=1.0):  # noqa: F811
    peer = await connect(nursery, state)

    async def run(frame):
        if isinstance(frame, Job):
            ran.append(frame.job_id)
            await trio.sleep(seconds)
            await peer.send(JobResult(frame.id, True, {"ran": frame.job_id}))

    nursery.start_soon(sidecar, peer, run)


async def test_the_same_request_sent_again_attaches_to_its_own_job(
    autojump_clock, state, bridge  # noqa: F811
):
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)
        first = await bridge.dispatch("u1", "click", {"a": 1}, job_id="J1", idempotency_key="K1")
        again = await bridge.dispatch("u1", "click", {"a": 1}, job_id="J1", idempotency_key="K1")
        assert (first.job_id, first.status) == ("J1", "completed")
        assert (again.job_id, again.status, again.result) == ("J1", "completed", first.result)
        assert ran == ["J1"]
        nursery.cancel_scope.cancel()


async def test_the_same_request_on_two_replicas_at_once_runs_once(
    autojump_clock, state  # noqa: F811
):
    """Two Bridges (two replicas) send the identical request at the same instant: one
    claims the id, the other's claim fails while the first has not enqueued yet; both
    get the one job's answer."""
    ran: list[str] = []
    replicas = [Bridge(state.substrate, state.timings, wall_clock=state.wall_clock) for _ in "ab"]
    outcomes = []
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)

        async def call(bridge):  # noqa: F811
            outcomes.append(
                await bridge.dispatch("u1", "click", {"a": 1}, job_id="J2", idempotency_key="K2")
            )

        async with trio.open_nursery() as callers:
            for replica in replicas:
                callers.start_soon(call, replica)
        assert [(o.job_id, o.status) for o in outcomes] == [("J2", "completed")] * 2
        assert ran == ["J2"]
        nursery.cancel_scope.cancel()


async def test_another_request_naming_a_used_job_id_is_still_refused(
    autojump_clock, state, bridge  # noqa: F811
):
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)
        await state.substrate.set_presence("u2", "ghost", 3600)
        first = await bridge.dispatch("u1", "click", {"a": 1}, job_id="J3", idempotency_key="K3")
        assert first.status == "completed"
        with pytest.raises(JobIdInUse):  # another key
            await bridge.dispatch("u1", "click", {"a": 1}, job_id="J3", idempotency_key="K4")
        with pytest.raises(JobIdInUse):  # no key: a new request
            await bridge.dispatch("u1", "click", {"a": 1}, job_id="J3")
        with pytest.raises(JobIdInUse):  # another user, the same key
            await bridge.dispatch("u2", "click", {"a": 1}, job_id="J3", idempotency_key="K3")
        with pytest.raises(IdempotencyKeyReused):  # the same key, other arguments
            await bridge.dispatch("u1", "click", {"a": 2}, job_id="J3", idempotency_key="K3")
        assert ran == ["J3"]
        nursery.cancel_scope.cancel()
