"""``GET /v1/sidecar`` (the sidecar's WebSocket) served as plain ASGI, in front of Quart.

Why not a Quart ``@app.websocket`` route (issue 10): a hub process holds thousands of idle
sockets, and what one costs is paid per socket and per ping. Quart's route gives every
socket a request context, a ``Headers`` copy, a ``Websocket`` object, one more task and
one more memory channel (``quart_trio.asgi.TrioASGIWebsocketConnection.handle_messages``
forwards each message from Hypercorn's channel into its own, and sends the
``websocket_received`` signal on the way). Served here, a message goes from Hypercorn's
ASGI ``receive`` straight to the session's reader: one task and one channel hop fewer per
message, less memory per socket (``bench/idle.py`` measures both). The handshake's checks
and its HTTP refusals are the same as the route's were: the token, the drain, the secret.

Refusals use the ASGI WebSocket denial response (``websocket.http.response.*``; Hypercorn
and Quart's test client both support it), with the hub's JSON error body.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import trio
from deskbridge_common import CLOSE_TRY_AGAIN_LATER, _codes

from ._accept import install as install_accept
from ._errors import SocketClosed, SubstrateUnavailable
from ._fd_limits import install as install_fd_limits
from ._handshake import UNAVAILABLE_REASON
from ._revocation import refusal
from ._session import serve_sidecar
from ._tokens import TokenExpired, TokenNotYetValid, TokenRejected, verify_claims
from ._ws_limits import install as install_ws_limits

log = logging.getLogger("deskbridge.hub")

#: The path sidecars dial (docs/protocol.md).
SIDECAR_PATH = "/v1/sidecar"


class AsgiSocket:
    """One accepted ASGI WebSocket as a :class:`deskbridge_hub._session.SidecarSocket`.

    Args:
        receive: the connection's ASGI ``receive`` callable.
        send: the connection's ASGI ``send`` callable.
    """

    __slots__ = ("_receive", "_send", "_closed")

    def __init__(self, receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self._closed = False

    async def receive(self) -> str | bytes:
        """The next message (text or bytes).

        Raises:
            SocketClosed: the peer closed the socket or it broke (``websocket.disconnect``).
        """
        while True:  # skips ``websocket.connect``
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.receive":
                text = message.get("text")
                return text if text is not None else bytes(message.get("bytes") or b"")
            if kind == "websocket.disconnect":
                self._closed = True
                raise SocketClosed(f"socket closed ({message.get('code', 1005)})")

    async def send(self, data: str) -> None:
        """Send one text message.

        Raises:
            SocketClosed: this side closed the socket already.
        """
        if self._closed:
            raise SocketClosed("closed")
        await self._send({"type": "websocket.send", "text": data})

    async def close(self, code: int, reason: str) -> None:
        """Send the close frame with ``code`` and ``reason`` (once; later calls do nothing)."""
        if not self._closed:
            self._closed = True
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


async def _refuse(
    send: Any, status: int, code: str, message: str, *, retry_after_s: int | None = None
) -> None:
    """Refuse the upgrade with an HTTP response: ``{"error": {"code", "message"}}``, a
    401 with ``WWW-Authenticate: Bearer`` (RFC 9110 15.5.2)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after_s is not None:
        headers.append((b"retry-after", b"%d" % retry_after_s))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


