"""Consent: tools that run only after the person at the desktop approves (issue 12 item 5).

    @needs_approval
    @tool(side_effects=True)
    def pay(invoice: str) -> dict: ...

A job for such a tool waits on the desktop, before it starts, for a decision by the
person, up to its deadline; nothing is approved by default. The request is a file
``<data dir>/approvals/<job id>.json`` (tool, args, deadline) and the decision is made
with ``deskbridge-sidecar approve JOB_ID`` or ``deskbridge-sidecar decline JOB_ID`` (they
write ``<job id>.approved`` / ``.declined`` beside it; a local file works the same on
every platform and needs no socket permissions). ``deskbridge-sidecar pending`` lists the
requests. A desktop notification is shown where a notifier exists (``notify-send`` on
Linux, ``osascript`` on macOS), best effort. While it waits, the delivery reports progress
``awaiting approval`` (progress frames reach callers that follow them).

Outcomes: approved -> the tool runs as usual; declined -> ``declined`` (the tool never
ran); deadline reached first -> ``expired`` (it never ran). A decline is recorded in the
ledger, so a redelivery of the key is answered ``declined`` again. The decision is polled
every ``POLL_S``.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ._tools import Tool

log = logging.getLogger("deskbridge.sidecar.consent")

_MARK = "__deskbridge_needs_approval__"
#: Seconds between two looks for a decision.
POLL_S = 0.25
APPROVED = "approved"
DECLINED = "declined"


def needs_approval(fn: Any) -> Any:
    """Mark a tool's function as needing the person's approval before each run (above
    or below ``@tool``). Returns ``fn`` unchanged (marked)."""
    setattr(fn, _MARK, True)
    return fn


def requires_approval(tool: Tool) -> bool:
    """True if ``tool`` was marked with :func:`needs_approval`."""
    return bool(getattr(tool.fn, _MARK, False))


def approvals_dir(data_dir: Path) -> Path:
    """Where requests and decisions live: ``<data dir>/approvals``."""
    return Path(data_dir) / "approvals"


def _safe(job_id: str) -> str:
    if not job_id or "/" in job_id or "\\" in job_id or job_id.startswith("."):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


def decide(data_dir: Path, job_id: str, approve: bool) -> Path:
    """Record the person's decision on ``job_id`` (the CLI's ``approve``/``decline``).

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


async def wait_for_decision(
    folder: Path,
    job_id: str,
    tool: str,
    args: dict[str, Any],
    deadline: float,
    wall_clock: Callable[[], float],
) -> str | None:
    """Ask, then wait until the person decides or the deadline (Unix seconds) passes.

    Returns:
        ``approved``, ``declined``, or None when the deadline came first.

    Cancellation: the request is withdrawn (its file removed) and Cancelled propagates.
    """
    job_id = _safe(job_id)
    request = folder / f"{job_id}.json"
    body = {"job_id": job_id, "tool": tool, "args": args, "deadline": deadline}
    await trio.to_thread.run_sync(_write_request, folder, request, body)
    log.warning(
        "job %s (%s) waits for your approval: deskbridge-sidecar approve %s  (or decline %s)",
        job_id,
        tool,
        job_id,
        job_id,
    )
    await _notify(tool, job_id)
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
    hint = f"deskbridge-sidecar approve {job_id}  (or decline {job_id})"
    if sys.platform == "darwin" and shutil.which("osascript"):
        command = ["osascript", "-e", f"display notification {json.dumps(hint)} with title "
                   f"{json.dumps(text)}"]  # fmt: skip
    elif shutil.which("notify-send"):
        command = ["notify-send", text, hint]
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
    "approvals_dir",
    "decide",
    "needs_approval",
    "pending",
    "requires_approval",
    "wait_for_decision",
]
