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


async def _two_copies(state, job_id, key):  # noqa: F811
    """The same request from two replicas (two Bridges), the second 10 ms after the
    first; both must be answered ``completed`` with ``job_id``. Returns the second."""
    first, second = (Bridge(state.substrate, state.timings, wall_clock=state.wall_clock)
                     for _ in "ab")  # fmt: skip
    outcomes = {}

    async def call(name, bridge, delay):  # noqa: F811
        await trio.sleep(delay)
        outcomes[name] = await bridge.dispatch(
            "u1", "click", {"a": 1}, job_id=job_id, idempotency_key=key
        )

    async with trio.open_nursery() as callers:
        callers.start_soon(call, "first", first, 0)
        callers.start_soon(call, "second", second, 0.01)
    assert {n: (o.job_id, o.status) for n, o in outcomes.items()} == {
        "first": (job_id, "completed"),
        "second": (job_id, "completed"),
    }
    return second


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
    """The first copy, on an older hub (its claim carries no request digest), has
    claimed the id and its enqueue is held (a slow round trip); the second copy finds the
    key naming no job yet, looks again every 50 ms, and attaches once the job is
    enqueued. A copy that never sees the job enqueued gives up after 10 looks (0.5 s)
    with ``job_id_in_use``."""
    from deskbridge_hub import _bridge

    ran: list[str] = []
    s = state.substrate
    submit, claim = s.submit, s.claim_job_id
    held = trio.Event()
    looks: list[float] = []
    claims: list[JobOwner] = []

    async def older_first_claim(job_id, owner, *, ttl_s):
        if not claims:
            owner = JobOwner(owner.user_id, owner.reply_to)  # an older hub's record
        claims.append(owner)
        return await claim(job_id, owner, ttl_s=ttl_s)

    monkeypatch.setattr(s, "claim_job_id", older_first_claim)

    async def slow_submit(user_id, sub):
        if sub.attach_only:
            looks.append(trio.current_time())
            if len(looks) == 3:
                held.set()
        elif sub.job_id == "J5":
            await held.wait()
        return await submit(user_id, sub)

    monkeypatch.setattr(s, "submit", slow_submit)
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)
        second = await _two_copies(state, "J5", "K5")
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


async def test_a_copy_that_comes_between_the_claim_and_the_enqueue_knows_the_claim(
    autojump_clock, state, monkeypatch  # noqa: F811
):
    """The claim carries its request (``JobOwner.request``): the second copy, finding
    the id claimed by the same request while the first copy's enqueue is held, goes on
    as its claimer (no looks): one of the two enqueues, the other finds the job under the
    id; both get its answer, it ran once."""
    ran: list[str] = []
    s = state.substrate
    submit = s.submit
    held = trio.Event()
    sent: list[str] = []

    async def slow_submit(user_id, sub):
        sent.append("attach_only" if sub.attach_only else "own" if sub.own else "other")
        if len(sent) == 1:
            await held.wait()  # the first copy's enqueue
        got = await submit(user_id, sub)
        held.set()
        return got

    monkeypatch.setattr(s, "submit", slow_submit)
    async with trio.open_nursery() as nursery:
        await _desktop(nursery, state, ran)
        await _two_copies(state, "J7", "K7")
        assert ran == ["J7"]
        assert "attach_only" not in sent, sent  # was: the second looked the key up
        nursery.cancel_scope.cancel()
