"""A job's log lines never tell two different final outcomes (docs/operations.md, "Logs").

A call answered ``timeout`` (or ``unavailable`` while it waited) whose job a holder then
finished used to log two INFO lines on ``deskbridge.hub.jobs``: "job J answered: timeout"
and "job J finished: completed", both with an ``outcome`` field. Now the caller's answer
is its own kind of line (``deskbridge.hub.calls``, "call for job J answered: timeout",
field ``answer``), and ``deskbridge.hub.jobs`` has at most one line per job: its outcome,
from the holder that finished it."""

from __future__ import annotations

import logging

import pytest
import trio
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge
from deskbridge_hub._delivery import EntryServer
from deskbridge_hub._memory import MemorySubstrate

from tests.hub.test_delivery import USER, FakeExecutor, wall


def _by_job(caplog: pytest.LogCaptureFixture, job_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "job_id", None) == job_id]


class _Slow(FakeExecutor):
    """Runs each job for 10 s, then completes it (the caller gave up at 5 s)."""

    async def execute(self, job: Job, epoch: int | None = None) -> JobResult:
        await trio.sleep(10)
        return JobResult(job.id, True, job.args)


async def test_a_timed_out_job_that_finishes_later_tells_one_outcome(autojump_clock, caplog):
    substrate = MemorySubstrate(clock=wall)
    bridge = Bridge(substrate, Timings(), wall_clock=wall)
    server = EntryServer(substrate, Timings(), USER, "session-1", wall)
    await substrate.set_presence(USER, "session-1", 300)

    async def holder() -> None:  # takes the job at once; it runs past the caller's wait
        while not (entries := await substrate.read_new(USER, "hub-1", count=1, block_ms=1)):  # noqa: ASYNC110
            await trio.sleep(0.1)
        await server.serve(entries[0], _Slow())

    with caplog.at_level(logging.INFO, logger="deskbridge.hub"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            answered = await bridge.dispatch(USER, "echo", {"x": 1}, job_id="job-1", timeout_s=5)
            assert (answered.status, answered.detail["stage"]) == ("timeout", "delivered")
        assert (await substrate.get_job_state(USER, "job-1")).stage.value == "finished"
    records = _by_job(caplog, "job-1")
    outcomes = {r.outcome for r in records if hasattr(r, "outcome")}
    assert outcomes == {"completed"}, [(r.name, r.getMessage()) for r in records]
    jobs = [r.getMessage() for r in records if r.name == "deskbridge.hub.jobs"]
    assert jobs == ["job job-1 finished: completed (echo)"]
    calls = [(r.getMessage(), r.answer) for r in records if r.name == "deskbridge.hub.calls"]
    assert calls == [("call for job job-1 answered: timeout (echo for u1)", "timeout")]


async def test_an_offline_answer_is_a_call_line_and_no_job_line(autojump_clock, caplog):
    bridge = Bridge(MemorySubstrate(clock=wall), Timings(), wall_clock=wall)
    with caplog.at_level(logging.INFO, logger="deskbridge.hub"):
        assert (await bridge.dispatch(USER, "echo", {}, job_id="job-2")).status == "offline"
    lines = [(r.name, r.getMessage(), getattr(r, "answer", None), hasattr(r, "outcome"))
             for r in _by_job(caplog, "job-2")]  # fmt: skip
    assert lines == [
        ("deskbridge.hub.calls", "call for job job-2 answered: offline (echo for u1)",
         "offline", False)
    ]  # fmt: skip
