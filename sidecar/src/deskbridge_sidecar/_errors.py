"""The sidecar's own exceptions. Third-party errors (trio-websocket, OSError) are mapped
into these at the transport boundary, so nothing above ``_transport`` imports them."""

from __future__ import annotations

import re

from deskbridge_common import TOOL_ERROR

#: A tool's error code: 1-64 non-space characters (what the codec accepts).
_CODE_RE = re.compile(r"[^\s]{1,64}\Z")


class TransportClosed(Exception):
    """The WebSocket is closed (by the peer, by us, or by the network).

    Attributes:
        code: the close code: the peer's (1012, 1001, 4001, ...), ours, or 1006 when the
            connection broke without a close frame.
        reason: the close reason text ("" if none).
    """

    def __init__(self, code: int, reason: str = ""):
        self.code = code
        self.reason = reason
        super().__init__(f"connection closed ({code}{': ' + reason if reason else ''})")


class ConnectFailed(Exception):
    """Could not open the WebSocket: DNS, TCP, TLS, timeout, or a broken HTTP upgrade.

    Always retried with backoff.
    """


class HandshakeRejected(Exception):
    """The hub answered the WebSocket upgrade with an HTTP error status.

    Attributes:
        status_code: the HTTP status (401 and 403 mean the token was refused).
    """

    def __init__(self, status_code: int):
        self.status_code = status_code
        super().__init__(f"hub refused the WebSocket handshake with HTTP {status_code}")


class TokenRefused(Exception):
    """The hub refused our token (HTTP 401 or 403). Retrying cannot help: the daemon stops.

    Attributes:
        status_code: 401 or 403.
    """

    def __init__(self, status_code: int):
        self.status_code = status_code
        super().__init__(
            f"token refused by hub ({status_code}): issue a new one with "
            "`deskbridge-hub token USER_ID`"
        )


class ToolError(Exception):
    """Raise from a tool to report a failure the caller should see.

    The job is answered ``ok: false`` with ``error.code`` = ``code`` and ``error.message``
    = ``message``. Failures are cached by idempotency key like successes (the tool ran).

    Args:
        message: human-readable explanation (truncated to 2000 characters on the wire).
        code: machine-readable code, 1-64 non-space characters; default ``"tool_error"``.
            An invalid code is replaced by ``"tool_error"``.
    """

    def __init__(self, message: str, *, code: str = TOOL_ERROR):
        super().__init__(message)
        self.message = str(message)
        self.code = code if isinstance(code, str) and _CODE_RE.match(code) else TOOL_ERROR


class ArgsInvalid(ValueError):
    """A job's ``args`` do not match the tool's parameters; the message names each field."""


class LedgerError(Exception):
    """The ledger could not be read or written (disk full, I/O error)."""


class LedgerLocked(LedgerError):
    """Another sidecar process holds this ledger (one daemon per data directory)."""


__all__ = [
    "ArgsInvalid",
    "ConnectFailed",
    "HandshakeRejected",
    "LedgerError",
    "LedgerLocked",
    "TokenRefused",
    "ToolError",
    "TransportClosed",
]
