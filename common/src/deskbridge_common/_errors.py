"""Protocol errors, split by blame (after h11's Local/RemoteProtocolError).

Each error names the offending ``field`` and carries the WebSocket close code the
receiving end should use (RFC 6455 section 7.4.1):

* 1007 (invalid frame payload data): the text is not JSON, not an object, or a field
  has the wrong type or value.
* 1008 (policy violation): an unknown frame type, an unexpected or missing field, or a
  frame that is not allowed in this direction or state.
* 1009 (message too big): a frame over the size limit.
"""

from __future__ import annotations

from ._codes import CLOSE_INVALID_PAYLOAD, close_reason


class ProtocolError(Exception):
    """A frame broke the deskbridge protocol.

    Attributes:
        field: dotted name of the offending field (``"type"``, ``"args"``,
            ``"error.code"``), ``"$"`` for the frame as a whole, or ``""`` when the
            error is not about one frame (a deadline); ``reason`` is then the message alone.
        close_code: WebSocket close code to use when closing for this error.
        reason: short human-readable reason, at most 123 bytes of UTF-8 so it fits in a
            close frame.
    """

    def __init__(self, field: str, message: str, close_code: int = CLOSE_INVALID_PAYLOAD):
        field = _printable(field, 64)
        self.field = field
        self.close_code = close_code
        message = _printable(message, 200)
        self.reason = close_reason(f"{field}: {message}" if field else message)
        super().__init__(self.reason)


class RemoteProtocolError(ProtocolError):
    """The peer sent a frame that breaks the protocol; close its socket with ``close_code``."""


class LocalProtocolError(ProtocolError):
    """We were about to send a frame that breaks the protocol (a bug on this side)."""


def _printable(text: str, limit: int) -> str:
    """Escape control and non-ASCII characters, so a peer's field names cannot forge log
    lines or close reasons, and cap the length."""
    if text.isascii() and text.isprintable() and len(text) <= limit:
        return text
    escaped = text[:limit].encode("ascii", "backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    return escaped + ("..." if len(text) > limit else "")


__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]