async def _upgrade_required(send: Any) -> None:
    """426 with the JSON error body: ``/v1/sidecar`` takes WebSocket upgrades only."""
    message = "this is the sidecar's WebSocket endpoint: connect with a WebSocket upgrade"
    body = json.dumps({"error": {"code": _codes.UPGRADE_REQUIRED, "message": message}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"upgrade", b"websocket"),
        (b"connection", b"Upgrade"),
    ]
    await send({"type": "http.response.start", "status": 426, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _utc(ts: float) -> str:
    """``ts`` (Unix seconds) as ``YYYY-MM-DD HH:MM:SS`` UTC (``-`` when not finite)."""
    import datetime

    if not math.isfinite(ts):
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def mount_sidecar(asgi_app: Any, holder: dict[str, Any], config: Any) -> Any:
    """Wrap ``asgi_app`` so ``/v1/sidecar`` WebSockets are served here (module docstring).

    Args:
        asgi_app: the ASGI callable to wrap (Quart's).
        holder: the app's holder: ``state`` (``HubState``) and ``progress`` (the progress
            relay) once serving.
        config: the ``HubConfig``: ``secrets`` and ``token_leeway_s``.

    Returns:
        The wrapping ASGI callable.

    Also bounds what Hypercorn holds per WebSocket in this process (``_ws_limits``:
    permessage-deflate declined, nothing stored after an oversized message), whichever
    way Hypercorn was started (``deskbridge-hub serve`` or ``hypercorn ...asgi:app``),
    and what a connection that never sends a request costs (``_fd_limits``: its
    descriptor is freed at its EOF; failing accepts are logged once a minute), and how
    fast a busy process takes new connections (``_accept``: in bursts).
    """
    install_ws_limits()
    install_fd_limits()
    install_accept()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or scope.get("path") != SIDECAR_PATH:
            if scope["type"] == "http" and scope.get("path") == SIDECAR_PATH:
                # a plain request to the WebSocket endpoint: say what it is (it used to
                # reach the API key check and answer "missing or wrong API key")
                await _upgrade_required(send)
                return
            await asgi_app(scope, receive, send)
            return
        # The ``websocket.connect`` message is left queued (Quart does the same, and its
        # test client never sends one); ``AsgiSocket.receive`` skips it.
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, token = header.decode("latin-1").partition(" ")
        state = holder.get("state")
        if not config.secrets:
            await _refuse(
                send,
                503,
                _codes.NOT_CONFIGURED,
                "hub has no DESKBRIDGE_SECRET; cannot verify tokens",
            )
            return
        if scheme.lower() != "bearer" or not token:
            await _refuse(send, 401, _codes.UNAUTHORIZED, "missing Authorization: Bearer <token>")
            return
        if state is None:
            await _refuse(send, 503, "unavailable", "the hub is not serving yet")
            return
        if state.drain.active:  # graceful restart: send the sidecar to a live replica
            await _refuse(
                send, 503, _codes.DRAINING, "hub is restarting; reconnect to another replica"
            )
            return
        try:
            claims = verify_claims(token.strip(), config.secrets, leeway_s=config.token_leeway_s)
        except TokenRejected as exc:
            quiet = state.token_log.admit(type(exc).__name__, trio.current_time())
            if quiet is not None:  # one line per attempt let one client flood the log
                more = f" ({quiet} more refused tokens since the last line)" if quiet else ""
                log.warning("sidecar handshake refused: %s%s", exc, more)
            if isinstance(exc, TokenNotYetValid):
                # Transient (the minting clock runs ahead): 503 so the sidecar retries.
                wait_s = max(1, math.ceil(exc.valid_in_s))
                await _refuse(send, 503, _codes.TOKEN_NOT_YET_VALID, str(exc), retry_after_s=wait_s)
            elif isinstance(exc, TokenExpired):
                await _refuse(send, 401, _codes.UNAUTHORIZED, str(exc))
            else:
                await _refuse(send, 403, _codes.FORBIDDEN, str(exc))
            return
        user_id = claims.user_id
        # charged only now: forged tokens naming a user must not spend that user's budget
        now_s = trio.current_time()
        wait_s = state.handshake_budget.admit(user_id, now_s)
        if wait_s > 0:
            line = state.handshake_budget.refusal_line(user_id, now_s)
            if line is not None:
                log.warning("%s", line)
            await _refuse(
                send,
                429,
                _codes.TOO_MANY_REQUESTS,
                f"too many handshakes of {user_id} on this hub process; retry after the "
                "Retry-After seconds (is another sidecar of this user, or a crash loop, "
                "reconnecting?)",
                retry_after_s=state.handshake_budget.retry_after_s(wait_s),
            )
            return
        try:  # one read: the user's revocation record (``_revocation``)
            revoked = await refusal(state.substrate, user_id, claims.issued_at)
        except SubstrateUnavailable as exc:
            # as the handshake's own Redis work answers it (docs/protocol.md): 1013, so
            # the sidecar retries within its short window
            log.warning("sidecar handshake of %s refused: %s", user_id, exc)
            state.handshake_budget.refund(user_id)  # the hub's outage, not the user's
            await send({"type": "websocket.accept"})
            await AsgiSocket(receive, send).close(CLOSE_TRY_AGAIN_LATER, UNAVAILABLE_REASON)
            return
        if revoked is not None:
            log.warning(
                "sidecar handshake refused: token of %s revoked (issued before %s)",
                user_id,
                _utc(revoked.before_s),
            )
            await _refuse(
                send,
                401,
                _codes.UNAUTHORIZED,
                f"token revoked: tokens of {user_id} issued before "
                f"{_utc(revoked.before_s)} UTC are refused; issue a new one",
            )
            return
        await send({"type": "websocket.accept"})
        socket = AsgiSocket(receive, send)
        refused = await serve_sidecar(
            state,
            socket,
            user_id,
            expires_at=claims.valid_until,
            issued_at=claims.issued_at,
            on_progress=holder["progress"].offer,
        )
        if refused == CLOSE_TRY_AGAIN_LATER:  # Redis refused the handshake's writes
            state.handshake_budget.refund(user_id)
        await socket.close(1000, "")

    return app


__all__ = ["SIDECAR_PATH", "AsgiSocket", "mount_sidecar"]
