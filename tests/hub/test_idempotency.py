"""Issue 16 item 3 / issue 12 item 2 (hub): one idempotency key means one request.

MemorySubstrate shared by two ``Bridge`` objects (two replicas' dispatch APIs, each with
its own notification mailbox), memory sockets, MockClock (autojump). The real-process
versions are tests/chaos/test_same_key_two_pods.py and
tests/chaos/test_retry_attaches.py (the issue 16 example: holder pod killed).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge, IdempotencyKeyReused
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState

from tests.hub.test_outcomes import connect, sidecar
from tests.hub.test_session import wall


@pytest.fixture
def state() -> HubState:
    return HubState(
        substrate=MemorySubstrate(clock=wall), timings=Timings(), consumer="hub-1", wall_clock=wall
    )


def replicas(state: HubState) -> tuple[Bridge, Bridge]:
    return (
        Bridge(state.substrate, state.timings, wall_clock=wall),
        Bridge(state.substrate, state.timings, wall_clock=wall),
    )


async def test_retries_from_two_replicas_attach_to_one_job_executed_once(autojump_clock, state):
    a, b = replicas(state)
    runs: list[Job] = []
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def run(frame):
            if isinstance(frame, Job):
                runs.append(frame)
                await trio.sleep(5)  # a 5 s tool: the retries arrive while it runs
                await peer.send(JobResult(frame.id, True, {"n": len(runs)}))

        nursery.start_soon(sidecar, peer, run)
        outcomes = {}

        async def call(name, bridge, delay):
            await trio.sleep(delay)
            outcomes[name] = await bridge.dispatch(
                "u1", "click", {"x": 1}, idempotency_key="order-42", timeout_s=30
            )

        async with trio.open_nursery() as callers:
            callers.start_soon(call, "first", a, 0)
            callers.start_soon(call, "retry-same-replica", a, 1)
            callers.start_soon(call, "retry-other-replica", b, 2)
        # after it finished: still the same answer, from the index and the kept result
        outcomes["late"] = await b.dispatch(
            "u1", "click", {"x": 1}, idempotency_key="order-42", timeout_s=30
        )
        nursery.cancel_scope.cancel()
    assert len(runs) == 1 and runs[0].idempotency_key == "order-42"
    assert {o.status for o in outcomes.values()} == {"completed"}
    assert {o.job_id for o in outcomes.values()} == {outcomes["first"].job_id}
    assert {str(o.result) for o in outcomes.values()} == {"{'n': 1}"}
    assert state.substrate.pending_count("u1") == 0


async def test_same_key_other_args_or_tool_is_refused_before_enqueue(autojump_clock, state):
    a, b = replicas(state)
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def run(frame):
            if isinstance(frame, Job):
                await peer.send(JobResult(frame.id, True, frame.args))

        nursery.start_soon(sidecar, peer, run)
        first = await a.dispatch("u1", "click", {"x": 1}, idempotency_key="k1", timeout_s=30)
        assert first.status == "completed"
        for name, args in (("click", {"x": 2}), ("type", {"x": 1})):
            with pytest.raises(IdempotencyKeyReused) as info:
                await b.dispatch("u1", name, args, idempotency_key="k1", timeout_s=30)
            assert info.value.job_id == first.job_id
        # argument order does not make another request
        same = await b.dispatch("u1", "click", {"x": 1}, idempotency_key="k1", timeout_s=30)
        assert same.job_id == first.job_id
        assert (await state.substrate.queue_info("u1")).length == 1
        nursery.cancel_scope.cancel()


async def test_issue_16_retry_of_a_queued_job_is_never_answered_offline(autojump_clock, state):
    """Attempt 1 is queued while presence says online; the holder goes away (presence
    expires) before it runs; retries with the same key used to be answered "offline"
    though the sidecar came back inside the deadline and ran attempt 1. Now the retries
    wait for attempt 1 and get its real outcome."""
    a, b = replicas(state)
    await state.substrate.set_presence("u1", "old-session", 30)  # the holder that dies
    outcomes = []
    all_answered = trio.Event()

    async def call(bridge, delay, timeout_s):
        await trio.sleep(delay)
        outcomes.append(
            await bridge.dispatch(
                "u1", "click", {"x": 1}, idempotency_key="pay-7", timeout_s=timeout_s
            )
        )
        if len(outcomes) == 3:
            all_answered.set()

    runs: list[Job] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, a, 0, 5)  # attempt 1: queued, its caller times out at 5 s
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(31)  # presence of the dead holder has expired
        assert (await a.presence("u1")).online is False
        nursery.start_soon(call, b, 0, 60)  # retry 1: other replica, desktop offline
        nursery.start_soon(call, a, 2, 60)  # retry 2
        await trio.sleep(20)
        peer = await connect(nursery, state)  # the desktop is back within the deadline

        async def run(frame):
            if isinstance(frame, Job):
                runs.append(frame)
                await peer.send(JobResult(frame.id, True, {"paid": True}))

        nursery.start_soon(sidecar, peer, run)
        await all_answered.wait()
        nursery.cancel_scope.cancel()
    first, *retries = outcomes
    # attempt 1's own caller gave up; its job's deadline (5 s) had passed when the desktop
    # came back, so the hub answered it "expired" -- and that is what the retries are told
    assert first.status == "timeout"
    assert runs == []
    assert [r.status for r in retries] == ["expired", "expired"]
    assert {r.job_id for r in retries} == {first.job_id}


async def test_a_retry_gets_the_real_outcome_when_the_desktop_returns_in_time(
    autojump_clock, state
):
    """The issue 16 case with a deadline that outlives the outage: attempt 1 runs once
    when the desktop returns, and every retry gets its result, none "offline"."""
    a, b = replicas(state)
    await state.substrate.set_presence("u1", "old-session", 30)
    outcomes = {}
    all_answered = trio.Event()

    async def call(name, bridge, timeout_s):
        outcomes[name] = await bridge.dispatch(
            "u1", "click", {"x": 1}, idempotency_key="pay-8", timeout_s=timeout_s
        )
        if len(outcomes) == 3:
            all_answered.set()

    runs: list[Job] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "attempt-1", a, 120)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(31)
        assert (await b.presence("u1")).online is False
        nursery.start_soon(call, "retry-1", b, 120)
        nursery.start_soon(call, "retry-2", a, 120)
        await trio.sleep(10)
        assert outcomes == {}  # nobody was told "offline"
        peer = await connect(nursery, state)

        async def run(frame):
            if isinstance(frame, Job):
                runs.append(frame)
                await peer.send(JobResult(frame.id, True, {"paid": True}))

        nursery.start_soon(sidecar, peer, run)
        await all_answered.wait()
        nursery.cancel_scope.cancel()
    assert len(runs) == 1
    assert {o.status for o in outcomes.values()} == {"completed"}
    assert {o.job_id for o in outcomes.values()} == {outcomes["attempt-1"].job_id}


async def test_offline_records_nothing_so_the_key_stays_free(autojump_clock, state):
    a, _ = replicas(state)
    offline = await a.dispatch("u1", "click", {}, idempotency_key="k-free", timeout_s=5)
    assert offline.status == "offline"
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def run(frame):
            if isinstance(frame, Job):
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, run)
        # another tool with the same key: the key names nothing yet, so it is accepted
        done = await a.dispatch("u1", "type", {}, idempotency_key="k-free", timeout_s=5)
        assert done.status == "completed"
        nursery.cancel_scope.cancel()


async def test_a_retry_that_times_out_on_a_queued_job_says_it_may_still_start(
    autojump_clock, state
):
    """An attached retry waits its own timeout, but the job it attached to has the
    deadline of the call that enqueued it. A "timeout, stage queued" answer used to say
    the job "will not start later" (true of a caller's own job, whose deadline ends its
    wait) even when that job could still start: a caller trusting it and using a new key
    would run the request twice. Now the answer says it may still start, and for how
    long; once that deadline has passed, plain "queued" again."""
    a, b = replicas(state)
    await state.substrate.set_presence("u1", "old-session", 30)  # nobody reads the stream
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: a.dispatch("u1", "click", {"x": 1}, idempotency_key="k-wait", timeout_s=60)
        )
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(10)
        retry = await b.dispatch("u1", "click", {"x": 1}, idempotency_key="k-wait", timeout_s=5)
        assert retry.status == "timeout"
        assert retry.detail["stage"] == "queued"
        assert retry.detail["may_start_within_s"] == pytest.approx(45, abs=0.1)
        assert "may still start" in retry.error["message"]
        await trio.sleep(50)  # past the job's own deadline (60 s)
        late = await b.dispatch("u1", "click", {"x": 1}, idempotency_key="k-wait", timeout_s=5)
        assert late.job_id == retry.job_id
        assert late.status == "timeout" and late.detail == {"stage": "queued"}
        assert "never took it" in late.error["message"]
        nursery.cancel_scope.cancel()


def test_index_records_with_and_without_the_deadline_decode():
    """Records written by older hubs (no deadline) still attach; the deadline keeps its
    millisecond precision; anything else is refused."""
    from deskbridge_hub._idempotency import IndexRecord

    old = IndexRecord.decode("j1 click d1")
    assert old == IndexRecord("j1", "click", "d1") and old.deadline is None
    new = IndexRecord.decode("j1 click d1 1700000060.125")
    assert new.deadline == 1700000060.125 and new.encode() == "j1 click d1 1700000060.125"
    assert new.same_request("click", "d1") and not new.same_request("click", "d2")
    for bad in ("j1 click", "j1 click d1 soon", "j1 click d1 5 6"):
        with pytest.raises(ValueError):
            IndexRecord.decode(bad)


async def test_an_attached_retry_gets_the_answer_within_a_quarter_second(autojump_clock, state):
    """The holder notifies the mailbox of the call that enqueued the job, not the retry's:
    an attached retry learns the answer by reading the result list. It used to read it
    at steps growing to 1 s (an answer published 3.6 s in was seen 0.9 s late); now the
    steps stop at 0.25 s."""
    from deskbridge_hub._jobs import result_payload

    a, b = replicas(state)
    await state.substrate.set_presence("u1", "old-session", 30)  # nobody reads the stream
    seen = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: a.dispatch("u1", "click", {"x": 1}, idempotency_key="k-poll", timeout_s=60)
        )
        await trio.testing.wait_all_tasks_blocked()

        async def retry():
            seen["outcome"] = await b.dispatch(
                "u1", "click", {"x": 1}, idempotency_key="k-poll", timeout_s=30
            )
            seen["at"] = trio.current_time()

        nursery.start_soon(retry)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(3.6)
        job_id = next(iter(a.waiters._waiting))
        await state.substrate.publish_result(
            "u1",
            job_id,
            result_payload("completed", result={"ok": 1}),
            ttl_s=300,
            notify=a.waiters.mailbox,
            idempotency_key="k-poll",
        )
        published = trio.current_time()
        while "at" not in seen:  # noqa: ASYNC110 - test poll on the mock clock
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert seen["outcome"].status == "completed" and seen["outcome"].job_id == job_id
    assert seen["at"] - published <= 0.25 + 1e-6
