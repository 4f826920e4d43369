"""Copies of one request naming its own job id, at once (another replica, a retry): the
one that claimed the id and the ones that went on as its claimer (the claim carries the
request's digest) may each enqueue the job, so a copy refused before it enqueued
(``offline``, ``queue_full``, out of time) must not drop the claim another copy goes
on to enqueue under. Found by review: the copy that took over the claim dropped it when
it was refused (``offline``), then the first copy enqueued the job with no owner record
left: ``GET /v1/jobs/{id}`` and ``DELETE`` said 404 while it ran, and any user could
claim the id again (MemorySubstrate, MockClock)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import Bridge, MemorySubstrate

from tests.hub.test_session import wall

JOB = "order-7"


async def test_a_copy_refused_before_it_enqueued_leaves_the_claim_the_other_copy_uses(
    autojump_clock,
):
    substrate = MemorySubstrate(clock=wall)
    bridge = Bridge(substrate, Timings(), wall_clock=wall)
    submit = substrate.submit
    go_on = trio.Event()
    gated: list[str] = []

    async def first_submit_waits(user_id, submission):  # type: ignore[no-untyped-def]
        if not gated:  # the copy that claimed: its submit lands later
            gated.append(submission.job_id)
            await go_on.wait()
        return await submit(user_id, submission)

    substrate.submit = first_submit_waits  # type: ignore[method-assign]
    outcomes = {}

    async def first_copy() -> None:
        outcomes["first"] = await bridge.dispatch("u1", "echo", {"n": 1}, job_id=JOB, timeout_s=30)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_copy)
        await trio.testing.wait_all_tasks_blocked()
        assert gated == [JOB]  # claimed, its submit held
        second = await bridge.dispatch("u1", "echo", {"n": 1}, job_id=JOB, timeout_s=30)
        assert second.status == "offline"  # true when it looked: nothing enqueued by it
        await substrate.set_presence("u1", "sess-1", ttl_s=120.0)  # the desktop comes
        go_on.set()
        with trio.fail_after(5):
            while not (await substrate.queue_info("u1")).length:  # noqa: ASYNC110 - mock clock
                await trio.sleep(0.01)
        # the first copy enqueued the job under the id: the id still names it
        owner = await substrate.job_owner(JOB)
        assert owner is not None and owner.user_id == "u1", "the job's id lost its claim"
        assert not await substrate.claim_job_id(JOB, owner, ttl_s=60)  # nobody else's
        assert await bridge.cancel(JOB) == "queued"  # was: UnknownJob (404)
        await trio.testing.wait_all_tasks_blocked()
    assert outcomes["first"].status == "cancelled"


async def test_a_copy_that_enqueues_after_the_claimer_was_refused_claims_the_id_again(
    autojump_clock,
):
    """The other way round: the copy that claimed was refused (``offline``) and dropped
    its claim after the second copy had gone on as its claimer; the second copy then
    enqueued the job (the desktop came meanwhile) and claims the id again."""
    substrate = MemorySubstrate(clock=wall)
    bridge = Bridge(substrate, Timings(), wall_clock=wall)
    submit = substrate.submit
    gates = [trio.Event(), trio.Event()]
    held: list[str] = []

    async def submits_wait(user_id, submission):  # type: ignore[no-untyped-def]
        gate = gates[len(held)]
        held.append(submission.job_id)
        await gate.wait()
        return await submit(user_id, submission)

    substrate.submit = submits_wait  # type: ignore[method-assign]
    outcomes = {}

    async def copy(name: str) -> None:
        outcomes[name] = await bridge.dispatch(
            "u1", "echo", {"n": 1}, job_id=JOB, idempotency_key="k-7", timeout_s=30
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(copy, "second")  # goes on as the claimer: its submit waits
        await trio.testing.wait_all_tasks_blocked()
        assert held == [JOB, JOB]
        gates[0].set()  # the claimer's submit: offline, and it drops its claim
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes["first"].status == "offline"
        await substrate.set_presence("u1", "sess-1", ttl_s=120.0)
        gates[1].set()  # the second copy enqueues
        await trio.testing.wait_all_tasks_blocked()
        assert (await substrate.queue_info("u1")).length == 1
        owner = await substrate.job_owner(JOB)
        assert owner is not None and owner.user_id == "u1", "the job's id lost its claim"
        assert await bridge.cancel(JOB) == "queued"
        await trio.testing.wait_all_tasks_blocked()
    assert outcomes["second"].status == "cancelled"
