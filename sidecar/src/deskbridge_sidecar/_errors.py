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


class ProxyRefused(ConnectFailed):
    """The HTTP proxy answered ``CONNECT`` with a status other than 2xx.

    The message names the proxy (never its password), the hub's ``host:port`` and the
    status. 407 (credentials refused) stops the daemon (:class:`ProxyAuthFailed`);
    every other status is retried with backoff.

    Attributes:
        status_code: the proxy's HTTP status (407, 403, 502 ...).
    """

    def __init__(self, message: str, *, status_code: int):
        super().__init__(message)
        self.status_code = status_code


class ProxyAuthFailed(Exception):
    """The HTTP proxy refused our credentials (407). The proxy URL is read once at start,
    so no retry could send others, and retrying a wrong password can lock the person's
    account: the daemon stops (the CLI exits 2, like a refused token).

    Attributes:
        message: the refusal's line (names the proxy, never its password).
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class HandshakeRejected(Exception):
    """The hub answered the WebSocket upgrade with an HTTP error status.

    Attributes:
        status_code: the HTTP status (401 and 403 mean the token was refused, unless
            ``code`` says the refusal is transient).
        code: the hub's error code from its JSON body (``{"error": {"code",
            "message"}}``), e.g. ``not_configured``, ``draining``,
            ``token_not_yet_valid``; "" when the body had none.
        message: the hub's reason (its JSON ``message``, or the body's text, cut to 300
            characters); "" when there was no body.
        retry_after_s: the ``Retry-After`` header in seconds, or None.
    """

    def __init__(
        self,
        status_code: int,
        code: str = "",
        message: str = "",
        retry_after_s: float | None = None,
    ):
        self.status_code = status_code
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        super().__init__(f"hub refused the WebSocket handshake with HTTP {status_code}")

    def describe(self) -> str:
        """``HTTP 503 (not_configured: hub has no DESKBRIDGE_SECRET ...)``."""
        said = ": ".join(part for part in (self.code, self.message) if part)
        return f"HTTP {self.status_code}" + (f" ({said})" if said else "")


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


class Superseded(Exception):
    """A newer sidecar of the same user connected and the hub closed this one with 4001.

    The daemon stops instead of reconnecting: reconnecting would supersede the newer one
    in turn, and two sidecars would take the user from each other for ever (issue 11).

    Attributes:
        reason: the hub's close reason.
    """

    def __init__(self, reason: str = ""):
        self.reason = reason
        super().__init__(
            "superseded: a newer sidecar for this user connected"
            + (f" (hub: {reason})" if reason else "")
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


class LedgerTemporary(LedgerError):
    """A fault of the disk or the machine, not of the configuration (``EIO``, ``EMFILE``,
    ``ENOMEM``, SQLite's ``SQLITE_IOERR`` ...: anything but a permission, a read-only file
    system, a file where the directory goes, or another sidecar holding the ledger).
    Temporary: the CLI exits 75 (``EX_TEMPFAIL``) on it at start, so a service manager
    restarts it."""


class LedgerFull(LedgerTemporary):
    """The disk (or the user's quota) is full: SQLite answered ``SQLITE_FULL``, or the
    data directory could not be created for ``ENOSPC`` / ``EDQUOT``. Temporary: the CLI
    exits 75 (``EX_TEMPFAIL``) on it at start, so a service manager restarts it."""


class LedgerLocked(LedgerError):
    """Another sidecar process holds this ledger (one daemon per data directory)."""


__all__ = [
    "ArgsInvalid",
    "ConnectFailed",
    "HandshakeRejected",
    "LedgerError",
    "LedgerFull",
    "LedgerTemporary",
    "LedgerLocked",
    "ProxyAuthFailed",
    "ProxyRefused",
    "Superseded",
    "TokenRefused",
    "ToolError",
    "TransportClosed",
]
