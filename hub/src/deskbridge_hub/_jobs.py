"""Job envelopes on the stream and result payloads on the result list. No I/O.

A stream entry's fields (all strings, as Redis stores them):
``job_id``, ``name``, ``args`` (JSON object), ``idempotency_key``, ``deadline`` and
``enqueued_at`` (Unix seconds on the substrate's clock: Redis ``TIME``, written by the
enqueue script; no hub's own clock ever sets or judges a deadline), and ``traceparent``
(W3C trace context of the caller) when the caller had one.

A result payload is a JSON object: ``{"status": <outcome>, "result"?: ..., "error"?:
{"code", "message"}, "detail"?: ...}`` where outcome is one of :data:`OUTCOMES`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
from deskbridge_common import CANCELLED, EXPIRED, IN_DOUBT, LOST

#: Terminal outcomes a result payload can carry (docs/outcomes.md).
OUTCOMES = frozenset(
    {"completed", "failed", "expired", "lost", "cancelled", "in_doubt", "declined"}
)


class MalformedEntry(ValueError):
    """A stream entry's body does not decode into a job (names the field)."""


@attrs.frozen
class JobEnvelope:
    """What the requester put on the user's stream.

    Attributes:
        job_id: requester's job id (also the result list's key suffix).
        name: tool name.
        args: tool keyword arguments.
        idempotency_key: stable across redeliveries; the sidecar dedupes on it.
        deadline: absolute deadline, Unix seconds on the substrate's clock (Redis TIME).
        enqueued_at: when it was enqueued, Unix seconds on the same clock.
        traceparent: the caller's W3C trace context, if any.
        reply_to: the caller's notification mailbox (its hub process), if any: the
            holder notifies it when it publishes the result.
    """

    job_id: str
    name: str
    args: dict[str, Any]
    idempotency_key: str
    deadline: float
    enqueued_at: float
    traceparent: str | None = None
    reply_to: str | None = None

    def to_fields(self) -> dict[str, str]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "args": json.dumps(self.args, separators=(",", ":")),
            "idempotency_key": self.idempotency_key,
            "deadline": repr(float(self.deadline)),
            "enqueued_at": repr(float(self.enqueued_at)),
        } | (
            ({"traceparent": self.traceparent} if self.traceparent else {})
            | ({"reply_to": self.reply_to} if self.reply_to else {})
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> JobEnvelope:
        """Decode stream fields.

        Raises:
            MalformedEntry: a field is missing or does not decode.
        """
        try:
            args = json.loads(fields["args"])
            if not isinstance(args, dict):
                raise MalformedEntry("args: not a JSON object")
            return cls(
                job_id=fields["job_id"],
                name=fields["name"],
                args=args,
                idempotency_key=fields["idempotency_key"],
                deadline=float(fields["deadline"]),
                enqueued_at=float(fields["enqueued_at"]),
                traceparent=fields.get("traceparent") or None,
                reply_to=fields.get("reply_to") or None,
            )
        except KeyError as exc:
            raise MalformedEntry(f"{exc.args[0]}: missing") from None
        except ValueError as exc:
            raise MalformedEntry(str(exc)) from None


def job_fields(
    job_id: str,
    name: str,
    args: dict[str, Any],
    idempotency_key: str,
    traceparent: str | None = None,
    reply_to: str | None = None,
    args_json: str | None = None,
) -> dict[str, str]:
    """The stream fields of a job without ``deadline`` and ``enqueued_at``, which the
    substrate adds from its own clock (``enqueue(..., start_within_s=...)``).
    ``args_json``: ``args`` already encoded (compact JSON), if the caller has it."""
    fields = {
        "job_id": job_id,
        "name": name,
        "args": json.dumps(args, separators=(",", ":")) if args_json is None else args_json,
        "idempotency_key": idempotency_key,
    }
    if traceparent:
        fields["traceparent"] = traceparent
    if reply_to:
        fields["reply_to"] = reply_to
    return fields


def result_payload(status: str, **body: Any) -> str:
    """Encode a terminal result payload for the result list."""
    if status not in OUTCOMES:
        raise ValueError(f"unknown outcome {status!r}")
    return json.dumps({"status": status, **body}, separators=(",", ":"))


def cancelled_before_start() -> str:
    """The payload for a job cancelled while queued (the one place it is written: the
    bridge answers a cancel of a queued job with it, the holder a job it reads with the
    cancel flag set)."""
    return result_payload(
        "cancelled",
        error={"code": CANCELLED, "message": "cancelled before it started"},
        detail={"stage": "queued"},
    )


def cancelled_unstarted_payload() -> str:
    """The payload for a cancelled job delivered before to the desktop it went to again,
    which said it never started it (no run of its key in its ledger): it did not run."""
    return result_payload(
        "cancelled",
        error={"code": CANCELLED, "message": "cancelled before it started"},
        detail={"stage": "delivered"},
    )


def interrupted_payload(
    reason: str, *, pending: bool = False, unkeyed_job: str | None = None, running: bool = False
) -> str:
    """The payload for a job delivered to the desktop whose session ended on purpose
    before it answered (``reason``: token expired, superseded, hub restarting): it may
    have acted. ``running``: the desktop reported it running; otherwise the message says
    it was delivered and not known to have started (it may have: the hub cannot tell).

    ``pending``: the answer is provisional (``detail.pending``: the same desktop comes
    back and its ledger answers the redelivery; a retry with the same idempotency key
    gets that outcome). Otherwise it is final: the job is not delivered again.
    ``unkeyed_job``: the job's id when its call had no idempotency key (its key is its
    job id): the advice names the job instead of a key (a retry without one is a new
    job)."""
    what = (
        "while the job ran"
        if running
        else "with the job delivered to it (not known to have started)"
    )
    if pending:
        where = (
            "a retry with the same idempotency key gets it"
            if unkeyed_job is None
            else f"GET /v1/jobs/{unkeyed_job} reports it (a new call would be a new job)"
        )
        message = (
            f"the desktop's session ended ({reason}) {what}; it may have acted. "
            f"Its outcome is still to come from the desktop's reconnected session: {where}"
        )
        detail: dict[str, object] = {"stage": "interrupted", "reason": reason, "pending": True}
    else:
        again = "retry with a new key" if unkeyed_job is None else "call again"
        message = (
            f"the desktop's session ended ({reason}) {what}; it may have acted "
            f"and is not delivered again. Check, then {again} if it should run"
        )
        detail = {"stage": "interrupted", "reason": reason}
    return result_payload(
        "in_doubt", error={"code": "interrupted", "message": message}, detail=detail
    )


def cancelled_in_doubt_payload() -> str:
    """The payload for a job whose cancel was found when it was to be delivered again: it
    had been forwarded to a desktop before (its socket or pod went away without an
    answer), and this redelivery's desktop is another one (or one of them is not known),
    which cannot tell whether the first ran it: it may have run; it is not delivered
    again (the same desktop is asked instead: ``_delivery``)."""
    reason = "cancelled after it was delivered"
    return result_payload(
        "in_doubt",
        error={
            "code": "interrupted",
            "message": "cancel requested after the job had been delivered to a desktop, "
            "which did not answer before its socket went away; it may have acted and is "
            "not delivered again",
        },
        detail={"stage": "interrupted", "reason": reason},
    )


def delivered_elsewhere_payload() -> str:
    """The payload for a job the desktop refused as late (it never started it there)
    while an earlier delivery went to another desktop of the user, or to one not known
    (its socket or pod went away without an answer): that one may have started it, so
    it is not "expired" (did not run)."""
    return result_payload(
        "in_doubt",
        error={
            "code": IN_DOUBT,
            "message": "this desktop refused the job as late, but it had been delivered "
            "to another desktop before, which did not answer and may have started it",
        },
        detail={"stage": "delivered", "reason": "delivered to another desktop before"},
    )


def lost_payload() -> str:
    """The payload for an entry trimmed or deleted before any executor received it."""
    return result_payload(
        "lost",
        error={"code": LOST, "message": "the queued entry was trimmed or deleted before it ran"},
    )


def expired_payload() -> str:
    """The payload for a job whose deadline passed before it was forwarded."""
    return result_payload(
        "expired",
        error={"code": EXPIRED, "message": "deadline passed before the job was forwarded"},
        detail={"stage": "queued"},
    )


def failed_payload(code: str, message: str) -> str:
    """The payload for a job the hub itself answers "failed" (``code`` names why)."""
    return result_payload("failed", error={"code": code, "message": message})


def parse_result(payload: str) -> dict[str, Any]:
    """Decode a result payload. Raises ValueError if it is not one."""
    obj = json.loads(payload)
    if not isinstance(obj, dict) or obj.get("status") not in OUTCOMES:
        raise ValueError("not a result payload")
    return obj
