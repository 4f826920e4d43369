"""What one execution of a tool came to: a JSON-able result, or an error code + message.

Outcomes are what the dedupe cache stores; :meth:`Outcome.reply` turns one into the
``job_result`` frame for a particular delivery ``id``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from deskbridge_common import JobError, JobResult, LocalProtocolError, encode_frame

# Error codes of job_result.error.code, as the sidecar uses them.
TOOL_ERROR = "tool_error"  #: the tool raised ToolError (which may carry its own code)
UNKNOWN_TOOL = "unknown_tool"  #: no tool of that name in this sidecar's catalogue
BAD_ARGS = "bad_args"  #: args do not bind to the tool's keyword parameters
CRASHED = "crashed"  #: the tool raised an unexpected exception (message = its repr)
EXPIRED = "expired"  #: the job's deadline passed before it started; never started
CANCELLED = "cancelled"  #: the hub cancelled the delivery (or the daemon stopped)
BAD_RESULT = "bad_result"  #: the tool returned something that is not JSON or too big
#: the key was first used for another tool or other arguments; nothing ran (issue 12)
IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
#: the job started in a sidecar process that died before it finished; may have acted
IN_DOUBT = "in_doubt"
#: the sidecar could not read or write its ledger; the tool did not start
LEDGER_ERROR = "ledger_error"

#: Longest error message sent, in characters (a crash repr is cut to this).
MAX_MESSAGE_CHARS = 2000
#: Longest delivery id the codec accepts; results are checked against the worst case.
MAX_ID_CHARS = 200


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut ``text`` to at most ``limit`` characters, marking the cut with ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@attrs.frozen
class Outcome:
    """The outcome of one tool execution (or of refusing to execute).

    Attributes:
        ok: True if the tool returned normally.
        result: the tool's JSON value (only when ``ok``).
        error: code and message (only when not ``ok``).
    """

    ok: bool
    result: Any = None
    error: JobError | None = None

    @classmethod
    def success(cls, result: Any) -> Outcome:
        """Wrap a tool's return value, normalised to plain JSON.

        A value that is not JSON-serialisable, contains NaN/Infinity, nests too deeply,
        or would not fit in a ``MAX_FRAME_BYTES`` frame becomes a ``bad_result`` failure
        instead (the tool ran; its value cannot be sent). Checking here, once, means a
        cached outcome can always be sent, so a redelivery can never break the writer.
        """
        try:
            value = json.loads(json.dumps(result, allow_nan=False, separators=(",", ":")))
            encode_frame(JobResult(id="x" * MAX_ID_CHARS, ok=True, result=value))
        except (TypeError, ValueError, RecursionError) as exc:
            return cls.failure(BAD_RESULT, f"result is not JSON-serialisable: {exc!r}")
        except LocalProtocolError as exc:
            return cls.failure(BAD_RESULT, f"result cannot be sent: {exc}")
        return cls(ok=True, result=value)

    @classmethod
    def failure(cls, code: str, message: str) -> Outcome:
        """A failed outcome with ``code`` (1-64 chars) and ``message`` (truncated)."""
        return cls(ok=False, error=JobError(code=code, message=truncate(message)))

    @property
    def code(self) -> str | None:
        """The error code, or None when ``ok``."""
        return None if self.error is None else self.error.code

    def reply(self, delivery_id: str) -> JobResult:
        """The ``job_result`` frame answering delivery ``delivery_id`` with this outcome."""
        if self.ok:
            return JobResult(id=delivery_id, ok=True, result=self.result)
        return JobResult(id=delivery_id, ok=False, error=self.error)


__all__ = [
    "BAD_ARGS",
    "BAD_RESULT",
    "CANCELLED",
    "CRASHED",
    "EXPIRED",
    "IDEMPOTENCY_KEY_REUSED",
    "IN_DOUBT",
    "LEDGER_ERROR",
    "MAX_MESSAGE_CHARS",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "Outcome",
    "truncate",
]
