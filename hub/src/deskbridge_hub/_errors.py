"""The dispatch API's typed errors. Each maps to one outcome (docs/outcomes.md).

"Desktop offline", "Redis unavailable", "job expired", "job failed" and "outcome
unknown" are different answers and are never collapsed into one (DESIGN.md, invariant 5).
"""

from __future__ import annotations

from typing import Any


class BridgeError(Exception):
    """Base class of every error ``Bridge`` raises. ``status`` is the outcome name."""

    status = "error"

    def __init__(self, message: str, *, job_id: str | None = None, **details: Any):
        super().__init__(message)
        self.message = message
        self.job_id = job_id
        self.details = details


class DesktopOffline(BridgeError):
    """No presence for the user when the job was dispatched; nothing was enqueued."""

    status = "offline"


#: ``Retry-After`` (``retry_after_s``) of an ``unavailable`` refusal, seconds: Redis
#: cannot be used right now; a reconnect or a failover takes seconds.
UNAVAILABLE_RETRY_AFTER_S = 5
#: ``Retry-After`` of a ``draining`` refusal and of a call released by a restart, seconds:
#: this replica restarts; retry (another replica serves it) after a second.
RESTART_RETRY_AFTER_S = 1


class SubstrateUnavailable(BridgeError):
    """Redis (the substrate) could not be reached; the job may or may not be enqueued.

    Attributes:
        unsent: True when no connection to Redis could be made, so nothing of the
            operation was sent (the Bridge then knows a submit enqueued nothing);
            False when it may have reached Redis.
        refused: True when Redis answered the operation with an error reply that
            proves it wrote nothing (a submit refused before its script's first write:
            out of memory, too few replicas, a replica, a failed snapshot); the Bridge
            then knows the job was not enqueued, as with ``unsent``.
        retry_after_s: a hint, seconds: when a retry may find Redis usable
            (``UNAVAILABLE_RETRY_AFTER_S``; HTTP's ``Retry-After``).
    """

    status = "unavailable"
    retry_after_s = UNAVAILABLE_RETRY_AFTER_S
    unsent = False
    refused = False


class SubstrateMisconfigured(SubstrateUnavailable):
    """Redis refuses the configuration itself (``DESKBRIDGE_REDIS_URL`` names a database
    it does not have, or a wrong or missing password or user): no retry will help. A
    served hub refuses to start on it (one line, exit 2); anything later still answers
    ``unavailable``, as a subclass."""


class JobFailed(BridgeError):
    """The tool ran and failed. ``code`` and ``message`` come from the sidecar."""

    status = "failed"

    def __init__(self, message: str, *, code: str, job_id: str | None = None, **details: Any):
        super().__init__(message, job_id=job_id, **details)
        self.code = code


class JobTimeout(BridgeError):
    """The caller stopped waiting. ``details['stage']`` says what is known:
    ``queued``, ``delivered`` or ``running``, or ``unknown``."""

    status = "timeout"


class JobExpired(BridgeError):
    """The job's deadline passed before it started; it never ran."""

    status = "expired"


class JobLost(BridgeError):
    """The stream entry was trimmed or deleted before it ran; it never ran."""

    status = "lost"


class JobInDoubt(BridgeError):
    """The job started on the desktop but the sidecar stopped (crash, kill, power
    loss) before it finished: it may have acted. The sidecar's ledger refuses to run
    it again under the same idempotency key; check, then retry with a new key."""

    status = "in_doubt"


class JobDeclined(BridgeError):
    """The tool needs the approval of the person at the desktop, who declined; it never
    ran."""

    status = "declined"


class JobCancelled(BridgeError):
    """The job was cancelled (``Bridge.cancel``) before or while it ran."""

    status = "cancelled"


class BadRequest(BridgeError):
    """The call itself is malformed (``field`` names what); nothing was enqueued."""

    status = "bad_request"

    def __init__(self, message: str, *, field: str, **details: Any):
        super().__init__(message, **details)
        self.field = field


class IdempotencyKeyReused(BridgeError):
    """The idempotency key already names a job with other arguments or another tool
    (``details``: ``job_id`` of that job); nothing was enqueued (HTTP 422)."""

    status = "idempotency_key_reused"


class UnknownJob(BridgeError):
    """No such job: never dispatched, or its state expired (``result_ttl_s``)."""

    status = "not_found"


class JobIdInUse(BridgeError):
    """The caller-chosen ``job_id`` already names another job; nothing was enqueued."""

    status = "conflict"


class QueueFull(BridgeError):
    """The user already has ``limit`` jobs not yet acknowledged (queued or in flight:
    ``DESKBRIDGE_JOBS_MAXLEN``); this one was refused and nothing was enqueued or
    recorded. Accepted work is never dropped to make room: retry after
    ``retry_after_s`` seconds (HTTP 429 ``queue_full`` with ``Retry-After``), with the
    same idempotency key if the call had one.

    Attributes:
        user_id: whose queue is full.
        limit: the bound, entries (``Timings.jobs_maxlen``).
        retry_after_s: a hint, seconds: when a retry may find room.
    """

    status = "queue_full"

    def __init__(
        self,
        message: str,
        *,
        user_id: str,
        limit: int,
        retry_after_s: int,
        job_id: str | None = None,
        **details: Any,
    ):
        super().__init__(message, job_id=job_id, **details)
        self.user_id = user_id
        self.limit = limit
        self.retry_after_s = retry_after_s


class Overloaded(BridgeError):
    """This hub process is past what it can answer in time (too many calls in flight,
    or its event loop lagging: ``_admission``); the call was refused at once and nothing
    was enqueued or recorded, so a retry (here after ``retry_after_s`` seconds, or at
    another replica) is safe. HTTP 503 ``overloaded`` with ``Retry-After``.

    Attributes:
        user_id: whose call was refused.
        reason: ``calls`` (``DESKBRIDGE_MAX_CALLS`` in flight) or ``lag`` (the loop lags
            more than ``DESKBRIDGE_SHED_LAG_S``).
        retry_after_s: a hint, seconds.
    """

    status = "overloaded"

    def __init__(
        self, message: str, *, user_id: str, reason: str, retry_after_s: int, **details: Any
    ):
        super().__init__(message, **details)
        self.user_id = user_id
        self.reason = reason
        self.retry_after_s = retry_after_s


# -- errors inside the hub process (never raised to a dispatch caller) --------------------


class SocketClosed(Exception):
    """The sidecar's socket closed or broke (raised by a ``SidecarSocket``)."""


class EndSession(Exception):
    """End a sidecar session with this WebSocket close ``code`` and ``reason``.

    Raised by the session's tasks (a protocol violation, a ping deadline, token expiry,
    a hand-over to a newer session); the session sends the close frame after its nursery
    has ended.
    """

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason
