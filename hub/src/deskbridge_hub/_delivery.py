"""Serving one stream entry: everything between reading it and acknowledging it.

Socket-free: the session hands each entry to :meth:`EntryServer.serve` with an
:class:`Executor` (its socket, seen as "run this job, give me its result"), so the rules
below are tested alone (tests/hub/test_delivery.py) on the memory substrate.

For one entry, in order:

1. a body trimmed or deleted before anyone received it -> answer ``lost`` (once: whoever
   removes the index record answers);
2. a cancel control entry -> tell the executor, XACK;
3. a body that does not decode -> ``failed`` (``malformed``), XACK;
4. mark it delivered in one atomic step on the substrate's clock (Redis ``TIME``; done by
   the process reader in the step that read it, when it came as a new entry): past
   its deadline -> ``expired``, XACK; cancel flag set -> ``cancelled`` (before it
   started), XACK, or, if it had been forwarded before (it may have run; fenced: the old
   delivery's late answer is refused), ``in_doubt`` when an earlier delivery went to
   another desktop (or one not known), else forwarded to this desktop for its answer
   only (no time left: its ledger joins the run or answers from its record, never
   starts it afresh) with the cancel right behind it: the desktop's own answer, and
   ``cancelled`` for its "expired" (never started) (docs/operations.md, "Clocks");
   the same step raises the job's claim epoch (fencing token) and returns it;
6. forward it under a fresh delivery ``id`` and wait for the sidecar's ``job_result``
   (meanwhile the process keeps the job's records alive: ``_keepalive``);
   a job no sidecar could accept -> ``failed`` (``bad_job``); the socket went away ->
   record ``interrupted`` and leave the entry pending (it is redelivered); the session
   was ended on purpose -> ``in_doubt`` at once, provisional (``detail.pending``, the
   entry stays pending) unless another process took the user over (final, XACK);
   a desktop that refuses it as late (``expired``) after an earlier delivery went to
   another desktop (or one not known: ``Marked.elsewhere``) -> ``in_doubt``: that one
   may have started it;
7. finish, in one step (``Substrate.finish``, retried until it happens): check the
   fence, publish the result, record the terminal stage, XACK.

Invariant 3 (DESIGN.md): XACK only after the result is durable. Every answer goes through
:meth:`EntryServer.finish`, whose one substrate step writes the result before the XACK.

Fenced deliveries (issue 12 item 3): every delivery of a job gets a larger claim epoch
than the one before (a reclaim or a takeover delivers it again), and the finishing step
accepts an answer only with the newest one. A stale executor's answer (a zombie whose
entry was reclaimed meanwhile) is refused: nothing published, no state, no XACK; one
WARNING and ``deskbridge_stale_results_total``. Answers no delivery produced (lost,
malformed, expired, cancelled before start) carry no epoch and are not fenced.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Protocol

import attrs
import trio
from deskbridge_common import (
    BAD_JOB,
    BAD_RESULT,
    MALFORMED,
    OUTCOME_ERROR_CODES,
    Job,
    JobResult,
    LocalProtocolError,
    Timings,
    holds_lone_surrogate,
    replace_lone_surrogates,
)

from . import _metrics
from ._bridge_jobs import minted_user
from ._errors import SubstrateUnavailable
from ._jobs import (
    JobEnvelope,
    MalformedEntry,
    cancelled_before_start,
    cancelled_in_doubt_payload,
    cancelled_unstarted_payload,
    delivered_elsewhere_payload,
    expired_payload,
    failed_payload,
    interrupted_payload,
    lost_payload,
    result_payload,
)
from ._jobstate import (
    FORWARDED,
    STAGE_OF_OUTCOME,
    JobState,
    MalformedState,
    Stage,
    forwarded_keep_s,
)
from ._keepalive import RunningJobs
from ._retry import CLEANUP_TIMEOUT_S, retrying
from ._substrate import Entry, Finished, Substrate

log = logging.getLogger("deskbridge.hub.delivery")


class Executor(Protocol):
    """Where a delivered job runs: the session's socket, or a test's fake."""

    async def execute(self, job: Job, *, epoch: int | None = None) -> JobResult:
        """Forward ``job`` and return the sidecar's result for it.

        ``epoch`` is the delivery's claim epoch: what the executor writes about the job
        meanwhile (the desktop's stage, ``_desk_stage``) is fenced with it.

        Raises:
            LocalProtocolError: the job cannot be sent (no sidecar could accept it).

        Cancellation: the socket went away (or the session ended) before the result came.
        """

    async def cancel(self, job_id: str) -> None:
        """Ask the sidecar to cancel its running delivery of ``job_id``, if it has one."""

    def ended_reason(self) -> str | None:
        """Why the session ended on purpose (token expired, superseded, hub restarting),
        or None while it runs or when the socket just went away."""

    def reported_running(self, job_id: str) -> bool:
        """Whether the desktop reported ``running`` for the delivery of ``job_id`` that
        just ended unanswered (read once; False: no report, or not known)."""

    def handed_over(self) -> bool:
        """Whether the session ended because a newer session of its user took over
        through another hub process (4001): perhaps another desktop, whose ledger does
        not know this job. Then an ``in_doubt`` at the end is final (the entry is
        acknowledged, never delivered again); otherwise (1012, 4003: the same desktop
        comes back) it is provisional."""


def outcome_of(result: JobResult) -> tuple[str, str]:
    """The outcome name and the result payload for a sidecar's ``job_result``.

    Text that is not valid Unicode (a lone surrogate, from an older sidecar: today's
    answers ``bad_result`` itself) never reaches a caller: such a result is ``failed``
    ``bad_result`` (the tool ran; its value cannot be given as text), and an error
    message (or code) has U+FFFD in its place. Refusing the frame instead would close the socket,
    and the same desktop's ledger would send the same answer again at each redelivery."""
    if result.ok:
        payload = result_payload("completed", result=result.result)
        if not holds_lone_surrogate(payload):
            return "completed", payload
        error = {
            "code": BAD_RESULT,
            "message": "the desktop's result is not valid Unicode text (a lone surrogate)",
        }
        return "failed", result_payload("failed", error=error)
    code = replace_lone_surrogates(result.error.code) if result.error else "failed"
    message = replace_lone_surrogates(result.error.message) if result.error else "failed"
    status = code if code in OUTCOME_ERROR_CODES else "failed"
    return status, result_payload(status, error={"code": code, "message": message})


async def _ask_with_cancel(executor: Executor, job: Job, epoch: int | None) -> JobResult:
    """Forward ``job`` and send its cancel right behind it (the executor registers a
    delivery before its first checkpoint, so the cancel finds it); return its result.

    Raises: as :meth:`Executor.execute`. Cancellation: as :meth:`Executor.execute`."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(executor.cancel, job.job_id)
        return await executor.execute(job, epoch=epoch)


@attrs.define(eq=False)
class EntryServer:
    """Serves entries of one user's stream on behalf of one session.

    Attributes:
        substrate: the shared substrate.
        timings: ``result_ttl_s`` bounds results and job states.
        user_id: whose stream.
        session_id: recorded in the ``delivered`` state.
        wall_clock: Unix time source (stamps states; never judges a deadline).
        daemon_id: the desktop this session serves (``hello.daemon_id``), if it said;
            recorded with each delivery (``JobState.daemon_id``).
        running_jobs: the process's running jobs (``_keepalive``): a forwarded job is in it
            until its executor returns, so its records live as long as it runs; None:
            not kept (tests of one step).
        tools: the tool names the desktop announced (``hello.tools``): only these take
            a ``tool`` label of their own on the per-tool metrics (an entry's name is
            whatever its caller sent; a desktop with no catalogue checks nothing).
    """

    substrate: Substrate
    timings: Timings
    user_id: str
    session_id: str
    wall_clock: Callable[[], float]
    daemon_id: str | None = None
    running_jobs: RunningJobs | None = None
    tools: frozenset[str] = frozenset()

    def knows(self, name: object) -> bool:
        """Whether ``name`` is a tool of this desktop: announced, or ``status`` (every
        desktop's)."""
        return name == "status" or name in self.tools

    async def serve(self, entry: Entry, executor: Executor) -> None:
        """Serve ``entry`` to its terminal answer, or leave it pending if the executor
        went away (see the module docstring).

        Raises:
            Nothing for a bad entry; substrate errors on writes that must happen are
            retried until they succeed.

        Cancellation: a job already forwarded is recorded ``interrupted`` (shielded,
        bounded by ``CLEANUP_TIMEOUT_S``); the entry stays pending.
        """
        if entry.fields is None:
            await self.answer_lost(entry.entry_id, None)
            return
        if entry.fields.get("control") == "cancel":
            await executor.cancel(entry.fields.get("job_id", ""))
            await self.ack(entry.entry_id)
            return
        try:
            envelope = JobEnvelope.from_fields(entry.fields)
        except MalformedEntry as exc:
            log.error(
                "user %s: malformed entry %s (%s); acked and dropped",
                self.user_id,
                entry.entry_id,
                exc,
            )
            job_id = entry.fields.get("job_id")
            if job_id:
                payload = failed_payload(MALFORMED, str(exc))
                tool = entry.fields.get("name")
                key = entry.fields.get("idempotency_key")
                await self.finish(
                    entry.entry_id, job_id, "failed", payload, tool=tool, idempotency_key=key
                )
            else:
                _metrics.job_served(self, "failed", tool=entry.fields.get("name"))
                await self.ack(entry.entry_id)
            return
        job_id = envelope.job_id
        # The deadline was set on the substrate's clock (Redis TIME) and is judged there, in
        # the step that records the delivery: no hub's own clock decides it. The process
        # reader usually took that step with the read (``read_new_delivered``).
        marked = entry.marked
        if marked is None:
            marked = await retrying(
                lambda: self.substrate.mark_delivered(
                    self.user_id,
                    job_id,
                    self.delivered_state(),
                    ttl_s=forwarded_keep_s(self.timings.result_ttl_s),
                    deadline=envelope.deadline,
                    idempotency_key=envelope.idempotency_key,
                ),
                what=f"mark {job_id} delivered",
            )
        if marked.verdict == "expired":
            await self.finish(
                entry.entry_id, job_id, "expired", expired_payload(), envelope=envelope
            )
            return
        if marked.verdict == "cancelled":
            await self.finish(
                entry.entry_id, job_id, "cancelled", cancelled_before_start(), envelope=envelope
            )
            return
        # cancelled, but forwarded before: it may have run. Only the desktop can tell, so
        # unless an earlier delivery went to another (or one not known), it is asked
        ask = marked.verdict == "in_doubt" and not marked.elsewhere and bool(self.daemon_id)
        if marked.verdict == "in_doubt" and not ask:
            await self.finish(
                entry.entry_id, job_id, "in_doubt", cancelled_in_doubt_payload(),
                envelope=envelope, epoch=marked.epoch,
            )  # fmt: skip
            return
        server_time = marked.server_time
        if entry.received_at is not None:
            # Pushed: marked in the caller's step at submit, popped at ``received_at``;
            # the time this process has held it since counts against the deadline (a
            # stalled holder must not hand the desktop a fresh budget).
            server_time += max(0.0, trio.current_time() - entry.received_at)
            if server_time >= envelope.deadline:  # never forwarded: it did not run
                await self.finish(
                    entry.entry_id, job_id, "expired", expired_payload(),
                    envelope=envelope, epoch=marked.epoch,
                )  # fmt: skip
                return
        # The sidecar gets the time left as a duration (its clock may be anything);
        # ``deadline`` is that duration on this hub's clock, for older sidecars.
        # asked for its answer only: no time left, so the desktop never starts it afresh
        left_s = 0.0 if ask else max(0.0, envelope.deadline - server_time)
        epoch = marked.epoch
        running = (self.user_id, job_id, envelope.idempotency_key)
        if self.running_jobs is not None:
            self.running_jobs.add(*running)
            if minted_user(job_id) is None:  # a chosen id: its owner record as the state
                self.running_jobs.keep_id(job_id)
        try:
            job = Job(
                id=uuid.uuid4().hex,  # a fresh id per delivery (invariant 2)
                job_id=job_id,
                name=envelope.name,
                args=envelope.args,
                idempotency_key=envelope.idempotency_key,
                deadline=self.wall_clock() + left_s,
                timeout_s=left_s,
                traceparent=envelope.traceparent,
                waited_s=max(0.0, server_time - envelope.enqueued_at),
            )
            _metrics.job_dispatched(
                envelope.name, server_time - envelope.enqueued_at, known=self.knows(envelope.name)
            )
            if ask:
                result = await _ask_with_cancel(executor, job, epoch)
            else:
                result = await executor.execute(job, epoch=epoch)
        except LocalProtocolError as exc:
            # An entry no sidecar could accept (written by a buggy producer): answer it
            # as failed instead of letting it crash every session it is redelivered to.
            log.error("user %s: entry %s cannot be sent: %s", self.user_id, entry.entry_id, exc)
            payload = failed_payload(BAD_JOB, exc.reason)
            await self.finish(
                entry.entry_id, job_id, "failed", payload, envelope=envelope, epoch=epoch
            )
            return
        except BaseException:
            reason = getattr(executor, "ended_reason", lambda: None)()
            # what the hub knows of its start: the desktop's ``running`` report, or none
            ran = getattr(executor, "reported_running", lambda _: False)(job_id)
            if reason is not None:  # ended on purpose: tell the caller now (issue 11.4)
                final = getattr(executor, "handed_over", lambda: False)()
                await self._answer_interrupted(
                    entry.entry_id, job_id, reason, envelope, epoch, final=final, running=ran
                )
            else:
                # the socket went away with it
                await self._mark_interrupted(
                    job_id, epoch, envelope.idempotency_key, running=ran
                )
            raise
        finally:
            if self.running_jobs is not None:
                self.running_jobs.discard(*running)
        status, payload = outcome_of(result)
        if status == "expired" and ask:
            # the desktop every delivery went to never started it (its ledger holds no
            # run of the key): the cancel came first
            status, payload = "cancelled", cancelled_unstarted_payload()
        elif status == "expired" and marked.elsewhere:
            # "I never started it" from this desktop; an earlier delivery went to another
            # (or one not known), which may have: never "did not run" (expired)
            status, payload = "in_doubt", delivered_elsewhere_payload()
        await self.finish(entry.entry_id, job_id, status, payload, envelope=envelope, epoch=epoch)

    def delivered_state(self) -> JobState:
        """The state a delivery by this session records (``mark_delivered``)."""
        return JobState(
            Stage.DELIVERED, self.user_id, at=self.wall_clock(), session_id=self.session_id,
            daemon_id=self.daemon_id,
        )  # fmt: skip

    async def finish(
        self,
        entry_id: str,
        job_id: str,
        status: str,
        payload: str,
        *,
        envelope: JobEnvelope | None = None,
        tool: str | None = None,
        epoch: int | None = None,
        idempotency_key: str | None = None,
        notify: str | None = None,
    ) -> None:
        """Answer the entry in one substrate step (retried until it happens): the fence,
        the result (durable first), the terminal stage, the XACK.

        Args:
            entry_id: the stream entry answered.
            job_id: its job.
            status: the payload's outcome (``_jobs.OUTCOMES``).
            payload: the result payload.
            envelope: the decoded entry, if it decoded (metrics and the job's log line).
            tool: the tool's name when the entry did not decode.
            epoch: the delivery's claim epoch (None: an answer no delivery produced).
            idempotency_key: the job's key when the entry did not decode (or its fields
                are gone): the answer is kept as long as the key's record.
            notify: the caller's mailbox when there is no envelope (from the job state).

        A newer delivery of the job (larger epoch) refuses the answer: it is logged and
        counted, nothing is written, and the entry is left to that delivery.

        Raises:
            Store errors other than ``SubstrateUnavailable`` (a programming error, or a
            key of another type): the entry stays pending.
        """
        terminal = JobState(STAGE_OF_OUTCOME[status], self.user_id, at=self.wall_clock())
        finished = await retrying(
            lambda: self.substrate.finish(
                self.user_id,
                job_id,
                payload,
                terminal,
                ttl_s=self.timings.result_ttl_s,
                entry_id=entry_id,
                epoch=epoch,
                notify=envelope.reply_to if envelope is not None else notify,
                idempotency_key=envelope.idempotency_key
                if envelope is not None
                else idempotency_key,
            ),
            what=f"finish {job_id}",
        )
        if finished.verdict == "stale":
            self._refused(job_id, status, epoch, finished)
        elif finished.verdict == "settled":
            self._settled(job_id, status)
        else:
            _metrics.job_served(self, status, envelope, job_id=job_id, tool=tool)

    def _settled(self, job_id: str, status: str) -> None:
        log.info(
            "user %s: job %s had its answer already (another writer was first, e.g. a "
            "cancel); this one (%s) dropped, its entry acked",
            self.user_id,
            job_id,
            status,
        )

    def _refused(self, job_id: str, status: str, epoch: int | None, finished: Finished) -> None:
        _metrics.stale_result()
        log.warning(
            "user %s: stale answer (%s) of job %s refused: delivery epoch %s, newest %s "
            "(the entry was delivered again meanwhile; that delivery answers)",
            self.user_id,
            status,
            job_id,
            epoch,
            finished.newest,
        )

    async def ack(self, entry_id: str) -> None:
        """XACK ``entry_id`` (retried until it succeeds)."""
        await retrying(lambda: self.substrate.ack(self.user_id, entry_id), what=f"XACK {entry_id}")

    async def answer_deleted(self, entry_ids: list[str]) -> None:
        """After a reclaim pass: settle pending entries whose body is gone (XAUTOCLAIM's
        deleted IDs: they were read, maybe delivered and still running elsewhere) and
        indexed entries trimmed before any consumer read them (see :meth:`answer_lost`)."""
        found = await self.substrate.job_ids(self.user_id, entry_ids) if entry_ids else {}
        for entry_id, job_id in found.items():
            await self.answer_lost(entry_id, job_id, owned=False)
        for entry_id, job_id in await self.substrate.trimmed(self.user_id):
            await self.answer_lost(entry_id, job_id, owned=False)

    async def answer_lost(self, entry_id: str, job_id: str | None, *, owned: bool = True) -> None:
        """Settle an entry whose body is gone (issue 11.3: "lost" only for work that never
        ran). The job state decides, because a job is marked ``delivered`` before any
        executor can receive it:

        * still ``queued`` (no executor ever received it): answer ``lost``; only the call
          that removes the index record answers, so a caller is told once;
        * ``delivered`` / ``interrupted``: not lost. If ``owned`` (our own pending entry,
          not in flight here: the delivery that carried it ended without an answer) the
          entry is dropped, since it cannot be redelivered without its body; the caller's
          wait ends with that stage. Otherwise its holder (maybe another process) answers;
        * terminal, or no state left (answered, or long over): drop the index record.

        ``owned`` entries are XACKed in every case.
        """
        if job_id is None:
            job_id = (await self.substrate.job_ids(self.user_id, [entry_id])).get(entry_id)
        state = None if job_id is None else await self._state(job_id)
        stage = None if state is None else state.stage
        if job_id is not None and stage is Stage.QUEUED:
            if await self.substrate.forget(self.user_id, entry_id):
                log.warning(
                    "user %s: entry %s (job %s) was trimmed or deleted before it ran",
                    self.user_id,
                    entry_id,
                    job_id,
                )
                # (the key from the queued state: the entry's fields are gone, and the
                # answer must be kept as long as the key's record, docs/outcomes.md)
                await self.finish(
                    entry_id, job_id, "lost", lost_payload(),
                    idempotency_key=None if state is None else state.idempotency_key,
                    notify=None if state is None else state.reply_to,
                )  # fmt: skip
                return
        elif job_id is not None and (owned or stage is None or stage.terminal):
            if owned and stage in FORWARDED:
                log.warning(
                    "user %s: entry %s (job %s) was trimmed after it was delivered; its "
                    "outcome is unknown (the caller's wait ends with stage %s)",
                    self.user_id,
                    entry_id,
                    job_id,
                    stage,
                )
            await self.substrate.forget(self.user_id, entry_id)
        if owned:
            await self.ack(entry_id)

    async def _state(self, job_id: str) -> JobState | None:
        try:
            return await self.substrate.get_job_state(self.user_id, job_id)
        except MalformedState:
            return None

    async def _answer_interrupted(
        self,
        entry_id: str,
        job_id: str,
        reason: str,
        envelope: JobEnvelope,
        epoch: int | None,
        *,
        final: bool,
        running: bool = False,
    ) -> None:
        """The session ended on purpose while the job was on the desktop: tell its caller
        ``in_doubt`` (it may have acted) at once with the stage ``interrupted``, fenced,
        shielded and bounded by ``CLEANUP_TIMEOUT_S``. ``running``: the desktop reported
        it running (else the answer says it was not known to have started).

        ``final`` (a takeover through another process, perhaps by another desktop): the
        answer is published as the job's result and the entry acknowledged, so it is
        never delivered again. Otherwise the answer is provisional (``detail.pending``,
        the caller's mailbox only, not the result list) and the entry stays pending: its
        redelivery to the returning desktop is answered from its ledger, never run
        twice, and that real outcome is what a retry with the same key gets."""
        log.warning(
            "user %s: session ended (%s) with job %s on the desktop; its caller is answered "
            "in_doubt",
            self.user_id,
            reason,
            job_id,
        )
        stage = STAGE_OF_OUTCOME["in_doubt"] if final else Stage.INTERRUPTED
        state = JobState(stage, self.user_id, at=self.wall_clock(), running=running)
        finished = None
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            try:
                finished = await self.substrate.finish(
                    self.user_id,
                    job_id,
                    interrupted_payload(
                        reason,
                        pending=not final,
                        # a call without a key has its job id for key
                        unkeyed_job=job_id if envelope.idempotency_key == job_id else None,
                        running=running,
                    ),
                    state,
                    # an unanswered job may be redelivered much later (forwarded_keep_s)
                    ttl_s=self.timings.result_ttl_s
                    if final
                    else forwarded_keep_s(self.timings.result_ttl_s),
                    entry_id=entry_id if final else None,
                    epoch=epoch,
                    notify=envelope.reply_to,
                    idempotency_key=envelope.idempotency_key,
                    provisional=not final,
                )
            except SubstrateUnavailable:
                pass
        if finished is None:
            await self._mark_interrupted(
                job_id, epoch, envelope.idempotency_key, running=running
            )
        elif finished.verdict == "stale":
            self._refused(job_id, "in_doubt", epoch, finished)
        elif finished.verdict == "settled":
            self._settled(job_id, "in_doubt")
        else:
            _metrics.job_served(self, "in_doubt", envelope, job_id=job_id, provisional=not final)

    async def _mark_interrupted(
        self,
        job_id: str,
        epoch: int | None,
        idempotency_key: str | None = None,
        *,
        running: bool = False,
    ) -> None:
        """Record the stage ``interrupted`` (fenced: a newer delivery's state stays), with
        ``running`` if the desktop reported it (a stored ``running`` is kept); the state,
        and the job's idempotency record, are kept ``forwarded_keep_s``."""
        state = JobState(Stage.INTERRUPTED, self.user_id, at=self.wall_clock(), running=running)
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            try:
                await self.substrate.finish(
                    self.user_id,
                    job_id,
                    None,
                    state,
                    ttl_s=forwarded_keep_s(self.timings.result_ttl_s),
                    epoch=epoch,
                    idempotency_key=idempotency_key,
                )
            except SubstrateUnavailable:
                pass
