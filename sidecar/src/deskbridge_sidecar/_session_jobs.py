"""The job side of a sidecar ``Session`` (mixed in): admitting a ``job`` frame (dedupe
and preflight through the daemon's ``ToolRunner``, or the status queue), a ``cancel``
frame, the strictly serial tool worker, the status worker, ``progress`` frames and the
one place a delivery is answered (``_answer``). The socket, the Connection and the
other tasks stay in ``_session``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import EXPIRED, Cancel, Frame, Job
from deskbridge_common import Progress as ProgressFrame

from ._logformat import fields
from ._outcome import CANCELLED, Outcome
from ._progress import ProgressUpdate
from ._runner import ToolRunner
from ._tools import STATUS_TOOL
from ._tracing import tool_span, trace_id

log = logging.getLogger("deskbridge.sidecar.session")


class SessionJobs:
    """Job admission and the workers of :class:`~deskbridge_sidecar._session.Session`."""

    runner: ToolRunner
    wall_clock: Callable[[], float]
    _deliveries: dict[str, Job]
    _tool_queue: trio.MemorySendChannel[Job] | None
    _status_queue: trio.MemorySendChannel[Job] | None

    if TYPE_CHECKING:

        async def _post(self, frame: Frame) -> None: ...

        def status(self) -> dict[str, object]: ...

    async def _on_job(self, job: Job) -> None:
        assert self._tool_queue is not None and self._status_queue is not None
        if job.timeout_s is not None:
            # The hub's clock and ours differ: the time left is a duration, and from here
            # on the deadline is on our own clock (docs/operations.md, "Clocks").
            job = attrs.evolve(job, deadline=self.wall_clock() + job.timeout_s)
        if job.name == STATUS_TOOL:
            self._deliveries[job.id] = job
            self._status_queue.send_nowait(job)
            return
        answer = self.runner.admit(job)  # dedupe and preflight, once per delivery
        if answer is not None:
            log.info(
                "job %s (%s): answered at once (%s)", job.job_id, job.name, answer.code or "ok"
            )
            await self._post(answer.reply(job.id))
            return
        self._deliveries[job.id] = job
        self._tool_queue.send_nowait(job)

    async def _on_cancel(self, cancel: Cancel) -> None:
        job = self._deliveries.get(cancel.id)
        if job is None:
            return  # its answer is queued already (crossed the cancel)
        if job.name == STATUS_TOOL:
            return
        key = job.idempotency_key
        if self.runner.in_flight(key):
            # The tool worker answers with the run's outcome: "cancelled" if it could be
            # cancelled, the real outcome if it is a sync tool that cannot.
            self.runner.cancel(key)
            return
        if self.runner.answers_from_record(job):
            # Its key has a record (a run of it started here, maybe before a restart): the
            # tool worker answers from it (the hub asks so after a cancel: ``_delivery``);
            # "cancelled before it started" would be a lie about a job that ran.
            return
        # Still queued in this session: never start it, and remember that.
        outcome = self.runner.cached(key)
        if outcome is None:
            outcome = Outcome.failure(CANCELLED, "cancelled by the hub before it started")
            self.runner.record(key, outcome, job)
        await self._answer(job.id, outcome)

    # -- workers -----------------------------------------------------------------------

    async def _answer(self, delivery_id: str, outcome: Outcome) -> None:
        if self._deliveries.pop(delivery_id, None) is None:
            return  # answered already (cancelled while queued)
        await self._post(outcome.reply(delivery_id))

    async def _tool_worker(self, queue: trio.MemoryReceiveChannel[Job]) -> None:
        async for job in queue:
            if job.id not in self._deliveries:
                continue
            started = trio.current_time()
            with tool_span(job):  # the caller's trace context, current for the tool
                outcome = await self.runner.execute(
                    job, on_progress=functools.partial(self._progress, job.id)
                )
            log.info(
                "job %s (%s): %s",
                job.job_id,
                job.name,
                "ok" if outcome.ok else outcome.code,
                extra=fields(
                    job_id=job.job_id,
                    tool=job.name,
                    outcome="completed" if outcome.ok else outcome.code,
                    elapsed_s=trio.current_time() - started,
                    trace_id=trace_id(job.traceparent),
                ),
            )
            await self._answer(job.id, outcome)

    async def _progress(self, delivery_id: str, update: ProgressUpdate) -> None:
        """A ``progress`` frame for a delivery still waiting on its run (``_post`` drops
        it once the connection no longer allows it: after the job_result)."""
        await self._post(
            ProgressFrame(
                id=delivery_id,
                progress=update.progress,
                total=update.total,
                message=update.message,
                stage=update.stage,
            )
        )

    async def _status_worker(self, queue: trio.MemoryReceiveChannel[Job]) -> None:
        async for job in queue:
            now = self.wall_clock()
            if now >= job.deadline:
                outcome = Outcome.failure(EXPIRED, "deadline passed before status ran")
            else:
                self.runner.executions[STATUS_TOOL] += 1
                outcome = Outcome.success(self.status())
            await self._answer(job.id, outcome)
