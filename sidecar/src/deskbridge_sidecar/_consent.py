"""Consent: tools that run only after the person at the desktop approves (issue 12 item 5).

    @needs_approval                       # before every run
    @tool(side_effects=True)
    def pay(invoice: str) -> dict: ...

    @needs_approval(after_wait_s=60)      # only when the job is stale
    @tool(side_effects=True)
    def submit_form(form: str) -> dict: ...

The declaration is part of the tool's catalogue entry (``approval_after_wait_s``: 0 for
always), so the hub, its tools endpoint and MCP clients can show it. A job *waited* from
the moment it was enqueued (the hub sends ``waited_s`` with each delivery: its age on the
hub's clock) until the moment it could start here: it holds the daemon-wide tool lock and
its deadline has not passed. The rule is checked then; a job that waited at least
``after_wait_s`` (always, for 0) asks the person and waits, still holding the lock (the
tools run one at a time anyway), up to its deadline. Nothing is approved by default.

Where the person decides (:class:`ApprovalDesk`): :class:`FileDesk`, the default with a
data directory, writes the request as ``<data dir>/approvals/<job id>.json`` (tool, args,
deadline) and waits for ``deskbridge-sidecar approve JOB_ID`` / ``decline JOB_ID`` (they
write ``<job id>.approved`` / ``.declined`` beside it: a local file works the same on every
platform and needs no socket permissions); ``deskbridge-sidecar pending`` lists the
requests, and a desktop notification is shown where a notifier exists (``notify-send`` on
Linux, ``osascript`` on macOS), best effort. :class:`MemoryDesk` decides in memory (tests,
embedders with their own UI).

What the hub is told: while it waits, the run's progress carries ``stage:
awaiting_approval`` (the hub records the job stage ``awaiting_approval``); once approved,
``stage: running`` (back to ``delivered``). Outcomes: approved -> the tool runs as usual;
declined -> ``declined`` (the tool never ran; recorded in the ledger, so a redelivery of
the key is answered ``declined`` again); the deadline first -> ``expired`` (it never ran);
no desk (no data directory) -> ``declined``.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio
from deskbridge_common import STAGE_AWAITING_APPROVAL, STAGE_RUNNING, Job

from ._outcome import DECLINED as DECLINED_CODE
from ._outcome import EXPIRED, Outcome
from ._progress import ProgressState

if TYPE_CHECKING:
    from ._tools import Tool

log = logging.getLogger("deskbridge.sidecar.consent")

_MARK = "__deskbridge_needs_approval__"
#: Seconds between two looks for a decision file (:class:`FileDesk`).
POLL_S = 0.25
APPROVED = "approved"
DECLINED = "declined"


def needs_approval(fn: Any = None, /, *, after_wait_s: float = 0.0) -> Any:
    """Mark a tool's function as needing the person's approval before it starts (above
    or below ``@tool``). Use bare (``@needs_approval``: always) or with
    ``after_wait_s`` (only when the job waited at least that long since it was enqueued).

    Args:
        fn: the function (bare use).
        after_wait_s: seconds of waiting from which approval is needed; 0 (default):
            always.

    Returns:
        ``fn`` unchanged (marked), or a decorator.

    Raises:
        ValueError: ``after_wait_s`` is negative or not finite.
    """
    if isinstance(after_wait_s, bool) or not 0 <= after_wait_s < float("inf"):
        raise ValueError(f"after_wait_s must be a finite number >= 0, got {after_wait_s!r}")

    def mark(f: Any) -> Any:
        setattr(f, _MARK, float(after_wait_s))
        return f

    return mark(fn) if fn is not None else mark


def approval_after_wait_s(fn: Any) -> float | None:
    """The ``after_wait_s`` ``fn`` was marked with (0.0: always), or None: never."""
    value = getattr(fn, _MARK, None)
    return value if isinstance(value, float) else None


def requires_approval(tool: Tool) -> bool:
    """True if ``tool`` was marked with :func:`needs_approval` (always or when stale)."""
    return approval_after_wait_s(tool.fn) is not None


def waited_s(job: Job, now: float) -> float:
    """How long ``job`` has waited since it was enqueued, seconds, at ``now`` (the
    sidecar's wall clock): the hub's ``waited_s`` when it sent the frame plus the time
    since it arrived here. The session set ``deadline`` to its arrival time plus
    ``timeout_s`` (the sidecar's own clock), so it arrived at ``deadline - timeout_s``.
    A frame from an older hub (no ``waited_s`` / ``timeout_s``) counts from arrival, or 0.
    """
    since_arrival = 0.0 if job.timeout_s is None else now - (job.deadline - job.timeout_s)
    return max(0.0, (job.waited_s or 0.0) + since_arrival)


@attrs.frozen
class ApprovalRequest:
    """What the person is asked: run ``tool`` with ``args`` for job ``job_id``?

    Attributes:
        deadline: the job's deadline, Unix seconds on the sidecar's clock; the request
            is withdrawn then.
        waited_s: how long the job had waited when it was asked, seconds.
    """

    job_id: str
    tool: str
    args: dict[str, Any]
    deadline: float
    waited_s: float

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class ApprovalDesk(Protocol):
    """Where the person at the desktop decides."""

    async def decide(self, request: ApprovalRequest, wall_clock: Callable[[], float]) -> str | None:
        """Ask, then wait until the person decides or ``request.deadline`` passes.

        Returns:
            ``approved``, ``declined``, or None when the deadline came first.

        Cancellation: the request is withdrawn and Cancelled propagates.
        """


async def gate(
    desk: ApprovalDesk | None,
    tool: Tool,
    job: Job,
    *,
    wall_clock: Callable[[], float],
    progress: ProgressState,
) -> Outcome | None:
    """Before ``tool`` starts for ``job``: ask for approval if its declaration says so.

    Call it when the job could start (holding the tool lock, deadline not passed).

    Args:
        desk: where to ask; None: nobody can be asked (answered ``declined``).
        tool: the tool about to start.
        job: its delivery (``deadline`` on the sidecar's clock).
        wall_clock: Unix time, seconds.
        progress: the run's progress; gets the stage reports.

    Returns:
        None: go on (no approval needed, or approved); else the outcome instead of
        running it: ``declined``, or ``expired`` when the deadline came first.

    Cancellation: the request is withdrawn; Cancelled propagates.
    """
    after = approval_after_wait_s(tool.fn)
    now = wall_clock()
    waited = waited_s(job, now)
    if after is None or waited < after:
        return None
    name = tool.name
    if desk is None:
        return Outcome.failure(
            DECLINED_CODE,
            f"{name} needs the approval of the person at the desktop and this sidecar "
            "has no data directory to ask in; not run",
        )
    progress.set_stage(STAGE_AWAITING_APPROVAL, awaiting_message(job.job_id))
    request = ApprovalRequest(job.job_id, name, job.args, job.deadline, round(waited, 3))
    decision = await desk.decide(request, wall_clock)
    if decision == APPROVED:
        log.info("job %s (%s): approved", job.job_id, name)
        progress.set_stage(STAGE_RUNNING, "approved")
        return None
    if decision == DECLINED:
        log.info("job %s (%s): declined", job.job_id, name)
        return Outcome.failure(DECLINED_CODE, f"{name} was declined at the desktop; not run")
    return Outcome.failure(EXPIRED, f"deadline passed while {name} awaited approval; not run")


# -- in memory ---------------------------------------------------------------------------


@attrs.define(eq=False)
class MemoryDesk:
    """An :class:`ApprovalDesk` in memory: :meth:`approve` / :meth:`decline` decide a
    pending request; on trio's clock (MockClock-friendly: no threads, no polling)."""

    requests: dict[str, ApprovalRequest] = attrs.field(factory=dict)
    asked: int = 0
    _decisions: dict[str, str] = attrs.field(factory=dict)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def decide(self, request: ApprovalRequest, wall_clock: Callable[[], float]) -> str | None:
        self.requests[request.job_id] = request
        self.asked += 1
        self._poke()
        try:
            while (decision := self._decisions.pop(request.job_id, None)) is None:
                left = request.deadline - wall_clock()
                if left <= 0:
                    return None
                with trio.move_on_after(left):
                    await self._changed.wait()
            return decision
        finally:
            self.requests.pop(request.job_id, None)
            self._poke()

    def approve(self, job_id: str) -> None:
        """Approve the pending request of ``job_id``.

        Raises:
            LookupError: no request of ``job_id`` is pending.
        """
        self._decide(job_id, APPROVED)

    def decline(self, job_id: str) -> None:
        """Decline the pending request of ``job_id`` (raises ``LookupError`` as
        :meth:`approve`)."""
        self._decide(job_id, DECLINED)

    def _decide(self, job_id: str, decision: str) -> None:
        if job_id not in self.requests:
            raise LookupError(f"no job {job_id!r} is waiting for approval")
        self._decisions[job_id] = decision
        self._poke()

    async def wait_requested(self, job_id: str) -> ApprovalRequest:
        """Return once ``job_id`` waits for a decision (for tests; bound it yourself)."""
        while job_id not in self.requests:
            await self._changed.wait()
        return self.requests[job_id]


# -- files in the data directory ---------------------------------------------------------


def approvals_dir(data_dir: Path) -> Path:
    """Where requests and decisions live: ``<data dir>/approvals``."""
    return Path(data_dir) / "approvals"


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it can name a request file (no ``/``, ``\\``, leading ``.``).

    Raises:
        ValueError: it cannot (the message quotes it).
    """
    if not job_id or "/" in job_id or "\\" in job_id or job_id.startswith("."):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


_safe = check_job_id

#: A job id a POSIX shell passes as one word as it is (``~`` and ``=`` only after the
#: first character: no tilde expansion, no zsh ``=command`` expansion); anything else is
#: quoted.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.@:,+][A-Za-z0-9_.@:,+=~-]*")


def command_for(verb: str, job_id: str) -> str:
    """``deskbridge-sidecar <verb> <job_id>`` as the person can paste it into a shell.

    The job id is the caller's choice (the hub allows ``; $ & ' ( )`` in it), so it is
    quoted unless plain (``shlex.quote``), and one starting with ``-`` follows ``--``
    (else it reads as an option).
    """
    word = job_id if _PLAIN_WORD.fullmatch(job_id) else shlex.quote(job_id)
    if word.startswith("="):  # shlex leaves "=x" bare (no quote in it): zsh would expand it
        word = f"'{word}'"
    return f"deskbridge-sidecar {verb} {'-- ' if job_id.startswith('-') else ''}{word}"


def hint(job_id: str) -> str:
    """What the log line and the notification tell the person to run."""
    return f"{command_for('approve', job_id)}  (or {command_for('decline', job_id)})"


def awaiting_message(job_id: str) -> str:
    """The ``awaiting_approval`` stage report's message (callers see it)."""
    return f"awaiting approval: {command_for('approve', job_id)}"


def decide(data_dir: Path, job_id: str, approve: bool) -> Path:
    """Record the person's decision on ``job_id`` (the CLI's ``approve``/``decline``).

    Returns:
        The decision file written.

    Raises:
        LookupError: no pending request for ``job_id`` (never asked, or already decided
            or expired).
        ValueError: ``job_id`` is not a job id.
    """
    folder = approvals_dir(data_dir)
    request = folder / f"{_safe(job_id)}.json"
    if not request.exists():
        raise LookupError(f"no job {job_id!r} is waiting for approval in {folder}")
    decision = folder / f"{job_id}.{APPROVED if approve else DECLINED}"
    decision.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return decision


def pending(data_dir: Path) -> list[dict[str, Any]]:
    """The requests waiting for a decision (for ``deskbridge-sidecar pending``)."""
    out = []
    for path in sorted(approvals_dir(data_dir).glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


@attrs.frozen
class FileDesk:
    """An :class:`ApprovalDesk` of files in ``folder`` (``<data dir>/approvals``),
    decided by ``deskbridge-sidecar approve|decline`` (:func:`decide`); polled every
    :data:`POLL_S` (file reads run in a worker thread)."""

    folder: Path

    async def decide(self, request: ApprovalRequest, wall_clock: Callable[[], float]) -> str | None:
        return await wait_for_decision(self.folder, request, wall_clock)


def file_desk(data_dir: Path | None) -> FileDesk | None:
    """The :class:`FileDesk` of ``data_dir`` (``<data dir>/approvals``), or None without one."""
    return None if data_dir is None else FileDesk(approvals_dir(Path(data_dir)))


async def wait_for_decision(
    folder: Path, request: ApprovalRequest, wall_clock: Callable[[], float]
) -> str | None:
    """Write the request, notify, then wait until the person decides or the deadline
    (Unix seconds) passes.

    Returns:
        ``approved``, ``declined``, or None when the deadline came first.

    Cancellation: the request is withdrawn (its files removed) and Cancelled propagates.
    """
    job_id = _safe(request.job_id)
    path = folder / f"{job_id}.json"
    await trio.to_thread.run_sync(_write_request, folder, path, request.to_json())
    log.warning("job %s (%s) waits for your approval: %s", job_id, request.tool, hint(job_id))
    await _notify(request.tool, job_id)
    deadline = request.deadline
    try:
        while wall_clock() < deadline:
            for decision in (APPROVED, DECLINED):
                if await trio.to_thread.run_sync((folder / f"{job_id}.{decision}").exists):
                    return decision
            await trio.sleep(min(POLL_S, max(0.0, deadline - wall_clock())))
        return None
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_withdraw, folder, job_id)


def _write_request(folder: Path, request: Path, body: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    request.write_text(json.dumps(body))


def _withdraw(folder: Path, job_id: str) -> None:
    for suffix in (".json", f".{APPROVED}", f".{DECLINED}"):
        (folder / f"{job_id}{suffix}").unlink(missing_ok=True)


async def _notify(tool: str, job_id: str) -> None:
    """A desktop notification, best effort (never raises, never waits long)."""
    text = f"deskbridge: {tool} waits for your approval"
    how = hint(job_id)
    if sys.platform == "darwin" and shutil.which("osascript"):
        command = ["osascript", "-e", f"display notification {json.dumps(how)} with title "
                   f"{json.dumps(text)}"]  # fmt: skip
    elif shutil.which("notify-send"):
        command = ["notify-send", text, how]
    else:
        return
    with trio.move_on_after(2):
        try:
            await trio.run_process(command, check=False, capture_stdout=True, capture_stderr=True)
        except OSError:
            pass


__all__ = [
    "APPROVED",
    "DECLINED",
    "ApprovalDesk",
    "ApprovalRequest",
    "FileDesk",
    "MemoryDesk",
    "approval_after_wait_s",
    "approvals_dir",
    "decide",
    "file_desk",
    "gate",
    "needs_approval",
    "pending",
    "requires_approval",
    "waited_s",
]
