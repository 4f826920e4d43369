"""The dispatch API's answers: ``Presence`` and ``Outcome`` (with the error type each
status raises), and the texts of a ``timeout`` answer by the stage the job was in.
See docs/outcomes.md."""

from __future__ import annotations

import logging
from typing import Any

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
)

log = logging.getLogger("deskbridge.hub.bridge")


@attrs.frozen
class Presence:
    """Answer of ``Bridge.presence``: ``online`` iff a live presence key exists."""

    user_id: str
    online: bool
    session_id: str | None = None


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
    "delivered": "no answer within {:g} s; the job was delivered and may be running; "
    "outcome unknown",
    "awaiting_approval": "no answer within {:g} s; the job was on the desktop waiting for "
    "the person's approval; it had not started (it never starts after its deadline)",
    "interrupted": "no answer within {:g} s; the job was delivered and running when the "
    "desktop went away; outcome unknown",
    "unknown": "no answer within {:g} s; outcome unknown",
}
