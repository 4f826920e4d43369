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
from deskbridge_hub._substrate import JobOwner

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


async def test_a_copy_that_comes_between_the_claim_and_the_enqueue_looks_again(
    autojump_clock, state, monkeypatch  # noqa: F811
):
    """The first copy has claimed the id and its enqueue is held (a slow round trip); the
    second copy finds the key naming no job yet, looks again every 50 ms, and attaches
    once the job is enqueued. A copy that never sees the job enqueued gives up after 10
    looks (0.5 s) with ``job_id_in_use``."""
    from deskbridge_hub import _bridge

    ran: list[str] = []
    s = state.substrate
    submit = s.submit
    held = trio.Event()
    looks: list[float] = []

    async def slow_submit(user_id, sub):
        if sub.attach_only:
            looks.append(trio.current_time())
            if len(looks) == 3:
                held.set()
        elif sub.job_id == "J5":
            await held.wait()
        return await submit(user_id, sub)

    monkeypatch.setattr(s, "submit", slow_submit)
    first, second = (Bridge(s, state.timings, wall_clock=state.wall_clock) for _ in "ab")
    outcomes = {}
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)

        async def call(name, bridge, delay):  # noqa: F811
            await trio.sleep(delay)
            outcomes[name] = await bridge.dispatch(
                "u1", "click", {"a": 1}, job_id="J5", idempotency_key="K5"
            )

        async with trio.open_nursery() as callers:
            callers.start_soon(call, "first", first, 0)
            callers.start_soon(call, "second", second, 0.01)
        assert {n: (o.job_id, o.status) for n, o in outcomes.items()} == {
            "first": ("J5", "completed"),
            "second": ("J5", "completed"),
        }
        assert ran == ["J5"]
        assert len(looks) == 4  # three while held, the fourth found the job
        gaps = [b - a for a, b in zip(looks, looks[1:], strict=False)]
        assert gaps and all(abs(g - _bridge.JOB_ID_RELOOK_S) < 1e-6 for g in gaps[:2])
        # the id held by another call of this user whose key never names a job: 10 looks
        await s.claim_job_id("J6", JobOwner("u1", "elsewhere"), ttl_s=60)
        looks.clear()
        started = trio.current_time()
        with pytest.raises(JobIdInUse):
            await second.dispatch("u1", "click", {}, job_id="J6", idempotency_key="K6")
        assert len(looks) == _bridge.JOB_ID_RELOOKS + 1
        assert trio.current_time() - started == pytest.approx(0.5)
        nursery.cancel_scope.cancel()
