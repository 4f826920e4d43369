"""One delivery awaited on a sidecar socket, and the desktop's stage of it (issue 12 item 5).

A sidecar reports where a delivery is on the desktop in its ``progress`` frames (the
optional ``stage``: ``awaiting_approval`` while a tool waits for the person's approval,
``running`` once it may run). The session's reader hands each report to the delivery's
:class:`Outstanding` without waiting (invariant 4: reading never waits on work); the task
that serves the delivery (``_delivery.EntryServer`` through ``HubSession.execute``)
records the change as the job state (``awaiting_approval`` / ``delivered``, and
``running`` once the desktop reported it: the only way the hub knows a job may have
started) while it waits for the ``job_result``. So a stage is written by the same task,
before the terminal state that task writes after publishing the result: a late stage can
never overwrite
``finished``. Recording is best effort and bounded (``CLEANUP_TIMEOUT_S``): the caller's
outcome never waits on it for longer, and never depends on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import STAGE_RUNNING, JobResult

from ._errors import SubstrateUnavailable
from ._jobstate import STAGE_OF_DESK, JobState, Stage, forwarded_keep_s
from ._retry import CLEANUP_TIMEOUT_S

if TYPE_CHECKING:
    from ._process import HubState

log = logging.getLogger("deskbridge.hub.session")

#: Records that a delivered job entered a stage (``delivered`` / ``awaiting_approval``),
#: and whether the desktop reported it ``running`` (the tool may run: it may have acted).
RecordStage = Callable[[Stage, bool], Awaitable[None]]


@attrs.define(eq=False)
class Outstanding:
    """A delivery sent on this socket whose ``job_result`` is awaited.

    Attributes:
        job_id: the job it delivers.
        done: set once the result came.
        result: the sidecar's ``job_result``, once it came.
        stage: the latest stage the desktop reported (``progress.stage``), or None.
        running: the desktop reported ``running`` (the tool may run) at least once.
        cancel_sent: its ``cancel`` frame was sent (once: a cancel notice and the job's
            control entry both ask for it, ``_cancel_notice``).
        epoch: the delivery's claim epoch (None: not known), which a cancel notice
            writes back with the delivery over a state rewound to ``queued``.
    """

    job_id: str
    done: trio.Event = attrs.field(factory=trio.Event)
    result: JobResult | None = None
    stage: str | None = None
    running: bool = False
    cancel_sent: bool = False
    epoch: int | None = None
    _wake: trio.Event = attrs.field(factory=trio.Event)

    def answer(self, result: JobResult) -> None:
        """The reader got the delivery's ``job_result`` (never blocks)."""
        self.result = result
        self.done.set()
        self._wake.set()

    def report(self, stage: str | None) -> None:
        """The reader got a ``progress`` frame; remember its stage (never blocks)."""
        if stage is not None and stage != self.stage:
            self.stage = stage
            self.running = self.running or stage == STAGE_RUNNING
            self._wake.set()

    async def wait(self, record: RecordStage) -> JobResult:
        """Wait for the result, recording each stage change reported meanwhile.

        Args:
            record: called with each change of the stage or of ``running`` (the
                desktop reported ``running`` once, which is kept), in order (the job starts
                ``delivered``, not running).

        Returns:
            The ``job_result``. A stage still unrecorded when it came is dropped: the
            terminal state follows at once.

        Cancellation: propagates (the socket went away); nothing more is recorded.
        """
        recorded, running = Stage.DELIVERED, False
        while not self.done.is_set():
            await self._wake.wait()
            self._wake = trio.Event()
            if self.done.is_set() or self.stage is None:
                continue
            stage = STAGE_OF_DESK[self.stage]
            now_running = running or self.stage == STAGE_RUNNING
            if stage is not recorded or now_running != running:
                recorded, running = stage, now_running
                await record(stage, running)
        assert self.result is not None
        return self.result


def stage_recorder(
    hub: HubState, user_id: str, job_id: str, session_id: str, epoch: int | None = None
) -> RecordStage:
    """A :data:`RecordStage` for one delivery of ``job_id`` on ``session_id``: each stage
    goes through the transition table from ``delivered`` and is written as the job state
    (stamped now, ``result_ttl_s``) by the substrate's fenced step (``finish`` without a
    payload or an XACK): with the delivery's ``epoch``, a newer delivery's state stays
    (a zombie's report is refused, and it records nothing more). Bounded by
    ``CLEANUP_TIMEOUT_S``; a substrate error or the bound is logged and passed over
    (never raised)."""
    state: JobState | None = None  # built at the first report (most jobs report none)
    fenced_out = False

    async def record(stage: Stage, running: bool = False) -> None:
        nonlocal state, fenced_out
        if fenced_out:
            return
        if state is None:
            state = JobState(Stage.DELIVERED, user_id, session_id=session_id)
        state = state.advance(stage, at=hub.wall_clock())  # InvalidTransition: a bug here
        state = attrs.evolve(state, running=state.running or running)
        finished = None
        with trio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                finished = await hub.substrate.finish(
                    user_id,
                    job_id,
                    None,
                    state,
                    epoch=epoch,
                    ttl_s=forwarded_keep_s(hub.timings.result_ttl_s),
                )
            except SubstrateUnavailable as exc:
                log.info("job %s: stage %s not recorded: %s", job_id, stage, exc)
                return
        if finished is None:
            log.info("job %s: stage %s not recorded within %g s", job_id, stage,
                     CLEANUP_TIMEOUT_S)  # fmt: skip
        elif finished.verdict == "settled":  # the job's answer came first: it stays
            fenced_out = True
            log.info("job %s: stage %s after its answer, not recorded", job_id, stage)
        elif finished.verdict == "stale":
            fenced_out = True
            log.warning("job %s: stage %s of a stale delivery (epoch %s, newest %s) refused",
                        job_id, stage, epoch, finished.newest)  # fmt: skip
        else:
            log.info("job %s: %s%s on the desktop", job_id, stage, " (running)" * state.running)

    return record


__all__ = ["Outstanding", "RecordStage", "stage_recorder"]
