"""What one execution of a tool came to: a JSON-able result, or an error code + message.

Outcomes are what the dedupe cache stores; :meth:`Outcome.reply` turns one into the
``job_result`` frame for a particular delivery ``id``.
"""

from __future__ import annotations

import json

import attrs
from deskbridge_common import (
    BAD_ARGS,
    BAD_RESULT,
    CANCELLED,
    CRASHED,
    DECLINED,
    EXPIRED,
    IDEMPOTENCY_KEY_REUSED,
    IN_DOUBT,
    LEDGER_ERROR,
    MAX_FRAME_BYTES,
    MAX_ID_CHARS,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    JobError,
    JobResult,
    RawJSON,
    encode_frame,
    holds_lone_surrogate,
    replace_lone_surrogates,
)

#: Longest error message sent, in characters (a crash repr is cut to this).
MAX_MESSAGE_CHARS = 2000
#: Bytes of a ``job_result`` frame around its result, for the longest delivery id:
#: ``{"type":"job_result","id":"<MAX_ID_CHARS>","ok":true,"result":}``.
_RESULT_FRAME_OVERHEAD = len(
    encode_frame(JobResult(id="x" * MAX_ID_CHARS, ok=True, result=RawJSON("")))
)
#: Largest serialised result that fits in a frame (``MAX_FRAME_BYTES`` less the above).
MAX_RESULT_BYTES = MAX_FRAME_BYTES - _RESULT_FRAME_OVERHEAD


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut ``text`` to at most ``limit`` characters, marking the cut with ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@attrs.frozen
class Outcome:
    """The outcome of one tool execution (or of refusing to execute).

    The result is kept as its JSON text (``result_json``), serialised once when the tool
    returns: that text is what the dedupe cache holds and what every reply splices into
    its frame (:class:`RawJSON`), so a redelivery neither re-encodes nor re-checks it.

    Attributes:
        ok: True if the tool returned normally.
        result_json: the tool's value as compact JSON text (only when ``ok``).
        error: code and message (only when not ``ok``).
    """

    ok: bool
    result_json: str | None = None
    error: JobError | None = None

    @property
    def result(self) -> object:
        """The tool's JSON value, parsed from ``result_json`` (None when not ``ok``).
        Parses on every access: for inspection, not for the reply path."""
        return None if self.result_json is None else json.loads(self.result_json)

    @classmethod
    def success(cls, result: object) -> Outcome:
        """Wrap a tool's return value, normalised to plain JSON.

        Serialises ``result`` once (compact, ASCII). A value that is not
        JSON-serialisable, contains NaN/Infinity or a lone surrogate (text that is not
        valid Unicode), nests too deeply, or would not fit in a
        ``MAX_FRAME_BYTES`` frame with the longest delivery id becomes a ``bad_result``
        failure instead (the tool ran; its value cannot be sent). Checking here, once,
        means a cached outcome can always be sent, so a redelivery can never break the
        writer.
        """
        try:
            text = json.dumps(result, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            return cls.failure(BAD_RESULT, f"result is not JSON-serialisable: {exc!r}")
        if holds_lone_surrogate(text):  # a name that is not UTF-8, as os.fsdecode gives it
            return cls.failure(
                BAD_RESULT,
                "result is not valid Unicode text: it holds a lone surrogate (text decoded "
                "from bytes that are not UTF-8, such as a file name)",
            )
        if len(text) > MAX_RESULT_BYTES:  # ASCII: characters are bytes
            return cls.failure(
                BAD_RESULT,
                f"result cannot be sent: {len(text)} bytes of JSON exceed the "
                f"{MAX_RESULT_BYTES} a {MAX_FRAME_BYTES}-byte frame leaves for it",
            )
        return cls(ok=True, result_json=text)

    @classmethod
    def failure(cls, code: str, message: str) -> Outcome:
        """A failed outcome with ``code`` (1-64 chars) and ``message`` (truncated; a lone
        surrogate in it replaced by U+FFFD)."""
        message = truncate(replace_lone_surrogates(message))
        return cls(ok=False, error=JobError(code=code, message=message))

    @property
    def code(self) -> str | None:
        """The error code, or None when ``ok``."""
        return None if self.error is None else self.error.code

    def reply(self, delivery_id: str) -> JobResult:
        """The ``job_result`` frame answering delivery ``delivery_id`` with this outcome."""
        if self.ok:
            return JobResult(id=delivery_id, ok=True, result=RawJSON(self.result_json or "null"))
        return JobResult(id=delivery_id, ok=False, error=self.error)


def outcome_to_json(outcome: Outcome) -> str:
    """The ledger's text for ``outcome`` (the result kept as its JSON text)."""
    if outcome.ok:
        return json.dumps({"ok": True, "result_json": outcome.result_json})
    assert outcome.error is not None
    error = {"code": outcome.error.code, "message": outcome.error.message}
    return json.dumps({"ok": False, "error": error}, separators=(",", ":"))


def outcome_from_json(text: str) -> Outcome:
    """The :class:`Outcome` written by :func:`outcome_to_json`."""
    data = json.loads(text)
    if data["ok"]:
        return Outcome(ok=True, result_json=data["result_json"])
    err = data["error"]
    return Outcome(ok=False, error=JobError(code=err["code"], message=err["message"]))


__all__ = [
    "BAD_ARGS",
    "BAD_RESULT",
    "CANCELLED",
    "CRASHED",
    "DECLINED",
    "EXPIRED",
    "IDEMPOTENCY_KEY_REUSED",
    "IN_DOUBT",
    "LEDGER_ERROR",
    "MAX_MESSAGE_CHARS",
    "MAX_RESULT_BYTES",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "Outcome",
    "outcome_from_json",
    "outcome_to_json",
    "truncate",
]
