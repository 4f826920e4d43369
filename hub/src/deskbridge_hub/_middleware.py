"""ASGI middleware around the hub app: the access log (one line per HTTP request), the
tracking of HTTP requests in flight that a graceful shutdown waits for, and the last send
of a Quart answer shielded from quart-trio's own cancellation (``_whole_last_send``)."""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from ._logging import fields
from ._process import HubState

#: Paths probed by load balancers and Prometheus: their access lines are DEBUG.
_QUIET_PATHS = frozenset({"/healthz", "/livez", "/metrics"})
access_log = logging.getLogger("deskbridge.hub.access")
#: The bound on an answer's last send, seconds: Hypercorn ends the response, then closes
#: the connection or restarts its keep-alive timer (no network wait: its writes are
#: shielded by Hypercorn itself).
LAST_SEND_S = 5.0


def _access_log(asgi_app: Any) -> Any:
    """ASGI middleware: one INFO line per HTTP request once its response has started
    (method, path, status, elapsed_ms, client), as ``extra`` fields for JSON logs."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        started = time.monotonic()
        status: list[int] = []

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await asgi_app(scope, receive, sending)
        finally:
            path = scope.get("path", "")
            client = scope.get("client") or ("-", 0)
            elapsed_s = time.monotonic() - started
            code = status[0] if status else 0
            access_log.log(
                logging.DEBUG if path in _QUIET_PATHS and code < 500 else logging.INFO,
                '%s - "%s %s" %s %.1f ms',
                client[0],
                scope.get("method", "-"),
                path,
                code or "-",
                elapsed_s * 1000,
                extra=fields(
                    method=scope.get("method"),
                    path=path,
                    status=code or None,
                    client=client[0],
                    elapsed_s=elapsed_s,
                ),
            )

    return app


def _tracking_http(asgi_app: Any, holder: dict[str, Any]) -> Any:
    """ASGI middleware: count each HTTP request until its response has been sent, so a
    graceful shutdown lets waiting callers get their answer before the process exits."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        state: HubState | None = holder.get("state")
        if scope["type"] != "http" or state is None:
            await asgi_app(scope, receive, send)
            return
        with state.drain.tracking_request():
            await asgi_app(scope, receive, send)

    return app


def _whole_last_send(asgi_app: Any) -> Any:
    """ASGI middleware for Quart's HTTP requests: the answer's last ``send`` (the body
    message without ``more_body``) runs shielded from cancellation, for at most
    ``LAST_SEND_S``.

    Why: inside that send Hypercorn ends the response, reports the stream closed to the
    app (``http.disconnect``), then closes the connection (``Connection: close``,
    HTTP/1.0) or restarts its keep-alive timer. quart-trio cancels the request's tasks on
    that ``http.disconnect``, and the cancellation reached Hypercorn's ``send_eof`` and
    its timer's lock: the connection stayed open after the answer (a client reading to
    EOF waited for ever) and an idle keep-alive connection was never closed by the hub.
    The plain-ASGI routes (``_jobs_asgi``, ``_mcp_mount``) do not cancel themselves there.
    """

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] != "http.response.body" or message.get("more_body", False):
                await send(message)
                return
            with trio.CancelScope(shield=True, deadline=trio.current_time() + LAST_SEND_S):
                await send(message)

        await asgi_app(scope, receive, sending)

    return app
