"""The v1 frames as frozen attrs classes. Pure data, no I/O.

Wire shape: one JSON object per WebSocket text message, with a ``type`` member naming
the frame and the fields below. See docs/protocol.md for the full reference.
"""

from __future__ import annotations

from typing import Any

import attrs

PROTOCOL_VERSION = 1

#: ``progress.stage``: the delivery waits for the approval of the person at the desktop.
STAGE_AWAITING_APPROVAL = "awaiting_approval"
#: ``progress.stage``: the delivery may run (approved, or no approval was needed).
STAGE_RUNNING = "running"
#: Every ``progress.stage`` value.
DESK_STAGES = frozenset({STAGE_AWAITING_APPROVAL, STAGE_RUNNING})


@attrs.frozen
class ToolSpec:
    """One entry of the sidecar's tool catalogue.

    Attributes:
        name: tool name, ``[A-Za-z0-9_.-]{1,64}``.
        description: free text for humans and agents.
        args_schema: JSON Schema (draft 2020-12) of the tool's ``args`` object.
        side_effects: True if running the tool twice is not harmless (a click, a submit).
        approval_after_wait_s: the tool needs the approval of the person at the desktop
            before it starts when the job waited at least this long, seconds, since it
            was enqueued (0: always); None (left out of the frame): never.
    """

    name: str
    description: str = ""
    args_schema: dict[str, Any] = attrs.field(factory=lambda: {"type": "object"})
    side_effects: bool = False
    approval_after_wait_s: float | None = None


@attrs.frozen
class Hello:
    """sidecar -> hub, first frame of every session.

    Attributes:
        protocol_version: :data:`PROTOCOL_VERSION`.
        sidecar_version: the sidecar's package version.
        tools: the tool catalogue.
        daemon_id: the daemon instance: the same for every session of one sidecar whose
            durable ledger is the same (it is stored in the ledger), so the hub may hand
            that daemon its own unfinished deliveries at once (issue 12.4: its ledger
            joins or answers them; docs/architecture.md). Optional (older sidecars).
        slept_s: the machine slept (or the loop was wedged) this long, seconds, just
            before this session: the clock watchdog's gap. Optional; left out when none.
    """

    protocol_version: int
    sidecar_version: str
    tools: tuple[ToolSpec, ...] = ()
    daemon_id: str | None = None
    slept_s: float | None = None
    type = "hello"


@attrs.frozen
class Welcome:
    """hub -> sidecar, answer to ``hello``.

    Attributes:
        session_id: the hub's id for this socket (also the presence key's value).
        heartbeat_s: presence heartbeat interval, seconds.
        ping_interval_s: how often each side sends an application-level ping, seconds.
        ping_timeout_s: how long a ping may go unanswered before the socket is dropped.
    """

    session_id: str
    heartbeat_s: float
    ping_interval_s: float
    ping_timeout_s: float
    type = "welcome"


@attrs.frozen
class Job:
    """hub -> sidecar: run a tool.

    Attributes:
        id: delivery id, minted fresh by the hub for every delivery; ``job_result``
            answers with it.
        job_id: the requester's job id, stable across redeliveries.
        name: tool name.
        args: keyword arguments for the tool (a JSON object).
        idempotency_key: set once by the requester, unchanged on every redelivery; the
            sidecar deduplicates on it.
        deadline: absolute deadline, Unix time in seconds by the *hub's* clock; a job
            arriving after it must not start. Machines' clocks differ, so a receiver
            prefers ``timeout_s`` when present.
        timeout_s: seconds left before the deadline when the hub sent the frame (a
            duration, as gRPC propagates deadlines as ``grpc-timeout``): the sidecar's
            deadline is its own clock at receipt plus this. Optional (older hubs).
        traceparent: the caller's W3C trace context (``traceparent`` header value), so
            the tool runs in the caller's trace; left out of the frame when None.
        waited_s: seconds since the job was enqueued when the hub sent the frame (a
            duration on the hub's clock, like ``timeout_s``); what a tool's
            ``approval_after_wait_s`` is compared with. Optional (older hubs).
    """

    id: str
    job_id: str
    name: str
    args: dict[str, Any]
    idempotency_key: str
    deadline: float
    timeout_s: float | None = None
    traceparent: str | None = None
    waited_s: float | None = None
    type = "job"


@attrs.frozen
class RawJSON:
    """A JSON value already serialised (compact, ASCII, finite numbers only).

    A ``job_result`` may carry its ``result`` this way, so a large result is serialised
    once, where it is produced, and spliced into the frame as is (issue 9: a 1 MiB result
    used to be encoded three times and parsed three times on its way out).

    Attributes:
        text: the JSON text, e.g. ``'{"a":[1,2]}'``. The producer vouches that it is valid
            JSON (``json.dumps(..., allow_nan=False)`` output); the codec does not re-parse it.
    """

    text: str


@attrs.frozen
class JobError:
    """Why a job failed: a machine-readable ``code`` and a human ``message``."""

    code: str
    message: str


@attrs.frozen
class JobResult:
    """sidecar -> hub: the outcome of one delivery, answered on the delivery ``id``.

    Exactly one of ``result`` (when ``ok``) and ``error`` (when not ``ok``) is meaningful.
    ``result`` is a JSON value, or a :class:`RawJSON` holding one already serialised (as
    sent; a decoded frame always holds the plain value).
    """

    id: str
    ok: bool
    result: Any = None
    error: JobError | None = None
    type = "job_result"


@attrs.frozen
class Cancel:
    """hub -> sidecar: cancel the running delivery ``id`` (the tool task is cancelled)."""

    id: str
    type = "cancel"


@attrs.frozen
class Progress:
    """sidecar -> hub: how far the running delivery ``id`` has got.

    Legal only while ``id`` is outstanding (delivered and not yet answered). Shaped after
    MCP's ``notifications/progress``.

    Attributes:
        id: the delivery id of the running job.
        progress: progress so far (any finite number; meant to increase).
        total: the value ``progress`` will reach when done, if known (finite, >= 0).
        message: a short human-readable status, if any.
        stage: where the delivery is on the desktop, when the sidecar says (one of
            :data:`DESK_STAGES`): ``awaiting_approval`` while the tool waits for the
            person's approval, ``running`` once it may run; None for a plain report.
    """

    id: str
    progress: float
    total: float | None = None
    message: str | None = None
    stage: str | None = None
    type = "progress"


@attrs.frozen
class Sleeping:
    """sidecar -> hub: the machine is about to sleep (an OS notification, or the person
    said so); the sidecar closes the socket next. Until a new session of this user says
    ``hello``, presence reads ``asleep`` instead of ``offline`` (issue 12.6)."""

    type = "sleeping"


@attrs.frozen
class Ping:
    """Either direction: application-level ping; the peer answers ``pong`` with the nonce."""

    nonce: str
    type = "ping"


@attrs.frozen
class Pong:
    """Either direction: answer to ``ping``."""

    nonce: str
    type = "pong"


@attrs.frozen
class Error:
    """Either direction: the sender is about to close, or refuses a frame, and says why."""

    code: str
    message: str
    type = "error"


Frame = Hello | Welcome | Job | JobResult | Progress | Cancel | Sleeping | Ping | Pong | Error
