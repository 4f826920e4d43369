"""The hub's side of consent (issue 12 item 5), alone: the job-state table's
``awaiting_approval``, a delivery's stage reports recorded in order by the task serving it
(``_desk_stage``), and the ``waited_s`` each delivery carries. MockClock, memory substrate."""

from __future__ import annotations

import types

import pytest
import trio
import trio.testing
from deskbridge_common import JobResult, Timings
from deskbridge_hub._delivery import EntryServer
from deskbridge_hub._desk_stage import Outstanding, stage_recorder
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._jobs import JobEnvelope
from deskbridge_hub._jobstate import (
    FORWARDED,
    STAGE_OF_DESK,
    TERMINAL,
    TRANSITIONS,
    InvalidTransition,
    JobState,
    Stage,
)
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._outcome import _TIMEOUT_MESSAGES

EPOCH = 1_700_000_000.0
USER = "u1"


def wall() -> float:
    return EPOCH + trio.current_time()


def test_awaiting_approval_sits_between_delivered_and_the_end():
    A, D, I = Stage.AWAITING_APPROVAL, Stage.DELIVERED, Stage.INTERRUPTED  # noqa: E741
    assert TRANSITIONS[D] == {D, A, I} | TERMINAL
    assert TRANSITIONS[A] == {A, D, I} | TERMINAL
    assert A not in TRANSITIONS[Stage.QUEUED] and A not in TRANSITIONS[I]
    assert not A.terminal and FORWARDED == {D, A, I}  # past its deadline: still forwarded
    assert STAGE_OF_DESK == {"awaiting_approval": A, "running": D}
    assert "approval" in _TIMEOUT_MESSAGES["awaiting_approval"]


async def test_each_stage_change_is_recorded_in_order_then_the_result_returned(autojump_clock):
    recorded: list[tuple[Stage, bool]] = []

    async def record(stage: Stage, running: bool) -> None:
        await trio.sleep(1)  # a slow write: reports meanwhile are coalesced, not lost
        recorded.append((stage, running))

    delivery = Outstanding(job_id="j1")
    result = JobResult("d1", True, {"ok": 1})
    async with trio.open_nursery() as nursery:
        got: list[JobResult] = []

        async def waiter() -> None:
            got.append(await delivery.wait(record))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        delivery.report(None)  # a plain progress report: nothing to record
        await trio.testing.wait_all_tasks_blocked()
        assert recorded == []
        delivery.report("awaiting_approval")
        delivery.report("awaiting_approval")  # repeated: once
        await trio.sleep(0.5)
        delivery.report("running")  # while the first write is in flight
        await trio.sleep(5)
        delivery.report("awaiting_approval")
        delivery.answer(result)  # the result overtakes that last report
    assert got == [result]
    assert recorded == [(Stage.AWAITING_APPROVAL, False), (Stage.DELIVERED, True)]
    assert delivery.running


