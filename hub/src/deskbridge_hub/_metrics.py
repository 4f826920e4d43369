"""Prometheus metrics of a hub process (prometheus-client) and the per-job log line,
behind one-line hooks.

The product's modules call the small functions below (``session_opened()``,
``job_answered(...)``) and never touch prometheus-client themselves, so the relay and
session code stays about relaying. Metrics live in prometheus-client's default registry,
one set per process. ``render(state)`` refreshes the scrape-time gauges (queue depth and
pending entries of the users connected to this process, draining) and returns the
exposition text for ``GET /metrics``.

Multi-worker: prometheus-client's multiprocess mode is used when ``PROMETHEUS_MULTIPROC_DIR``
is set (every worker writes its samples there; a scrape of any worker aggregates them; the
gauges say how: ``livesum``/``max``). The recommended deployment is one worker per pod
(``serve --workers 1``), each pod scraped on its own (docs/operations.md, "Metrics").

Units: every duration is in seconds (``_seconds`` in the name), as Prometheus expects.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import attrs
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from . import _stall
from ._logging import fields
from ._peer_noise import LogBudget
from ._tracing import trace_id

if TYPE_CHECKING:
    from ._process import HubState

log = logging.getLogger("deskbridge.hub.metrics")

#: Buckets for job latencies, seconds: from a 20 ms status round trip (the field figure)
#: to the 90 s default call timeout and the 180 s reclaim idle.
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 90.0, 180.0,
)  # fmt: skip
#: Buckets for event-loop lag, seconds (a healthy trio loop lags well under 10 ms).
LAG_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: How often the lag probe wakes, seconds.
LAG_PROBE_INTERVAL_S = 1.0

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: A call whose caller went away before its answer (counted and logged, never sent).
ABANDONED = "abandoned"
#: A call refused because its user's queue was full (``QueueFull``: 429 ``queue_full``).
QUEUE_FULL = "queue_full"
#: A call refused by this process's admission control (``Overloaded``: 503
#: ``overloaded``): counted, never logged one line each (there may be hundreds a second
#: exactly when the process has least CPU to spare), but a WARNING at most once per
#: ``OVERLOAD_LOG_INTERVAL_S`` counting them.
OVERLOADED = "overloaded"
#: At most one ``overloaded`` WARNING line per this many seconds (per process).
OVERLOAD_LOG_INTERVAL_S = 10.0
#: Outcomes a caller gets without any holder finishing the job (and ``abandoned``: no
#: answer at all).
CALLER_ONLY_OUTCOMES = frozenset({"offline", "timeout", "unavailable", QUEUE_FULL, ABANDONED})
#: Most distinct ``tool`` label values the per-tool metrics of one process take. A
#: name takes one only when it is known to be a tool of the user's desktop: found in
#: the catalogue the call was checked against (``call_tool_known``), announced by the
#: desktop serving the entry, or ``status`` (every desktop's); the first
#: ``MAX_TOOL_LABELS`` such names. Any other name is counted under ``OTHER_TOOL``:
#: callers may name any tool (an offline desktop, one without a catalogue, Redis down
#: before the catalogue was read) and a stream entry's ``name`` is any string, so labels
#: taken as given grew one series per name, and junk names took the real tools' labels.
MAX_TOOL_LABELS = 100
OTHER_TOOL = "other"
_tool_labels: set[str] = set()


def tool_label(name: object, *, admit: bool = True) -> str:
    """The ``tool`` label for ``name``: itself once it has one, or when fewer than
    ``MAX_TOOL_LABELS`` names have one and ``admit`` (it is known to be a tool);
    otherwise ``OTHER_TOOL``."""
    if isinstance(name, str):
        if name in _tool_labels:
            return name
        if admit and len(_tool_labels) < MAX_TOOL_LABELS:
            _tool_labels.add(name)
            return name
    return OTHER_TOOL


jobs_log = logging.getLogger("deskbridge.hub.jobs")
#: What each dispatch call was answered (``job_answered``): not a job's outcome.
calls_log = logging.getLogger("deskbridge.hub.calls")

SESSIONS_OPEN = Gauge(
    "deskbridge_sessions_open",
    "Sidecar sessions open in this process (after the hello/welcome handshake).",
    multiprocess_mode="livesum",
)
SESSIONS = Counter(
    "deskbridge_sessions",
    "Sidecar sessions opened (handshake completed).",
)
PRESENCE_WRITES = Counter(
    "deskbridge_presence_writes",
    "Presence writes (set at handshake, refresh at each heartbeat).",
    ["kind"],
)
PRESENCE_WRITE_FAILURES = Counter(
    "deskbridge_presence_write_failures",
    "Presence writes that failed (Redis unavailable) or found another holder.",
    ["reason"],
)
JOBS = Counter(
    "deskbridge_jobs",
    "Jobs answered to callers in this process (dispatch API), by tool and outcome.",
    ["tool", "outcome"],
)
JOB_SECONDS = Histogram(
    "deskbridge_job_seconds",
    "End-to-end latency seen by the caller: dispatch call to terminal answer, seconds.",
    ["tool"],
    buckets=LATENCY_BUCKETS_S,
)
DISPATCH_SECONDS = Histogram(
    "deskbridge_dispatch_seconds",
    "Enqueue to job frame sent to the sidecar (queue wait + relay), seconds, on the "
    "process holding the socket (wall clocks of two processes: skew shows here).",
    ["tool"],
    buckets=LATENCY_BUCKETS_S,
)
SERVED = Counter(
    "deskbridge_jobs_served",
    "Entries answered by this process as the socket holder, by tool and outcome "
    "(including lost and expired entries that never reached a sidecar).",
    ["tool", "outcome"],
)
RECLAIMED = Counter(
    "deskbridge_reclaimed_entries",
    "Entries taken over from other consumers by XAUTOCLAIM.",
)
LOST = Counter(
    "deskbridge_jobs_lost", "Entries answered lost (trimmed or deleted before they ran)."
)
EXPIRED = Counter(
    "deskbridge_jobs_expired", "Entries answered expired (deadline passed before forwarding)."
)
STALE_RESULTS = Counter(
    "deskbridge_stale_results",
    "Answers refused by the delivery fence: their entry had been delivered again "
    "(reclaimed or taken over) before they came, so the newer delivery answers.",
)
SUBSTRATE_ERRORS = Counter(
    "deskbridge_redis_errors",
    "Substrate (Redis) operations that failed as unavailable, by operation.",
    ["operation"],
)
REDIS_RECONNECTS = Counter(
    "deskbridge_redis_reconnects",
    "Redis connections that had served, replaced: found closed (dead), answering from a "
    "replica (replica), or a blocked command ended by the node's demotion (demoted).",
    ["reason"],
)
REDIS_HISTORY_CHANGES = Counter(
    "deskbridge_redis_history_changes",
    "Health probes that found Redis with another replication history than the probe "
    "before (master_replid): a failover, or a restart without persistence.",
)
QUEUE_ENTRIES = Gauge(
    "deskbridge_queue_entries",
    "Entries in the job streams (XLEN) of the users connected to this process, at scrape.",
    multiprocess_mode="livesum",
)
PENDING_ENTRIES = Gauge(
    "deskbridge_pending_entries",
    "Pending entries (delivered, not acknowledged) of the users connected to this "
    "process, at scrape.",
    multiprocess_mode="livesum",
)
CONNECTED_USERS = Gauge(
    "deskbridge_connected_users",
    "Distinct users with a session in this process, at scrape.",
    multiprocess_mode="livesum",
)
DRAINING = Gauge(
    "deskbridge_draining",
    "1 while this process drains for a graceful shutdown, else 0.",
    multiprocess_mode="livemax",
)
LOOP_LAG = Histogram(
    "deskbridge_event_loop_lag_seconds",
    "How late the event loop wakes a 1 s sleep, seconds.",
    buckets=LAG_BUCKETS_S,
)

# -- hooks (one line at each call site) ----------------------------------------------


def session_opened() -> None:
    SESSIONS.inc()
    SESSIONS_OPEN.inc()


def session_closed() -> None:
    SESSIONS_OPEN.dec()


def presence_written(kind: str, count: int = 1) -> None:
    """``kind``: ``set`` (handshake) or ``refresh`` (heartbeat); ``count`` writes (a
    pipelined heartbeat counts its refreshes once)."""
    _child(PRESENCE_WRITES, kind).inc(count)


def presence_failed(reason: str) -> None:
    """``reason``: ``unavailable``, ``not_holder`` or ``error`` (the store refused one
    user's beat: a key of the wrong type)."""
    PRESENCE_WRITE_FAILURES.labels(reason).inc()


def job_dispatched(tool: str, waited_s: float, *, known: bool) -> None:
    """A job frame sent to the sidecar ``waited_s`` after its enqueue; ``known``: the
    desktop announced ``tool`` (else it is labelled ``OTHER_TOOL``)."""
    _child(DISPATCH_SECONDS, tool_label(tool, admit=known)).observe(max(waited_s, 0.0))


def job_served(
    session: Any,
    outcome: str,
    envelope: Any = None,
    *,
    job_id: str | None = None,
    tool: str | None = None,
    provisional: bool = False,
) -> None:
    """An entry answered by the socket holder: count it and log the job's one INFO line.
    A ``provisional`` answer (``in_doubt`` with ``detail.pending``: the entry stays, and
    its redelivery's real outcome is the job's line) is logged as what its caller was
    told, on ``deskbridge.hub.calls`` (field ``answer``), not as the job's outcome.

    Args:
        session: the ``EntryServer`` serving it (``user_id``, ``session_id``,
            ``wall_clock``).
        outcome: the terminal outcome published for the job.
        envelope: the entry's ``JobEnvelope`` when it decoded (tool, job id, enqueue time).
        job_id, tool: what is known when the body is gone (lost) or malformed.
    """
    if envelope is not None:
        job_id, tool = envelope.job_id, envelope.name
    tool = tool or "unknown"
    known = bool(getattr(session, "knows", lambda _: False)(tool))
    label = "unknown" if tool == "unknown" else tool_label(tool, admit=known)
    _child(SERVED, label, outcome).inc()
    if outcome == "lost":
        LOST.inc()
    elif outcome == "expired":
        EXPIRED.inc()
    elapsed_s = None
    if envelope is not None:
        elapsed_s = max(session.wall_clock() - envelope.enqueued_at, 0.0)
    if provisional:
        calls_log.info(
            "call for job %s answered: %s (provisional; %s for %s)",
            job_id,
            outcome,
            tool,
            session.user_id,
            extra=fields(
                user_id=session.user_id,
                session_id=session.session_id,
                job_id=job_id,
                tool=tool,
                answer=outcome,
                elapsed_s=elapsed_s,
            ),
        )
        return
    jobs_log.info(
        "job %s finished: %s (%s)",
        job_id,
        outcome,
        tool,
        extra=fields(
            user_id=session.user_id,
            session_id=session.session_id,
            job_id=job_id,
            tool=tool,
            outcome=outcome,
            elapsed_s=elapsed_s,
            trace_id=trace_id(envelope.traceparent) if envelope is not None else None,
        ),
    )


def entries_reclaimed(count: int) -> None:
    if count:
        RECLAIMED.inc(count)


def stale_result() -> None:
    STALE_RESULTS.inc()


def substrate_error(operation: str) -> None:
    SUBSTRATE_ERRORS.labels(operation).inc()


def redis_reconnected(reason: str) -> None:
    """A Redis connection that had served was replaced (``dead``, ``replica``,
    ``demoted``: ``_redis_session``)."""
    REDIS_RECONNECTS.labels(reason).inc()


def redis_history_changed() -> None:
    """The health probe found another replication history (``_redis_health``)."""
    REDIS_HISTORY_CHANGES.inc()


@functools.lru_cache(maxsize=4096)
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label set (``labels()`` takes a lock
    and builds a key on every call; the per-job metrics use it once or twice per job). As
    many entries as the metrics themselves have children: tool labels (at most
    ``MAX_TOOL_LABELS`` + 2) x outcomes."""
    return metric.labels(*labels)


def job_answered(
    tool: str,
    outcome: str,
    elapsed_s: float,
    *,
    user_id: str,
    job_id: str | None,
    known: bool = False,
) -> None:
    """A dispatch call's answer: count it, observe its latency, and log it on
    ``deskbridge.hub.calls`` ("call for job J answered: timeout (tool for user)", field
    ``answer``, never ``outcome``): what the caller was told, not the job's outcome. INFO
    for the answers no holder's line covers (``CALLER_ONLY_OUTCOMES``: offline, timeout,
    unavailable), DEBUG for the rest. The job's outcome is the holder's one INFO line on
    ``deskbridge.hub.jobs`` ("job J finished: ..."), also for a job whose caller was
    answered timeout before it finished: a reader never sees two outcomes for one job.
    ``known``: the call found ``tool`` in the user's catalogue (``call_tool_known``);
    any other name takes no label of its own (``OTHER_TOOL``, unless it has one)."""
    label = tool_label(tool, admit=known)
    _child(JOBS, label, outcome).inc()
    _child(JOB_SECONDS, label).observe(elapsed_s)
    level = logging.INFO if outcome in CALLER_ONLY_OUTCOMES else logging.DEBUG
    if not calls_log.isEnabledFor(level):
        return
    call = "call" if job_id is None else f"call for job {job_id}"
    calls_log.log(
        level,
        "%s answered: %s (%s for %s)",
        call,
        outcome,
        tool,
        user_id,
        extra=fields(
            user_id=user_id, job_id=job_id, tool=tool, answer=outcome, elapsed_s=elapsed_s
        ),
    )


_overload_lines = LogBudget(burst=0, interval_s=OVERLOAD_LOG_INTERVAL_S)


def call_refused_overloaded(tool: str, exc: Exception, *, known: bool = False) -> None:
    """A call refused by admission control (``Overloaded``): counted as
    ``deskbridge_jobs_total{outcome="overloaded"}``; one WARNING line on
    ``deskbridge.hub.calls`` at most every ``OVERLOAD_LOG_INTERVAL_S``, saying why and
    how many were refused since the last line. No latency is observed (nothing ran)."""
    _child(JOBS, tool_label(tool, admit=known), OVERLOADED).inc()
    held = _overload_lines.admit(time.monotonic())
    if held is not None:
        calls_log.warning(
            "refusing calls (503 overloaded, nothing enqueued): %s (%d more refused since "
            "the last such line)",
            exc,
            held,
            extra=fields(answer=OVERLOADED),
        )


def call_refused_draining(
    tool: str, *, user_id: str, job_id: str | None, known: bool = False
) -> None:
    """A dispatch call (HTTP or MCP) refused by a draining replica before anything was
    enqueued: its caller was told ``unavailable`` (503 ``draining``), so it is counted
    and logged as that answer, like every other answer ``Bridge.dispatch`` gives (before,
    it was given in front of the dispatch and counted nowhere). Nothing looked at the
    tool's name: ``known`` only for ``status`` (every desktop's)."""
    job_answered(tool, "unavailable", 0.0, user_id=user_id, job_id=job_id, known=known)


def call_released(
    tool: str, *, user_id: str, job_id: str | None, elapsed_s: float, known: bool = False
) -> None:
    """A dispatch call (HTTP or MCP) still waiting when a graceful restart's grace ended:
    its caller is told ``unavailable`` (the hub restarted; the job may still run), so it
    is counted and logged as that answer, not as ``abandoned``. ``known``: as
    :func:`job_answered`'s (``WaitingCall.tool_known``)."""
    job_answered(tool, "unavailable", elapsed_s, user_id=user_id, job_id=job_id, known=known)


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


