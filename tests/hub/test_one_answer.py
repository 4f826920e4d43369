"""A job has one answer, whatever order two writers about it take (races between a
cancel, the holder's delivery verdict and the tool's answer, possibly on two replicas):
the first terminal answer is the job's, every reader (the caller, a retry by the key,
``GET /v1/jobs/{id}`` / ``Bridge.job_state``) sees that one, and a cancel that lost the
race says ``finished``. MemorySubstrate, memory sockets, MockClock (autojump)."""

from __future__ import annotations

import json

import trio
import trio.testing
from deskbridge_common import Job, JobResult
from deskbridge_hub._jobstate import Stage
from deskbridge_hub._substrate import result_key

from tests.hub.test_outcomes import bridge, connect, sidecar, state  # noqa: F401 - fixtures


async def _results(substrate, user, job):
    got = substrate._result_list(result_key(user, job), trio.current_time())
    return [] if got is None else list(got.items)


async def test_a_cancelled_job_read_after_its_deadline_stays_cancelled(
    autojump_clock, state, bridge  # noqa: F811
):
    """Cancelled while queued (its caller answered ``cancelled``), its entry read by the
    holder only after its deadline: the holder's ``expired`` verdict does not replace
    the answer (the state said ``expired`` while the caller had ``cancelled``)."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    outcomes = []
    async with trio.open_nursery() as nursery:

        async def caller():
            outcomes.append(
                await bridge.dispatch(
                    "u1", "click", {}, job_id="job-1", idempotency_key="k1", timeout_s=30
                )
            )

        nursery.start_soon(caller)
        await trio.sleep(1)
        assert await bridge.cancel("job-1") == "queued"
        await trio.testing.wait_all_tasks_blocked()
        assert [o.status for o in outcomes] == ["cancelled"]
        await trio.sleep(60)  # past the deadline, then the desktop's holder reads the entry
        peer = await connect(nursery, state)
        ran = []

        async def record(frame):
            ran.append(frame)

        nursery.start_soon(sidecar, peer, record)
        await trio.sleep(10)
        assert ran == []
        job_state = await bridge.job_state("job-1")
        assert job_state is not None and job_state.stage is Stage.CANCELLED
        assert [json.loads(p)["status"] for p in await _results(s, "u1", "job-1")] == [
            "cancelled"
        ]
        assert s.pending_count("u1") == 0
        retry = await bridge.dispatch("u1", "click", {}, idempotency_key="k1", timeout_s=30)
        assert (retry.job_id, retry.status) == ("job-1", "cancelled")
        assert await bridge.cancel("job-1") == "finished"
        nursery.cancel_scope.cancel()


async def test_a_cancel_that_read_queued_loses_to_the_holder_s_expired_answer(
    autojump_clock, state, bridge, monkeypatch  # noqa: F811
):
    """The cancel read the state ``queued``; before its own answer was written the holder
    answered the job ``expired`` (its deadline passed at the read). The cancel changes
    nothing and says ``finished``: the state and the result stay ``expired``."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    outcomes = []
    async with trio.open_nursery() as nursery:

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "click", {}, job_id="job-2", timeout_s=5))

        nursery.start_soon(caller)
        await trio.sleep(1)
        read = s.get_job_state
        gate = trio.Event()

        async def slow_read(user_id, job_id):
            got = await read(user_id, job_id)
            await gate.wait()  # the state read's reply, held while the holder answers
            return got

        monkeypatch.setattr(s, "get_job_state", slow_read)
        answers = []

        async def cancel():
            answers.append(await bridge.cancel("job-2"))

        nursery.start_soon(cancel)
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.setattr(s, "get_job_state", read)
        await trio.sleep(10)  # past the deadline: the caller has its timeout
        peer = await connect(nursery, state)
        ran = []

        async def record(frame):
            if isinstance(frame, Job):
                ran.append(frame)
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, record)
        await trio.sleep(5)
        expired = await s.get_job_state("u1", "job-2")
        assert expired is not None and expired.stage is Stage.EXPIRED
        gate.set()
        await trio.sleep(1)
        assert answers == ["finished"]
        assert ran == []
        final = await bridge.job_state("job-2")
        assert final is not None and final.stage is Stage.EXPIRED
        assert [json.loads(p)["status"] for p in await _results(s, "u1", "job-2")] == ["expired"]
        assert [o.status for o in outcomes] == ["timeout"]
        nursery.cancel_scope.cancel()


async def test_a_cancelled_job_never_runs_later_within_its_deadline(
    autojump_clock, state, bridge  # noqa: F811
):
    """Cancelled while queued with an hour to run; its entry is read only after the
    result TTL (5 min: the desktop came back later, on any replica). The cancel still
    holds: the job never reaches the desktop, its answer stays ``cancelled``."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    outcomes = []
    async with trio.open_nursery() as nursery:

        async def caller():
            outcomes.append(
                await bridge.dispatch("u1", "click", {}, job_id="job-3", timeout_s=3600)
            )

        nursery.start_soon(caller)
        await trio.sleep(1)
        assert await bridge.cancel("job-3") == "queued"
        await trio.testing.wait_all_tasks_blocked()
        assert [o.status for o in outcomes] == ["cancelled"]
        await trio.sleep(state.timings.result_ttl_s + 100)
        peer = await connect(nursery, state)
        ran = []

        async def record(frame):
            if isinstance(frame, Job):
                ran.append(frame)
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, record)
        await trio.sleep(10)
        assert ran == []
        assert s.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_an_answer_written_as_the_wait_ends_is_the_caller_s(
    autojump_clock, state, bridge, monkeypatch  # noqa: F811
):
    """The holder answers the job (here ``expired``, at its deadline, which is the end
    of the caller's wait) between the caller's last look at the result list and its
    read of the stage: the caller gets that answer, not ``timeout`` with the stage
    ``unknown`` while every other reader sees ``expired``."""
    from deskbridge_hub._jobs import expired_payload
    from deskbridge_hub._jobstate import JobState

    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    read = s.get_result
    looks = []

    async def last_look(user_id, job_id):
        got = await read(user_id, job_id)
        looks.append(trio.current_time())
        if got is None and trio.current_time() >= 5:  # the caller's time is up
            await s.finish(  # the holder's answer lands just after the look
                user_id, job_id, expired_payload(), JobState(Stage.EXPIRED, user_id, at=1.0),
                ttl_s=300,
            )  # fmt: skip
        return got

    monkeypatch.setattr(s, "get_result", last_look)
    outcome = await bridge.dispatch("u1", "click", {}, job_id="job-4", timeout_s=5)
    assert looks, "the wait never looked at the result list"
    assert (outcome.job_id, outcome.status) == ("job-4", "expired")
    stored = await bridge.job_state("job-4")
    assert stored is not None and stored.stage is Stage.EXPIRED
