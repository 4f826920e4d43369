"""Daemon-wide tool execution: one tool at a time, once per idempotency key.

The :class:`ToolRunner` belongs to the daemon, not to a session. Every run executes in
the daemon's nursery, so a dropped socket (which cancels the session and its workers)
does not abandon it: the run finishes, its outcome is recorded in the dedupe cache,
and only the reply is lost with the socket. The hub redelivers under a new ``id`` and
the redelivery is answered from the cache.

Serial: one lock for the whole daemon (there is one browser), handed out in FIFO order
(trio locks are fair). Within a session the serial worker awaits each job before taking
the next, which keeps arrival order; across sessions the lock keeps a run orphaned by a
dropped socket from overlapping with the next session's first job.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import attrs
import trio
from deskbridge_common import Job

from ._dedupe import DedupeCache
from ._outcome import BAD_ARGS, CANCELLED, EXPIRED, UNKNOWN_TOOL, Outcome
from ._tools import Tool, ToolRegistry, invoke

log = logging.getLogger("deskbridge.sidecar.runner")


@attrs.define(eq=False)
class _Run:
    key: str
    tool: Tool
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    started: bool = False
    outcome: Outcome | None = None


@attrs.define(eq=False)
class ToolRunner:
    """Executes jobs serially, deduplicated on ``idempotency_key``.

    Args:
        registry: the tools.
        cache: the daemon's dedupe cache.
        nursery: a nursery owned by the daemon (outlives sessions); runs execute there.
        wall_clock: Unix time source in seconds, compared with ``Job.deadline``.

    Attributes:
        running: name of the tool executing right now, or None.
        executions: number of times each tool actually started.
        dedupe_hits: deliveries answered from the cache or by joining a running original.
    """

    registry: ToolRegistry
    cache: DedupeCache
    nursery: trio.Nursery
    wall_clock: Callable[[], float]
    running: str | None = None
    executions: Counter[str] = attrs.field(factory=Counter)
    dedupe_hits: int = 0
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    _runs: dict[str, _Run] = attrs.field(factory=dict)

    def cached(self, key: str) -> Outcome | None:
        """The recorded outcome for ``key``, or None."""
        return self.cache.get(key)

    def lookup(self, key: str) -> Outcome | None:
        """Like :meth:`cached`, counting a hit in ``dedupe_hits`` when found."""
        outcome = self.cache.get(key)
        if outcome is not None:
            self.dedupe_hits += 1
        return outcome

    def in_flight(self, key: str) -> bool:
        """True while a run for ``key`` is queued for the lock or executing."""
        return key in self._runs

    def preflight(self, job: Job) -> Outcome | None:
        """Why ``job`` must not start (``expired``, ``unknown_tool``, ``bad_args``), or None."""
        now = self.wall_clock()
        if now >= job.deadline:
            return Outcome.failure(
                EXPIRED, f"deadline passed {now - job.deadline:.3f} s ago; not started"
            )
        tool = self.registry.get(job.name)
        if tool is None:
            return Outcome.failure(
                UNKNOWN_TOOL,
                f"no tool named {job.name!r}; this sidecar offers {self.registry.names()}",
            )
        problem = tool.check_args(job.args)
        if problem is not None:
            return Outcome.failure(BAD_ARGS, problem)
        return None

    async def execute(self, job: Job) -> Outcome:
        """Run ``job`` at most once per idempotency key and return the outcome.

        A known key returns its recorded outcome; a key whose run is in flight awaits
        that run (no second start); otherwise a new run starts in the daemon's nursery,
        waits for the daemon-wide lock, checks the deadline again and executes.

        Returns:
            The outcome (never raises for tool failures).

        Raises:
            trio.Cancelled: only the wait is cancelled (a dropped session); the run
                itself carries on in the daemon's nursery and records its outcome.
        """
        key = job.idempotency_key
        cached = self.cache.get(key)
        if cached is not None:
            self.dedupe_hits += 1
            return cached
        run = self._runs.get(key)
        if run is None:
            refused = self.preflight(job)
            if refused is not None:
                return refused
            tool = self.registry.get(job.name)
            assert tool is not None
            run = self._runs[key] = _Run(key=key, tool=tool)
            self.nursery.start_soon(self._run, run, job, name=f"deskbridge run {job.name}")
        else:
            self.dedupe_hits += 1
        await run.done.wait()
        if run.outcome is None:
            return Outcome.failure(CANCELLED, "the sidecar stopped before the tool finished")
        return run.outcome

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
        if run.started and not run.tool.is_async:
            log.warning(
                "cannot cancel %s: a sync tool running in a worker thread cannot be "
                "interrupted; it will finish and its outcome will be reported",
                run.tool.name,
            )
            return False
        run.cancel_scope.cancel()
        return True

    def record(self, key: str, outcome: Outcome) -> None:
        """Record ``outcome`` for ``key`` (a delivery cancelled before it started)."""
        self.cache.put(key, outcome)

    async def _run(self, run: _Run, job: Job) -> None:
        outcome: Outcome | None = None
        try:
            with run.cancel_scope:
                async with self._lock:
                    refused = self.preflight(job)  # the deadline may pass while queued
                    if refused is not None:
                        outcome = refused
                    else:
                        run.started = True
                        self.running = run.tool.name
                        self.executions[run.tool.name] += 1
                        try:
                            outcome = await invoke(run.tool, job.args)
                        finally:
                            self.running = None
            if run.cancel_scope.cancelled_caught:
                outcome = Outcome.failure(
                    CANCELLED,
                    "cancelled by the hub" + ("" if run.started else " before it started"),
                )
            assert outcome is not None
            if run.started or outcome.code == CANCELLED:
                self.cache.put(run.key, outcome)
        finally:
            # Outer cancellation (the daemon stopping) leaves outcome None: not recorded.
            self._runs.pop(run.key, None)
            run.outcome = outcome
            run.done.set()


__all__ = ["ToolRunner"]
