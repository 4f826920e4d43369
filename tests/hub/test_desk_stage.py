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
    ON_DESKTOP,
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
    assert not A.terminal and ON_DESKTOP == {D, A, I}
    assert STAGE_OF_DESK == {"awaiting_approval": A, "running": D}
    assert "approval" in _TIMEOUT_MESSAGES["awaiting_approval"]


async def test_each_stage_change_is_recorded_in_order_then_the_result_returned(autojump_clock):
    recorded: list[Stage] = []

    async def record(stage: Stage) -> None:
        await trio.sleep(1)  # a slow write: reports meanwhile are coalesced, not lost
        recorded.append(stage)

    delivery = Outstanding(job_id="j1")
    result = JobResult("d1", True, {"ok": 1})
    async with trio.open_nursery() as nursery:
        got: list[JobResult] = []

        async def waiter() -> None:
            got.append(await delivery.wait(record))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        delivery.report(None)  # a plain progress report: nothing to record
        delivery.report("running")  # already delivered: nothing to record
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
    assert recorded == [Stage.AWAITING_APPROVAL, Stage.DELIVERED]


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
    await record(Stage.DELIVERED)
    state = await substrate.get_job_state(USER, "j1")
    assert state == JobState(Stage.DELIVERED, USER, at=EPOCH + 8, session_id="s1")
    with pytest.raises(InvalidTransition):  # the table is checked: a bug, never data
        await record(Stage.QUEUED)

    class Down:
        async def set_job_state(self, *args, **kwargs):
            raise SubstrateUnavailable("redis down")

    class Hanging:
        async def set_job_state(self, *args, **kwargs):
            await trio.sleep_forever()

    for broken in (Down(), Hanging()):
        started = trio.current_time()
        await stage_recorder(_hub(broken), USER, "j1", "s1")(Stage.AWAITING_APPROVAL)
        assert trio.current_time() - started <= 2.0  # CLEANUP_TIMEOUT_S bounds it


class _Executor:
    def __init__(self) -> None:
        self.jobs = []

    async def execute(self, job):
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