@attrs.define
class _CallNote:
    """What the dispatch call running in this task learnt so far: its job id, once
    ``Bridge.dispatch`` has chosen it (``call_names_job``: the line of a call its caller
    abandons names it), and whether its tool is in the user's catalogue
    (``call_tool_known``: only then does the name take a label)."""

    job_id: str | None = None
    tool_known: bool = False


_call_note: contextvars.ContextVar[_CallNote | None] = contextvars.ContextVar(
    "deskbridge_call_note", default=None
)


def call_names_job(job_id: str) -> None:
    """``Bridge.dispatch`` chose (or was given) ``job_id``: an abandoned call names it."""
    current = _call_note.get()
    if current is not None:
        current.job_id = job_id


def call_tool_known() -> None:
    """``Bridge.dispatch`` found the call's tool in the user's catalogue (or it is
    ``status``): its answer is counted under the tool's own label."""
    current = _call_note.get()
    if current is not None:
        current.tool_known = True


def timed_dispatch(fn: _F) -> _F:
    """Decorate ``Bridge.dispatch``: count each answer by tool and outcome and observe
    its latency; a SubstrateUnavailable counts as ``unavailable``, a QueueFull as
    ``queue_full`` (both re-raised): answers a caller got, as ``offline`` is; an
    Overloaded as ``overloaded`` (:func:`call_refused_overloaded`, re-raised). Bad
    requests are not jobs and are not counted."""
    from ._errors import Overloaded, QueueFull, SubstrateUnavailable
    from ._shutdown import current_call

    @functools.wraps(fn)
    async def wrapper(self: Any, user_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        note = _CallNote()
        token = _call_note.set(note)
        try:
            outcome = await fn(self, user_id, name, *args, **kwargs)
        except SubstrateUnavailable as exc:
            elapsed_s = time.monotonic() - started
            job_answered(
                str(name), "unavailable", elapsed_s,
                user_id=user_id, job_id=exc.job_id, known=note.tool_known,
            )  # fmt: skip
            raise
        except QueueFull as exc:  # refused, nothing enqueued: as offline, an answer
            elapsed_s = time.monotonic() - started
            job_answered(
                str(name), QUEUE_FULL, elapsed_s,
                user_id=user_id, job_id=exc.job_id, known=note.tool_known,
            )  # fmt: skip
            raise
        except Overloaded as exc:  # refused before anything was looked at
            call_refused_overloaded(str(name), exc, known=note.tool_known)
            raise
        except anyio.get_cancelled_exc_class():
            elapsed_s = time.monotonic() - started
            waiting = current_call.get()
            if waiting is not None and waiting.released:
                # the grace of a graceful restart ended while it waited: its route
                # answers it unavailable (naming the job) and counts it then
                waiting.job_id, waiting.elapsed_s = note.job_id, elapsed_s
                waiting.tool_known = note.tool_known
                raise
            # the caller went away (HTTP client hung up, MCP cancel, the Python caller's
            # scope): no answer was sent, but the call is counted and logged once, as
            # ``abandoned`` (its job, if enqueued, runs on and has its own line)
            job_answered(
                str(name), ABANDONED, elapsed_s,
                user_id=user_id, job_id=note.job_id, known=note.tool_known,
            )  # fmt: skip
            raise
        finally:
            _call_note.reset(token)
        job_answered(
            str(name), outcome.status, outcome.elapsed_s,
            user_id=user_id, job_id=outcome.job_id, known=note.tool_known,
        )  # fmt: skip
        return outcome

    return wrapper  # type: ignore[return-value]


# -- exposition ------------------------------------------------------------------------


#: Most queue reads of one refresh in flight at once: the connection layer pipelines
#: them, so 10,000 users cost about 160 round trips, not 20,000.
REFRESH_CONCURRENCY = 64
#: Longest a refresh may take, seconds: half Prometheus' default scrape timeout (10 s),
#: so a scrape of an overloaded process, or of one whose Redis answers late, still answers
#: (with the last complete queue figures).
REFRESH_BUDGET_S = 5.0


async def refresh(state: HubState) -> None:
    """Set the scrape-time gauges from this process's sessions (one XLEN + XPENDING per
    connected user, ``REFRESH_CONCURRENCY`` at a time; a user whose stream cannot be read
    is skipped).

    Found by ``bench/overload.py``: read one user after the other, a scrape of a process
    holding 3,100 desktops took 6 s idle and over 30 s overloaded, so the loop-lag
    histogram could not be read while the overload lasted.

    Raises:
        Nothing: substrate failures, or reads not done within ``REFRESH_BUDGET_S``,
        leave the previous queue figures (failures are counted).
    """
    from ._errors import SubstrateUnavailable

    DRAINING.set(1 if state.drain.active else 0)
    users = sorted({s.user_id for s in list(state.sessions.values())})
    CONNECTED_USERS.set(len(users))
    totals = [0, 0]
    limiter = anyio.CapacityLimiter(REFRESH_CONCURRENCY)

    async def read(user_id: str) -> None:
        async with limiter:
            info = await state.substrate.queue_info(user_id, count=0)
        totals[0] += info.length
        totals[1] += info.pending_count

    failed = False
    with anyio.move_on_after(REFRESH_BUDGET_S) as budget:
        try:
            async with anyio.create_task_group() as tg:
                for user_id in users:
                    tg.start_soon(read, user_id)
        except* SubstrateUnavailable:
            failed = True
    if failed or budget.cancel_called:
        log.debug("queue figures not refreshed (within %g s): the last kept", REFRESH_BUDGET_S)
        return
    QUEUE_ENTRIES.set(totals[0])
    PENDING_ENTRIES.set(totals[1])


def render() -> bytes:
    """The exposition text of this process (or of every worker, in multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(REGISTRY)


async def probe_loop_lag(
    sleep: Callable[[float], Awaitable[None]], clock: Callable[[], float]
) -> None:
    """Run until cancelled: sleep ``LAG_PROBE_INTERVAL_S`` and observe how late it woke
    (a wake ``_stall.STALL_S`` late is also logged once: the process did not run)."""
    while True:
        before = clock()
        _stall.probe_sleeps(before + LAG_PROBE_INTERVAL_S)
        await sleep(LAG_PROBE_INTERVAL_S)
        now = clock()
        _stall.probe_woke(now)
        LOOP_LAG.observe(max(now - before - LAG_PROBE_INTERVAL_S, 0.0))
