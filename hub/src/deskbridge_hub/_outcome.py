"""The dispatch API's answers: ``Presence`` and ``Outcome`` (with the error type each
status raises), and the texts of a ``timeout`` answer by the stage the job was in.
See docs/outcomes.md."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._errors import (
    BridgeError,
    DesktopOffline,
    JobCancelled,
    JobDeclined,
    JobExpired,
    JobFailed,
    JobInDoubt,
    JobLost,
    JobTimeout,
    SubstrateUnavailable,
)

if TYPE_CHECKING:
    from ._substrate import DesktopSubstrate
    from ._substrate_values import Asleep

log = logging.getLogger("deskbridge.hub.bridge")


@attrs.frozen
class Presence:
    """Answer of ``Bridge.presence``: ``online`` iff a live presence key exists.

    Attributes:
        user_id: whose desktop.
        online: a live presence key exists.
        session_id: the holder session, when online.
        asleep_since: when offline and the desktop went to sleep (issue 12.6,
            ``_asleep``): since when, Unix seconds by the hub's wall clock; else None.
    """

    user_id: str
    online: bool
    session_id: str | None = None
    asleep_since: float | None = None

    @property
    def status(self) -> str:
        """``online``, ``asleep`` or ``offline``."""
        if self.online:
            return "online"
        return "offline" if self.asleep_since is None else "asleep"


@attrs.frozen
class Outcome:
    """A terminal answer for one dispatched job (see docs/outcomes.md).

    Attributes:
        job_id: the job's id (None if it was never enqueued: offline, bad request).
        status: completed | failed | expired | lost | cancelled | in_doubt | declined |
            timeout | offline | unavailable.
        result: the tool's return value when completed.
        error: ``{"code", "message"}`` for every other status.
        detail: extra facts (``stage`` for timeouts).
        elapsed_s: seconds from dispatch to this answer (monotonic clock).
    """

    job_id: str | None
    status: str
    result: Any = None
    error: dict[str, str] | None = None
    detail: dict[str, Any] = attrs.field(factory=dict)
    elapsed_s: float = 0.0

    def raise_for_status(self) -> Any:
        """Return ``result`` if completed, else raise the matching ``BridgeError``."""
        if self.status == "completed":
            return self.result
        err = self.error or {"code": self.status, "message": self.status}
        message = err.get("message", self.status)
        exc_type = _ERRORS.get(self.status, BridgeError)
        if exc_type is JobFailed:
            raise JobFailed(message, code=err.get("code", "failed"), job_id=self.job_id)
        raise exc_type(message, job_id=self.job_id, **self.detail)


async def offline_outcome(
    substrate: DesktopSubstrate, user_id: str, started: float, job_id: str | None = None
) -> Outcome:
    """The ``offline`` answer (nothing was enqueued). When the desktop went to sleep
    (issue 12.6, ``_asleep``) it says so: ``detail`` = ``{"reason": "asleep", "since":
    <Unix seconds>}``; the status stays ``offline`` (503), as the public interface has it.

    Args:
        substrate: where the asleep record is read (one GET, only on this path).
        user_id: whose desktop.
        started: ``anyio.current_time()`` when the dispatch began (``elapsed_s``).
        job_id: the id the caller chose, echoed (it names no job: nothing was
            enqueued); None when the caller chose none (a hub-made id is not shown).

    Returns:
        The outcome. An unreadable asleep record gives the plain ``offline`` answer.
    """
    try:
        asleep = await substrate.get_asleep(user_id)
    except SubstrateUnavailable:
        asleep = None
    return plain_offline(user_id, started, asleep, job_id=job_id)


def plain_offline(
    user_id: str, started: float, asleep: Asleep | None = None, *, job_id: str | None = None
) -> Outcome:
    """The ``offline`` answer of :func:`offline_outcome` with the asleep record given
    (None: the plain answer, also when the record could not be read in time)."""
    message, detail = f"desktop of {user_id} is offline", {}
    if asleep is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(asleep.since))
        message = f"desktop of {user_id} is asleep (since {stamp})"
        detail = {"reason": "asleep", "since": asleep.since}
    return Outcome(
        job_id=job_id,
        status="offline",
        error={"code": "offline", "message": message},
        detail=detail,
        elapsed_s=anyio.current_time() - started,
    )


_ERRORS: dict[str, type[BridgeError]] = {
    "failed": JobFailed,
    "expired": JobExpired,
    "lost": JobLost,
    "cancelled": JobCancelled,
    "in_doubt": JobInDoubt,
    "declined": JobDeclined,
    "timeout": JobTimeout,
    "offline": DesktopOffline,
}

_TIMEOUT_MESSAGES = {
    "queued": "no answer within {:g} s; the job was still queued (the desktop never took it)",
    "delivered": "no answer within {:g} s; the job was delivered to the desktop, not known "
    "to have started (it may have); outcome unknown",
    "awaiting_approval": "no answer within {:g} s; the job was on the desktop waiting for "
    "the person's approval; it had not started (it never starts after its deadline)",
    "interrupted": "no answer within {:g} s; the job had been delivered to the desktop, "
    "not known to have started (it may have), when the desktop went away; outcome unknown",
    "unknown": "no answer within {:g} s; outcome unknown",
}

#: The texts of the stages above once the desktop reported the job ``running``
#: (``JobState.running``): only then is it said to have run.
_RUNNING_MESSAGES = {
    "delivered": "no answer within {:g} s; the desktop reported the job running; it may "
    "have acted; outcome unknown",
    "interrupted": "no answer within {:g} s; the desktop reported the job running, then "
    "went away; it may have acted; outcome unknown",
}

#: The ``queued`` text for a retry attached (by its idempotency key) to the job of an
#: earlier call, whose own deadline may outlast this caller's wait.
_ATTACHED_QUEUED_MESSAGE = (
    "no answer within {:g} s; the job this idempotency key started (an earlier call) is "
    "still queued and may still start before its own deadline{}; retry with the same key "
    "for its outcome"
)


def timeout_outcome(
    job_id: str,
    stage: str,
    *,
    timeout_s: float,
    elapsed_s: float,
    attached: bool = False,
    may_start_within_s: float | None = None,
    running: bool = False,
) -> Outcome:
    """The ``timeout`` answer for a wait that ended without a result.

    Args:
        job_id: the job waited for.
        stage: its stage when the wait ended (a key of ``_TIMEOUT_MESSAGES``).
        timeout_s: the caller's wait, seconds.
        elapsed_s: the call's duration, seconds.
        attached: the job was enqueued by an earlier call with the same idempotency key.
        may_start_within_s: for ``attached``: seconds left before that job's deadline
            (its own, on the substrate's clock), or None if unknown (a record written
            by an older hub).
        running: the desktop reported the job ``running`` (``JobState.running``); only
            then does a ``delivered`` / ``interrupted`` message say it ran.

    Returns:
        An Outcome with ``detail.stage``. A ``queued`` job still inside its deadline
        (``attached`` only: a caller's own job has its deadline at the end of its wait)
        says so: the message, and ``detail.may_start_within_s`` when known. "queued"
        alone means it will not start later (docs/outcomes.md).
    """
    detail: dict[str, Any] = {"stage": stage}
    texts = _RUNNING_MESSAGES if running and stage in _RUNNING_MESSAGES else _TIMEOUT_MESSAGES
    message = texts[stage].format(timeout_s)
    if attached and stage == "queued" and (may_start_within_s is None or may_start_within_s > 0):
        within = "" if may_start_within_s is None else f" (within {may_start_within_s:.3g} s)"
        message = _ATTACHED_QUEUED_MESSAGE.format(timeout_s, within)
        if may_start_within_s is not None:
            detail["may_start_within_s"] = round(may_start_within_s, 3)
    return Outcome(
        job_id=job_id,
        status="timeout",
        error={"code": "timeout", "message": message},
        detail=detail,
        elapsed_s=elapsed_s,
    )