async def test_a_running_report_on_a_delivered_job_is_recorded_once(autojump_clock):
    """``running`` without a stage change (no approval asked) is what the hub knows of
    the job's start: recorded (was: dropped, the stage being ``delivered`` already)."""
    recorded: list[tuple[Stage, bool]] = []

    async def record(stage: Stage, running: bool) -> None:
        recorded.append((stage, running))

    delivery = Outstanding(job_id="j1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(delivery.wait, record)
        await trio.testing.wait_all_tasks_blocked()
        delivery.report("running")
        await trio.testing.wait_all_tasks_blocked()
        delivery.report("running")
        delivery.answer(JobResult("d1", True, None))
    assert recorded == [(Stage.DELIVERED, True)]


def _hub(substrate):
    return types.SimpleNamespace(substrate=substrate, timings=Timings(), wall_clock=wall)


async def test_the_recorder_writes_each_stage_stamped_and_never_raises(autojump_clock):
    substrate = MemorySubstrate(clock=wall)
    record = stage_recorder(_hub(substrate), USER, "j1", "s1")
    await trio.sleep(7)
    await record(Stage.AWAITING_APPROVAL)
    state = await substrate.get_job_state(USER, "j1")
    assert state == JobState(Stage.AWAITING_APPROVAL, USER, at=EPOCH + 7, session_id="s1")
    await trio.sleep(1)
    await record(Stage.DELIVERED, True)
    state = await substrate.get_job_state(USER, "j1")
    assert state == JobState(Stage.DELIVERED, USER, at=EPOCH + 8, session_id="s1", running=True)
    with pytest.raises(InvalidTransition):  # the table is checked: a bug, never data
        await record(Stage.QUEUED)

    class Down:
        async def finish(self, *args, **kwargs):
            raise SubstrateUnavailable("redis down")

    class Hanging:
        async def finish(self, *args, **kwargs):
            await trio.sleep_forever()

    for broken in (Down(), Hanging()):
        started = trio.current_time()
        await stage_recorder(_hub(broken), USER, "j1", "s1")(Stage.AWAITING_APPROVAL)
        assert trio.current_time() - started <= 2.0  # CLEANUP_TIMEOUT_S bounds it


async def test_a_zombie_deliverys_stage_is_refused_by_the_fence(autojump_clock):
    """The entry was delivered again (a reclaim: a larger claim epoch); the old
    delivery's late stage report must not overwrite the new delivery's state."""
    substrate = MemorySubstrate(clock=wall)
    old = await substrate.mark_delivered(USER, "j1", JobState(Stage.DELIVERED, USER,
                                         session_id="s1", daemon_id="d1"), ttl_s=60)  # fmt: skip
    new_state = JobState(Stage.DELIVERED, USER, session_id="s2", daemon_id="d1")
    new = await substrate.mark_delivered(USER, "j1", new_state, ttl_s=60)
    assert new.epoch > old.epoch
    zombie = stage_recorder(_hub(substrate), USER, "j1", "s1", old.epoch)
    await zombie(Stage.AWAITING_APPROVAL)
    assert await substrate.get_job_state(USER, "j1") == new_state  # refused
    current = stage_recorder(_hub(substrate), USER, "j1", "s2", new.epoch)
    await current(Stage.AWAITING_APPROVAL)
    stored = await substrate.get_job_state(USER, "j1")
    assert (stored.stage, stored.session_id) == (Stage.AWAITING_APPROVAL, "s2")


async def test_a_stage_reported_after_the_job_s_answer_is_not_recorded(autojump_clock):
    """The desktop's stage report and the job's answer race (the report is recorded by
    the serving task while the result comes in): the answer came first, so the stage
    stays terminal (was: ``awaiting_approval`` over ``finished``, GET /v1/jobs said the
    answered job was waiting), and the recorder records nothing more."""
    substrate = MemorySubstrate(clock=wall)
    marked = await substrate.mark_delivered(
        USER, "j1", JobState(Stage.DELIVERED, USER, session_id="s1"), ttl_s=60
    )
    record = stage_recorder(_hub(substrate), USER, "j1", "s1", marked.epoch)
    done = JobState(Stage.FINISHED, USER, at=wall())
    await substrate.finish(USER, "j1", '"ok"', done, ttl_s=60, epoch=marked.epoch)
    await record(Stage.AWAITING_APPROVAL)
    assert await substrate.get_job_state(USER, "j1") == done
    writes = []
    finish = substrate.finish

    async def counted(*args, **kwargs):
        writes.append(args)
        return await finish(*args, **kwargs)

    substrate.finish = counted  # type: ignore[method-assign]
    await record(Stage.DELIVERED)
    assert writes == []  # settled once: the recorder stops
    assert await substrate.get_job_state(USER, "j1") == done


class _Executor:
    def __init__(self) -> None:
        self.jobs = []

    async def execute(self, job, epoch=None):
        self.jobs.append(job)
        return JobResult(job.id, True, None)

    async def cancel(self, job_id: str) -> None: ...

    def ended_reason(self) -> None:
        return None


async def test_each_delivery_says_how_long_the_job_waited_since_it_was_enqueued(autojump_clock):
    substrate = MemorySubstrate(clock=wall)
    server = EntryServer(substrate, Timings(), USER, "s1", wall)
    envelope = JobEnvelope("job-1", "echo", {}, "key-1", wall() + 300, wall())
    await substrate.claim_job(USER, "job-1", JobState(Stage.QUEUED, USER, at=wall()), ttl_s=300)
    await substrate.enqueue(USER, envelope.to_fields(), maxlen=100)
    await trio.sleep(42)  # the desktop was away
    (entry,) = await substrate.read_new(USER, "hub-1", count=10, block_ms=1)
    executor = _Executor()
    await server.serve(entry, executor)
    (job,) = executor.jobs
    assert abs(job.waited_s - 42.0) < 1e-6 and abs(job.timeout_s - 258.0) < 1e-6


def test_mcp_lists_a_tool_that_asks_with_a_note_and_its_meta():
    from deskbridge_hub._mcp import tool_entry

    def listed(spec):
        return tool_entry(spec).model_dump(by_alias=True, exclude_none=True)

    always = listed({"name": "pay", "description": "Pay it.", "approval_after_wait_s": 0})
    assert always["description"] == (
        "Pay it. Needs the approval of the person at the desktop before it runs.")
    assert always["_meta"] == {"deskbridge/approval_after_wait_s": 0}
    stale = listed({"name": "f", "approval_after_wait_s": 60.0})
    assert stale["description"] == ("Needs the approval of the person at the desktop before "
                                     "it runs when the call waited 60 s or more.")  # fmt: skip
    plain = listed({"name": "e", "description": "x"})
    assert plain["description"] == "x" and "_meta" not in plain


async def test_the_session_records_a_stage_with_its_deliverys_epoch(autojump_clock):
    """Through the real session: a stage report is recorded; once the entry was delivered
    again elsewhere (a newer epoch), the old delivery's report is refused."""
    from deskbridge_common import Hello, Job, Progress, Welcome
    from deskbridge_hub import Bridge
    from deskbridge_hub._session import HubState, serve_sidecar
    from deskbridge_hub.testing import socket_pair

    state = HubState(substrate=MemorySubstrate(clock=wall), timings=Timings(),
                     consumer="hub-1", wall_clock=wall)  # fmt: skip
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        nursery.start_soon(serve_sidecar, state, hub_side, USER)
        await peer.send(Hello(protocol_version=1, sidecar_version="test"))
        assert isinstance(await peer.receive(), Welcome)
        nursery.start_soon(lambda: bridge.dispatch(USER, "echo", {}, job_id="j1", timeout_s=60))
        job = await peer.receive()
        assert isinstance(job, Job)
        await peer.send(Progress(job.id, 0, stage="awaiting_approval"))
        await trio.testing.wait_all_tasks_blocked()
        mine = await state.substrate.get_job_state(USER, "j1")
        assert mine.stage is Stage.AWAITING_APPROVAL
        elsewhere = JobState(Stage.DELIVERED, USER, session_id="another")
        await state.substrate.mark_delivered(USER, "j1", elsewhere, ttl_s=60)  # a reclaim
        await peer.send(Progress(job.id, 0, stage="running"))
        await trio.testing.wait_all_tasks_blocked()
        stored = await state.substrate.get_job_state(USER, "j1")  # fenced out:
        assert (stored.stage, stored.session_id) == (Stage.DELIVERED, "another")
        nursery.cancel_scope.cancel()
