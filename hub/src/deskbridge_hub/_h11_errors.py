"""JSON bodies for the HTTP/1.1 errors Hypercorn answers itself, before any app sees the
request: the API's error shape ``{"error": {"code", "message"}}`` instead of an empty
body.

h11 refuses what it cannot parse (``h11.RemoteProtocolError``) and Hypercorn answers
with the error's status hint and ``Content-Length: 0``: **431** for a request head over
``h11_max_incomplete_size`` (16 KiB: a 100,000-character URL), **400** for a malformed
request line or header (no ``Host``, a bad ``Content-Length``, a header line without a
colon, a request target that is not ASCII), **501** for a ``Transfer-Encoding`` other
than ``chunked``. A client then saw a bare status while every other error of the API
named its cause. :class:`JsonErrorH11Protocol` sends the same status with a JSON body
naming it (the limit for a 431, h11's reason for the rest) and still closes the
connection, as Hypercorn does: after a parse error nothing more on it can be trusted.
The same for a WebSocket upgrade Hypercorn refuses before the app sees it
(:class:`JsonErrorWSStream`: **400** for a handshake missing what RFC 6455 requires, e.g.
``Sec-WebSocket-Version: 8``, or a body sent with it; **500** when the app failed before
it accepted or refused), which also closes its connection after a refusal of its own
(it said ``Connection: close`` and left it open).

Hypercorn has no setting for these bodies, so :func:`install` replaces ``H11Protocol``
in ``hypercorn.protocol`` and ``WSStream`` in ``hypercorn.protocol.h11`` (looked up for
each new connection, each upgrade). Idempotent.
"""

from __future__ import annotations

import json
import sys
import time
from itertools import chain

import h11
import hypercorn.protocol
import hypercorn.protocol.h11
from deskbridge_common import _codes, safe_text
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.ws_stream import WSStream


def parse_error_body(status: int, reason: str, head_limit: int) -> bytes:
    """The JSON body of Hypercorn's answer ``status`` to a request h11 refused for
    ``reason``; ``head_limit``: the request head's limit, bytes (named by a 431)."""
    code = _codes.HTTP_STATUS_CODES.get(status, _codes.BAD_REQUEST)
    if status == 431:
        message = (
            f"the request head (request line and headers) is over {head_limit} bytes, the "
            "hub's limit: shorten the URL or the headers"
        )
    else:
        message = f"malformed HTTP/1.1 request: {safe_text(reason)}"
    return json.dumps({"error": {"code": code, "message": message}}).encode()


class JsonErrorH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol whose answers to unparseable requests carry a JSON
    body (module docstring)."""

    async def _send_error_response(self, status_code: int) -> None:
        # called by ``_handle_events`` while it handles the RemoteProtocolError
        error = sys.exc_info()[1]
        body = parse_error_body(
            status_code, str(error or "unparseable"), self.config.h11_max_incomplete_size
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(chain(headers, self.config.response_headers("h11"))),
            )
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


#: What a WebSocket upgrade Hypercorn refuses is told, by status.
UPGRADE_MESSAGES = {
    400: (
        "malformed WebSocket upgrade: it takes GET over HTTP/1.1 with Connection: Upgrade, "
        "Upgrade: websocket, a Sec-WebSocket-Key and Sec-WebSocket-Version: 13, and no body"
    ),
    403: "the WebSocket upgrade was refused",
    404: "Not Found",
    500: "Internal Server Error: the WebSocket upgrade failed in the hub",
}


#: The refusals Hypercorn makes before it starts the app (a malformed handshake, an
#: unknown server name); the others (403, 500) are made for an app that then ends.
_BEFORE_THE_APP = frozenset({400, 404})


class JsonErrorWSStream(WSStream):
    """Hypercorn's WebSocket stream whose refusals before the app answers carry a JSON
    body (module docstring)."""

    async def _send_error_response(self, status_code: int) -> None:
        code = _codes.HTTP_STATUS_CODES.get(status_code, _codes.BAD_REQUEST)
        message = UPGRADE_MESSAGES.get(status_code, "WebSocket upgrade refused")
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await self.send(
            Response(stream_id=self.stream_id, status_code=status_code, headers=headers)
        )
        await self.send(Body(stream_id=self.stream_id, data=body))
        await self.send(EndBody(stream_id=self.stream_id))
        await self.config.log.access(
            self.scope, {"status": status_code, "headers": []}, time.time() - self.start_time
        )
        if status_code in _BEFORE_THE_APP:
            # no app runs to end the stream: Hypercorn left the connection open after
            # its "Connection: close" until the client closed it
            await self.send(StreamClosed(stream_id=self.stream_id))


def install() -> None:
    """Make every HTTP/1.1 connection Hypercorn accepts from now on in this process answer
    an unparseable request, or a WebSocket upgrade it refuses, with a JSON error body.
    Idempotent."""
    hypercorn.protocol.H11Protocol = JsonErrorH11Protocol  # type: ignore[attr-defined]
    hypercorn.protocol.h11.WSStream = JsonErrorWSStream  # type: ignore[attr-defined]


__all__ = [
    "UPGRADE_MESSAGES",
    "JsonErrorH11Protocol",
    "JsonErrorWSStream",
    "install",
    "parse_error_body",
]
