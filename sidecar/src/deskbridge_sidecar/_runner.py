"""Daemon-wide tool execution: one tool at a time, once per idempotency key.

The :class:`ToolRunner` belongs to the daemon, not to a session. Every run executes in
the daemon's nursery, so a dropped socket (which cancels the session and its workers)
does not abandon it: the run finishes, its outcome is recorded, and only the reply is
lost with the socket. The hub redelivers under a new ``id`` and the redelivery is
answered from the record.

Records: the durable :class:`~deskbridge_sidecar._ledger.Ledger` (SQLite) holds every
key for as long as it could be redelivered; a key is written as started before its tool
runs and its outcome before the answer goes out. A small in-memory cache of recent
outcomes (``DedupeCache``) lets the session's reader answer a redelivery at once
without a disk read; anything else goes through :meth:`ToolRunner.execute`, which reads
the ledger. A key is one request: a delivery whose tool or arguments differ from the
key's record (or from its running original) is refused ``idempotency_key_reused`` and
nothing runs. A key the ledger found started but unfinished (its process died) is
answered with its ``in_doubt`` record and never runs again.

Serial: one lock for the whole daemon (there is one browser), handed out in FIFO order
(trio locks are fair). Within a session the serial worker awaits each job before taking
the next, which keeps arrival order; across sessions the lock keeps a run orphaned by a
dropped socket from overlapping with the next session's first job.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio
from deskbridge_common import CATALOGUE_CHANGED, Job

from ._catalogue import validated_before_change
from ._consent import ApprovalDesk, gate
from ._dedupe import DedupeCache
from ._isolate import invoke_in_process, is_isolated
from ._ledger import KeyRecord, Ledger, LedgerError, args_digest
from ._outcome import (
    BAD_ARGS,
    CANCELLED,
    DECLINED,
    EXPIRED,
    IDEMPOTENCY_KEY_REUSED,
    IN_DOUBT,
    LEDGER_ERROR,
    UNKNOWN_TOOL,
    Outcome,
)
from ._progress import Progress, ProgressState, ProgressUpdate
from ._tools import Tool, ToolRegistry, invoke

log = logging.getLogger("deskbridge.sidecar.runner")

#: Most deliveries whose monotonic deadline is remembered at once (``_note_deadline``).
_MAX_NOTES = 4096


def _reused(key: str, tool: str, job: Job) -> Outcome:
    what = "another tool" if tool != job.name else "different arguments"
    return Outcome.failure(
        IDEMPOTENCY_KEY_REUSED,
        f"idempotency key {key!r} was first used for {tool!r} with other arguments; "
        f"this request ({job.name!r}) has {what}. A key names one request: use a new key",
    )


@attrs.define(eq=False)
class _Run:
    key: str
    tool: Tool
    digest: str
    #: the job this run is for (the ledger row answers its redeliveries a day)
    job_id: str | None = None
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    started: bool = False
    outcome: Outcome | None = None
    #: set by ToolRunner.interrupt: the answer to give instead of waiting for the tool
    interrupted: Outcome | None = None
    progress: ProgressState = attrs.field(factory=ProgressState)
    #: Unix seconds as this run's deadline sees them (``ToolRunner._now_for``)
    clock: Callable[[], float] = time.time


@attrs.define(eq=False)
class ToolRunner:
    """Executes jobs serially, deduplicated on ``idempotency_key``.

    Args:
        registry: the tools.
        cache: recent outcomes in memory (the reader's fast path).
        nursery: a nursery owned by the daemon (outlives sessions); runs execute there.
        wall_clock: Unix time source in seconds, compared with ``Job.deadline``.
        ledger: the durable record (default: an in-memory ledger, gone with the
            process; the CLI opens one on disk).
        result_ttl_s: how long the hub keeps a result, seconds; a key is kept until its
            deadline plus this (``Timings.result_ttl_s``, 300 s).

    Attributes:
        running: name of the tool executing right now, or None.
        executions: number of times each tool actually started.
        dedupe_hits: deliveries answered from the cache or by joining a running original.
    """

    registry: ToolRegistry
    cache: DedupeCache
    nursery: trio.Nursery
    wall_clock: Callable[[], float]
    ledger: Ledger = attrs.field(factory=Ledger.memory)
    result_ttl_s: float = 300.0
    running: str | None = None
    executions: Counter[str] = attrs.field(factory=Counter)
    dedupe_hits: int = 0
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    _runs: dict[str, _Run] = attrs.field(factory=dict)
    #: every key the ledger holds -> its tool, args digest, key window and jobs: lets the
    #: reader refuse a reused key and skip preflight for a known one without a disk read,
    #: and tell a new job under a key whose window is over from a redelivery.
    _known: dict[str, KeyRecord] = attrs.field(factory=dict)
    _closing: bool = False
    #: where the person approves tools marked ``@needs_approval`` (``_consent``), or
    #: None: nobody can be asked and they are answered ``declined``
    approvals: ApprovalDesk | None = None
    #: run every sync tool in a separate process (``--isolate-sync-tools``)
    isolate_sync: bool = False
    #: tools whose fingerprint is not the one the hub last acknowledged (``_catalogue``):
    #: a job for one of them enqueued before this daemon was first welcomed was validated
    #: against the old catalogue, and is refused ``catalogue_changed``
    changed_tools: frozenset[str] = frozenset()
    #: tools the hub acknowledged after a change (an earlier run's) -> Unix seconds of
    #: that acknowledgement: their jobs enqueued before it are refused likewise
    changed_at: Mapping[str, float] = attrs.field(factory=dict)
    #: trio time of this daemon's first welcome, or None before it
    serving_since: float | None = None
    #: delivery id -> its deadline on the trio (monotonic) clock, noted at admission, so
    #: a wall clock stepped back while the delivery queues cannot extend its time
    _steady_deadlines: dict[str, float] = attrs.field(factory=dict)

    def isolates(self, tool: Tool) -> bool:
        """True if ``tool`` runs in a separate process (marked, or sync under
        ``isolate_sync``)."""
        return is_isolated(tool) or (self.isolate_sync and not tool.is_async)

    async def load(self) -> None:
        """Read the ledger's keys into memory (call once before serving).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        self._known = await self.ledger.index()

    def _speaks(self, job: Job) -> KeyRecord | None:
        """The key's record if it speaks for ``job`` (``KeyRecord.answers``): inside the
        key's window, or a job the row ran or answered; None otherwise (unknown, or a
        new job under a key whose window is over: a new request)."""
        record = self._known.get(job.idempotency_key)
        if record is None or not record.answers(job.job_id, self.wall_clock()):
            return None
        return record

    def _stale(self, job: Job) -> bool:
        """True if the ledger holds ``job``'s key for other jobs only, past its window:
        the hub may have forgotten the key, so ``job`` is a new request (not a replay)."""
        return job.idempotency_key in self._known and self._speaks(job) is None

    def _note_answered(self, job: Job) -> None:
        """Keep the key's row for ``job`` a forwarded keep from now (in the daemon's
        nursery): this delivery's answer may be lost too, and the hub then keeps the
        job that long again."""
        record = self._known.get(job.idempotency_key)
        if record is not None and job.job_id not in record.job_ids:
            self._known[job.idempotency_key] = attrs.evolve(
                record, job_ids=(*record.job_ids, job.job_id)
            )
        self.nursery.start_soon(self._answered, job.idempotency_key, job.job_id)

    async def _answered(self, key: str, job_id: str) -> None:
        try:
            await self.ledger.answered(key, job_id)
        except LedgerError as exc:
            log.error("%s (the answer to %r was given; its keep not extended)", exc, job_id)

    def cached(self, key: str) -> Outcome | None:
        """The recent outcome for ``key`` held in memory, or None."""
        return self.cache.get(key)

    def admit(self, job: Job) -> Outcome | None:
        """Decide, once per delivery and from memory only, whether ``job`` is answered
        now or queued for :meth:`execute`.

        Returns:
            The answer now: the ``idempotency_key_reused`` refusal (a key recorded or
            running for another tool or other arguments), a recent outcome (counted in
            ``dedupe_hits``), or a refusal (``expired``, ``unknown_tool``, ``bad_args``);
            or None: queue it (a new run, a run in flight to join, or a key the ledger
            holds, whose record :meth:`execute` reads).
        """
        refused = self._check_reuse(job)
        if refused is not None:
            return refused
        key = job.idempotency_key
        stale = self._stale(job)
        outcome = None if stale or key in self._runs else self.cache.get(key)
        if outcome is not None:
            self.dedupe_hits += 1
            log.info("job %s (%s): answered from the dedupe cache", job.job_id, job.name)
            self._note_answered(job)
            return outcome
        if key in self._runs or (key in self._known and not stale):
            return None  # joined or answered by its record; never refused afresh
        refused = self._refusal(job)
        if refused is None:
            self._note_deadline(job)
        return refused

    def _note_deadline(self, job: Job) -> None:
        """Remember ``job``'s time left on the monotonic clock (bounded: the oldest
        notes go first past ``_MAX_NOTES``; a delivery without one is checked on the
        wall clock alone)."""
        notes = self._steady_deadlines
        while len(notes) >= _MAX_NOTES:
            del notes[next(iter(notes))]
        notes[job.id] = trio.current_time() + (job.deadline - self.wall_clock())

    def _check_reuse(self, job: Job) -> Outcome | None:
        key = job.idempotency_key
        run = self._runs.get(key)
        record = self._speaks(job) if run is None else None
        known = (run.tool.name, run.digest) if run is not None else None
        if record is not None:
            known = (record.tool, record.args_digest)
        if known is None:
            return None
        if known != (job.name, args_digest(job.args)):
            return _reused(key, known[0], job)
        return None

    def answers_from_record(self, job: Job) -> bool:
        """True if the ledger holds a record of ``job``'s key that speaks for it (a run
        of it started here, maybe before a restart): :meth:`execute` answers it from
        that record, and a cancel must not say "before it started"."""
        return self._speaks(job) is not None

    def in_flight(self, key: str) -> bool:
        """True while a run for ``key`` is queued for the lock or executing."""
        return key in self._runs

    def _expired(self, job: Job) -> Outcome | None:
        """``expired`` once the deadline passed by the wall clock *or*, for a delivery
        :meth:`admit` queued, by the monotonic clock since then: a wall clock stepped
        back never lets a job start late, and a machine that slept (the monotonic clock
        may stand still in a suspend) is caught by the wall clock."""
        run = self._runs.get(job.idempotency_key)  # its clock keeps the note (``_execute``)
        late = (run.clock() if run is not None else self._now_for(job)) - job.deadline
        if late >= 0:
            return Outcome.failure(EXPIRED, f"deadline passed {late:.3f} s ago; not started")
        return None

    def _now_for(self, job: Job, steady: float | None = None) -> float:
        """Unix seconds as ``job``'s deadline should see them: the wall clock, or later
        when the monotonic clock says more of its time has gone (a step back).
        ``steady``: the run's own copy of the note (it outlives the waiter's
        ``execute``, whose ``finally`` drops the note)."""
        now = self.wall_clock()
        if steady is None:
            steady = self._steady_deadlines.get(job.id)
        if steady is not None:
            now = max(now, job.deadline + trio.current_time() - steady)
        return now

    def _refusal(self, job: Job) -> Outcome | None:
        """Why ``job`` must not start: expired, unknown tool, bad arguments; or None."""
        expired = self._expired(job)
        if expired is not None:
            return expired
        tool = self.registry.get(job.name)
        if tool is None:
            return Outcome.failure(
                UNKNOWN_TOOL,
                f"no tool named {job.name!r}; this sidecar offers {self.registry.names()}",
            )
        problem = tool.check_args(job.args)
        if problem is not None:
            return Outcome.failure(BAD_ARGS, problem)
        return self._catalogue_changed(job)

    def _catalogue_changed(self, job: Job) -> Outcome | None:
        """``catalogue_changed`` for a job enqueued before the hub acknowledged its
        tool's current fingerprint, or when that cannot be told
        (``_catalogue.validated_before_change``); else None."""
        if not validated_before_change(
            job,
            changed=self.changed_tools,
            changed_at=self.changed_at,
            serving_since=self.serving_since,
            now=trio.current_time(),
            wall_now=self.wall_clock(),
        ):
            return None
        return Outcome.failure(
            CATALOGUE_CHANGED,
            f"{job.name} changed when the sidecar restarted (another definition or "
            "configuration of it), and this job was enqueued before, or too close to "
            "tell: it was checked against the old one. Not run: check the catalogue, "
            "then call again",
        )

    async def execute(
        self, job: Job, *, on_progress: Callable[[ProgressUpdate], Awaitable[None]] | None = None
    ) -> Outcome:
        """Run a delivery that :meth:`admit` queued, at most once per idempotency key,
        and return the outcome.

        No check :meth:`admit` made is repeated (key reuse, tool, arguments). What can
        have changed while the delivery waited in its queue is decided here, once: a key
        whose run is in flight awaits that run (no second start); a key with a recent
        outcome (a twin delivery ran meanwhile) or a ledger record returns it
        (``in_doubt`` if its process died mid-run); otherwise a new run starts in the
        daemon's nursery, waits for the daemon-wide lock, checks the deadline again (it
        may pass while queued), is recorded as started, executes, and its outcome is
        recorded before it is returned.

        ``on_progress`` is called with the run's progress reports while this delivery
        waits for it (rate-limited, latest value only; see ``_progress``).

        Returns:
            The outcome (never raises for tool failures; a ledger that cannot be read
            or written gives a ``ledger_error`` failure, and the tool does not start).

        Raises:
            trio.Cancelled: only the wait is cancelled (a dropped session); the run
                itself carries on in the daemon's nursery and records its outcome.
        """
        try:
            return await self._execute(job, on_progress)
        finally:
            self._steady_deadlines.pop(job.id, None)

    async def _execute(
        self, job: Job, on_progress: Callable[[ProgressUpdate], Awaitable[None]] | None
    ) -> Outcome:
        key = job.idempotency_key
        run = self._runs.get(key)
        stale = run is None and self._stale(job)
        cached = None if run is not None or stale else self.cache.get(key)
        if cached is not None:
            self.dedupe_hits += 1
            self._note_answered(job)
            return cached
        if run is None and key in self._known and not stale:
            try:
                entry = await self.ledger.get(key)
            except LedgerError as exc:
                log.error("%s", exc)
                return Outcome.failure(LEDGER_ERROR, f"the sidecar cannot read its ledger: {exc}")
            if (
                entry is not None
                and entry.outcome is not None
                and not entry.answers(job.job_id, self.wall_clock())
            ):
                entry = None  # its window ended while this delivery queued: a new request
            if entry is not None and entry.outcome is not None:
                self.dedupe_hits += 1
                self._note_answered(job)
                log.info(
                    "job %s (%s): answered from the ledger (%s)",
                    job.job_id,
                    job.name,
                    entry.outcome.code or "ok",
                )
                return entry.outcome
            run = self._runs.get(key)  # another delivery may have started one meanwhile
            if run is None and entry is not None:
                # Started here, no run in flight and no outcome on disk: the run ended but
                # its outcome could not be written and the memory cache has since let it go.
                # The tool may have acted, so this is in doubt; it never runs a second time.
                log.warning(
                    "job %s (%s): started earlier, outcome lost; answered in_doubt",
                    job.job_id,
                    job.name,
                )
                return Outcome.failure(
                    IN_DOUBT,
                    "the tool started earlier and its outcome was not recorded; "
                    "it may have acted and is not run again",
                )
        if run is None:
            if self._closing:
                await trio.sleep_forever()  # left to the hub: redelivered after a restart
            tool = self.registry.get(job.name)
            assert tool is not None, "execute() of a delivery admit() did not queue"
            run = self._runs[key] = _Run(
                key=key,
                tool=tool,
                digest=args_digest(job.args),
                job_id=job.job_id,
                clock=functools.partial(self._now_for, job, self._steady_deadlines.get(job.id)),
            )
            self.nursery.start_soon(self._run, run, job, name=f"deskbridge run {job.name}")
        else:
            self.dedupe_hits += 1
        if on_progress is None:
            await run.done.wait()
        else:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run.progress.follow, on_progress)
                await run.done.wait()
                nursery.cancel_scope.cancel()
        if run.outcome is None and self._closing:
            await trio.sleep_forever()  # never started: left to the hub
        if run.outcome is None:
            return Outcome.failure(CANCELLED, "the sidecar stopped before the tool finished")
        return run.outcome

    @property
    def busy(self) -> bool:
        """True while a tool has started and not finished."""
        return any(run.started and not run.done.is_set() for run in self._runs.values())

    def started_keys(self) -> set[str]:
        """Idempotency keys of the tools started and not finished."""
        return {r.key for r in self._runs.values() if r.started and not r.done.is_set()}

    async def wait_idle(self) -> None:
        """Return once no started tool is still running (queued runs do not count)."""
        while True:
            started = [r for r in self._runs.values() if r.started and not r.done.is_set()]
            if not started:
                return
            await started[0].done.wait()

    def close(self) -> None:
        """Start no new tool from now on (the daemon is stopping): a delivery that would
        start one waits until the daemon's scope ends, unanswered, so the hub keeps it
        pending and redelivers it to the next sidecar session of this user."""
        self._closing = True

    def interrupt(self, why: str) -> list[tuple[str, str]]:
        """Give up on every started run now: each is answered ``in_doubt`` (it may have
        acted) and recorded so in the ledger, its task is cancelled (an async tool at
        its next checkpoint; a sync tool's thread is abandoned and dies with the
        process). Queued runs are left alone.

        The answer does not wait for the tool to give in: the ``in_doubt`` outcome is
        written to the ledger (shielded) and then handed to the run's waiters at once, so
        a tool that ignores cancellation (or blocks in a native call) neither keeps its
        caller waiting nor :meth:`wait_idle`. Whatever it returns later is dropped.

        Args:
            why: what stopped them, for the answer's message (e.g. "the sidecar was
                stopped (SIGTERM)").

        Returns:
            ``(idempotency key, tool name)`` of each run interrupted.
        """
        names = []
        for run in self._runs.values():
            if run.started and not run.done.is_set() and run.interrupted is None:
                run.interrupted = Outcome.failure(
                    IN_DOUBT,
                    f"{run.tool.name} was running when {why}; it may have acted. Not run "
                    "again under this idempotency key: check, then retry with a new key",
                )
                run.cancel_scope.cancel()
                self.nursery.start_soon(self._give_up, run, run.interrupted)
                names.append((run.key, run.tool.name))
        return names

    async def _give_up(self, run: _Run, outcome: Outcome) -> None:
        """Record ``outcome`` for an interrupted run, then answer its waiters."""
        self.cache.put(run.key, outcome)
        self._remember(run)
        try:
            with trio.CancelScope(shield=True):
                await self.ledger.finish(run.key, outcome, run.tool.name, run.digest, run.job_id)
        except LedgerError as exc:
            log.error("%s (outcome of %r kept in memory only)", exc, run.key)
        finally:
            self._finish_run(run, outcome)

    def _remember(self, run: _Run, keep_until: float = 0.0) -> None:
        """Hold ``run``'s key in memory as the ledger now does: this run's request, its
        job, and the key's window (at least ``min_keep_s`` from now)."""
        before = self._known.get(run.key)
        window = max(keep_until, self.wall_clock() + self.ledger.min_keep_s)
        if before is not None and (before.tool, before.args_digest) == (run.tool.name, run.digest):
            window = max(window, before.keep_until)
        ids = () if run.job_id is None else (run.job_id,)
        self._known[run.key] = KeyRecord(run.tool.name, run.digest, window, ids)

    def _finish_run(self, run: _Run, outcome: Outcome | None) -> None:
        """Hand ``outcome`` to ``run``'s waiters, once (the first word stays)."""
        if run.done.is_set():
            return
        if self._runs.get(run.key) is run:
            self._runs.pop(run.key)
        run.outcome = outcome
        run.done.set()

    def cancel(self, key: str) -> bool:
        """Cancel the in-flight run for ``key`` if it can be cancelled.

        A run still waiting for the lock, or running an async tool, is cancelled: its
        outcome becomes ``cancelled`` and is recorded. A sync tool already running in a
        thread cannot be interrupted: nothing happens, it finishes and its real outcome
        is recorded and reported.

        Returns:
            True if a cancellation was requested; False if there is no run for ``key``
            or it cannot be interrupted.
        """
        run = self._runs.get(key)
        if run is None:
            return False
        if run.started and not run.tool.is_async and not self.isolates(run.tool):
            log.warning(
                "cannot cancel %s: a sync tool running in a worker thread cannot be "
                "interrupted; it will finish and its outcome will be reported",
                run.tool.name,
            )
            return False
        run.cancel_scope.cancel()
        return True

    def record(self, key: str, outcome: Outcome, job: Job | None = None) -> None:
        """Record ``outcome`` for ``key`` (a delivery cancelled before it started): in
        memory at once, in the ledger by a write in the daemon's nursery."""
        self.cache.put(key, outcome)
        tool, digest = (job.name, args_digest(job.args)) if job is not None else ("", "")
        job_id = None if job is None else job.job_id
        self._known.setdefault(
            key,
            KeyRecord(
                tool,
                digest,
                self.wall_clock() + self.ledger.min_keep_s,
                () if job_id is None else (job_id,),
            ),
        )
        self.nursery.start_soon(self._record, key, outcome, tool, digest, job_id)

    async def _record(
        self, key: str, outcome: Outcome, tool: str, digest: str, job_id: str | None
    ) -> None:
        try:
            await self.ledger.finish(key, outcome, tool, digest, job_id)
        except LedgerError as exc:
            log.error("%s (outcome of %r kept in memory only)", exc, key)

    async def prune(self) -> None:
        """Prune the ledger and forget pruned keys. Logs (never raises) a ledger error."""
        try:
            await self.ledger.prune()
            self._known = await self.ledger.index()
        except LedgerError as exc:
            log.error("%s", exc)

    async def _run(self, run: _Run, job: Job) -> None:
        outcome: Outcome | None = None
        try:
            with run.cancel_scope:
                async with self._lock:
                    refused = self._expired(job)  # the deadline may pass while queued
                    if refused is None and not self._closing:
                        refused = await gate(  # declined, or expired awaiting approval
                            self.approvals, run.tool, job, wall_clock=run.clock,
                            progress=run.progress,
                        )  # fmt: skip
                    if self._closing:
                        pass  # stopping: never start it (outcome None: not recorded)
                    elif refused is not None:
                        outcome = refused
                    else:
                        keep_until = max(job.deadline, self.wall_clock()) + self.result_ttl_s
                        try:
                            with trio.CancelScope(shield=True):  # a start is never half-known
                                await self.ledger.begin(
                                    run.key, run.tool.name, run.digest, keep_until, run.job_id
                                )
                        except LedgerError as exc:
                            log.error("%s; %s not started", exc, run.tool.name)
                            outcome = Outcome.failure(
                                LEDGER_ERROR,
                                f"the sidecar cannot record the start in its ledger, so the "
                                f"tool was not started: {exc}",
                            )
                        else:
                            self._remember(run, keep_until)
                            run.started = True
                            self.running = run.tool.name
                            self.executions[run.tool.name] += 1
                            try:
                                if self.isolates(run.tool):
                                    outcome = await invoke_in_process(run.tool, job.args)
                                else:
                                    progress = Progress(
                                        run.progress, trio.lowlevel.current_trio_token()
                                    )
                                    outcome = await invoke(run.tool, job.args, progress=progress)
                            finally:
                                self.running = None
            if run.interrupted is not None:
                outcome = run.interrupted
            elif run.cancel_scope.cancelled_caught:
                outcome = Outcome.failure(
                    CANCELLED,
                    "cancelled by the hub" + ("" if run.started else " before it started"),
                )
            if outcome is None:
                return  # the daemon is stopping and it never started: nothing to record
            if run.done.is_set():
                return  # given up on (interrupt): answered and recorded already
            if run.started or outcome.code in (CANCELLED, DECLINED):
                self.cache.put(run.key, outcome)
                self._remember(run)
                try:
                    with trio.CancelScope(shield=True):
                        await self.ledger.finish(
                            run.key, outcome, run.tool.name, run.digest, run.job_id
                        )
                except LedgerError as exc:
                    log.error("%s (outcome of %r kept in memory only)", exc, run.key)
        finally:
            # Outer cancellation (the daemon stopping) leaves outcome None: not recorded.
            self._finish_run(run, outcome)


__all__ = ["ToolRunner"]
