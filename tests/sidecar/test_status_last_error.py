"""``last_error`` in the status file (``deskbridge-sidecar status``) says how the last
session or attempt ended. An attempt that never had a WebSocket (the connection could not
be opened, or the hub refused the upgrade with an HTTP status) has no close code: it read
``rejected: 1006 token refused: hub answered HTTP 401 ...``, 1006 being the placeholder
the daemon records for such attempts, as if a socket had broken."""

from __future__ import annotations

from deskbridge_common import CLOSE_ABNORMAL
from deskbridge_sidecar._reconnect import CONNECT_FAILED, REJECTED
from deskbridge_sidecar._session import CLOSED, SessionEnd
from deskbridge_sidecar._status import _describe_end


def _end(cause: str, code: int, reason: str, session_id: str | None = None) -> SessionEnd:
    return SessionEnd(
        cause=cause, code=code, reason=reason, by_hub=True, session_id=session_id, duration_s=0.1
    )


def test_an_attempt_without_a_socket_is_described_without_a_close_code():
    refused = "token refused: hub answered HTTP 401 (unauthorized: token revoked)"
    assert _describe_end(_end(REJECTED, CLOSE_ABNORMAL, refused)) == f"rejected: {refused}"
    unreachable = "cannot connect to 127.0.0.1:8080: all attempts failed"
    described = _describe_end(_end(CONNECT_FAILED, CLOSE_ABNORMAL, unreachable))
    assert described == f"connect_failed: {unreachable}"


def test_a_closed_socket_keeps_its_close_code():
    assert _describe_end(_end(CLOSED, 4003, "token revoked", "s1")) == "closed: 4003 token revoked"
    assert _describe_end(_end(CLOSED, CLOSE_ABNORMAL, "", "s1")) == "closed: 1006"
    assert _describe_end(None) is None
