"""The WebSocket behind a tiny interface, and the trio-websocket implementation.

A session needs three things from a socket — send a text message, receive one, close
with a code — and the daemon needs one thing from the network — open such a socket to a
URL with headers. :class:`Transport` and :class:`Connector` say exactly that, so tests
plug in memory transports (``deskbridge_sidecar.testing``) and nothing above this module
imports trio-websocket. Its exceptions are mapped here into the sidecar's own
(:class:`TransportClosed`, :class:`ConnectFailed`, :class:`HandshakeRejected`).
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, Protocol

import attrs
import trio
import trio_websocket
from deskbridge_common import CLOSE_ABNORMAL, MAX_FRAME_BYTES

from ._errors import ConnectFailed, HandshakeRejected, TransportClosed
from ._proxy import Proxy, open_tunnel

log = logging.getLogger("deskbridge.sidecar.transport")

#: Path of the sidecar endpoint, appended to a hub URL that has no path.
SIDECAR_PATH = "/v1/sidecar"


class Transport(Protocol):
    """One open WebSocket, as a session sees it. Only the session's writer sends."""

    async def send(self, message: str) -> None:
        """Send one text message.

        Raises:
            TransportClosed: the socket is closed (``code`` 1006 if it broke).
        """

    async def receive(self) -> str | bytes:
        """The next message.

        Raises:
            TransportClosed: the peer closed (with its code and reason) or the socket
                broke (1006) or we closed it.
        """

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` and ``reason`` (at most 123 bytes); idempotent.

        May wait for the peer's close frame; callers bound it with a deadline.
        """


class Connector(Protocol):
    """Opens transports."""

    def connect(
        self, url: str, headers: Sequence[tuple[str, str]]
    ) -> AbstractAsyncContextManager[Transport]:
        """Open a WebSocket to ``url`` sending ``headers`` with the upgrade request.

        The context manager yields an open :class:`Transport` and releases the socket on
        exit.

        Raises:
            HandshakeRejected: the server answered the upgrade with an HTTP error.
            ConnectFailed: DNS, TCP, TLS, timeout or a broken upgrade.
        """


def sidecar_url(hub_url: str) -> str:
    """The WebSocket URL of the sidecar endpoint of ``hub_url``.

    ``ws://host:8080`` becomes ``ws://host:8080/v1/sidecar``; a URL with a path keeps
    it. ``http``/``https`` are accepted as ``ws``/``wss``.

    Raises:
        ValueError: not a ws/wss/http/https URL, no host, a port that is not a number in
            1-65535, an unclosed ``[`` (the message quotes the URL), or a user name or
            password in it (quoted without them).
    """
    try:
        parts = urllib.parse.urlsplit(hub_url.strip())
        credentials = "@" in parts.netloc
        port = None if credentials else parts.port  # ValueError: not a number, not 0-65535
    except ValueError as exc:
        raise ValueError(f"hub URL {hub_url!r}: {exc}") from None
    if credentials:  # said without them: every later message quotes the URL
        bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise ValueError(
            f"hub URL {bare!r} holds a user name or password: take it out (the token "
            "authenticates; it was sent nowhere, and logged with the URL)"
        )
    if port == 0:
        raise ValueError(f"hub URL {hub_url!r}: port 0 cannot be dialled")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme not in ("ws", "wss"):
        raise ValueError(
            f"hub URL must start with ws://, wss://, http:// or https://, got {hub_url!r}"
        )
    if not parts.hostname:
        raise ValueError(f"hub URL has no host: {hub_url!r}")
    path = parts.path if parts.path not in ("", "/") else SIDECAR_PATH
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, parts.query, ""))


@attrs.frozen(kw_only=True)
class WebSocketSettings:
    """trio-websocket settings, spelled out rather than inherited.

    Attributes:
        message_queue_size: messages trio-websocket buffers after reading them off the
            TCP stream and before our reader takes them (library default 1). Past this
            it stops reading the socket — the failure of the seed report, where unread
            frames hid the keepalive. Our reader never waits on work, so the queue only
            absorbs bursts; 64 messages.
        max_message_size: largest incoming message, as ``len()`` of the text (so at
            most ``MAX_FRAME_BYTES`` characters, 1 MiB); bigger closes with 1009. The
            codec then enforces ``MAX_FRAME_BYTES`` in UTF-8 bytes.
        connect_timeout_s: seconds for TCP connect (+ the proxy's ``CONNECT``) + TLS +
            HTTP upgrade (10 s); then :class:`ConnectFailed` and backoff.
        disconnect_timeout_s: seconds to wait for the close handshake before the TCP
            connection is dropped anyway (5 s, ``Timings.close_timeout_s``).
        receive_buffer_size: bytes per read from the TCP stream (64 KiB).

    trio-websocket sends no keepalive pings of its own (it answers the peer's protocol
    pings); liveness is the application-level ``ping``/``pong`` with a deadline, on the
    interval and timeout the hub announces in ``welcome``.
    """

    message_queue_size: int = 64
    max_message_size: int = MAX_FRAME_BYTES
    connect_timeout_s: float = 10.0
    disconnect_timeout_s: float = 5.0
    receive_buffer_size: int = 64 * 1024


@attrs.define(eq=False)
class _WebSocketTransport:
    ws: trio_websocket.WebSocketConnection

    async def send(self, message: str) -> None:
        try:
            await self.ws.send_message(message)
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def receive(self) -> str | bytes:
        try:
            return await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def close(self, code: int, reason: str) -> None:
        await self.ws.aclose(code, reason)


def _closed(exc: trio_websocket.ConnectionClosed) -> TransportClosed:
    """Map trio-websocket's close into ours (no reason object: the link broke, 1006)."""
    reason = exc.reason
    if reason is None:
        return TransportClosed(CLOSE_ABNORMAL, "connection lost")
    return TransportClosed(reason.code, reason.reason or "")


@attrs.define(eq=False)
class WebSocketConnector:
    """:class:`Connector` over trio-websocket.

    The TCP (and TLS) stream is opened here, not by trio-websocket, for two reasons: a
    failed TLS handshake is reported with its cause (trio-websocket 0.12 ends its reader
    silently and the connect only times out), and the stream is always closed, also
    when the upgrade is refused or the server closed first (trio-websocket 0.12 leaks
    the socket in those cases).

    Args:
        ssl_context: verification for ``wss://`` (None: the system trust store). Not
            used for ``ws://``.
        settings: library settings (see :class:`WebSocketSettings`).
        proxy: an HTTP proxy to reach the hub through (``CONNECT``, ``_proxy``), or
            None: direct. TLS (``wss://``) runs inside the tunnel, verified against the
            hub's host name as without a proxy.
    """

    ssl_context: ssl.SSLContext | None = None
    settings: WebSocketSettings = attrs.field(factory=WebSocketSettings)
    proxy: Proxy | None = None

    @asynccontextmanager
    async def connect(
        self, url: str, headers: Sequence[tuple[str, str]]
    ) -> AsyncIterator[Transport]:
        """See :meth:`Connector.connect`.

        Everything up to the completed upgrade is bounded by ``connect_timeout_s``.

        Cancellation: while connecting, aborts and closes the stream; once open, the
        socket is closed (close handshake bounded by ``disconnect_timeout_s``, shielded).
        """
        s = self.settings
        parts = urllib.parse.urlsplit(url)
        secure = parts.scheme == "wss"
        host = parts.hostname or ""
        port = parts.port or (443 if secure else 80)
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = f"[{host}]" if ":" in host else host
        if port != (443 if secure else 80):
            host_header = f"{host_header}:{port}"
        deadline = trio.current_time() + s.connect_timeout_s
        stream = await self._open_stream(host, port, secure, deadline)
        entered = False
        try:
            async with trio.open_nursery() as nursery:
                reader = _ShieldedSpawner(nursery)
                try:
                    try:
                        with trio.fail_at(deadline):
                            ws = await _upgrade(
                                reader,
                                stream,
                                host_header,
                                resource,
                                extra_headers=[
                                    (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers
                                ],
                                message_queue_size=s.message_queue_size,
                                max_message_size=s.max_message_size,
                                receive_buffer_size=s.receive_buffer_size,
                            )
                    except trio.TooSlowError:
                        raise ConnectFailed(
                            f"no WebSocket upgrade from {host}:{port} "
                            f"within {s.connect_timeout_s:g} s"
                        ) from None
                    if ws is None:
                        raise ConnectFailed(
                            f"{host}:{port} closed the connection during the WebSocket upgrade"
                        )
                    entered = True
                    yield _WebSocketTransport(ws)
                finally:
                    if entered:
                        assert ws is not None  # entered means the upgrade gave us one
                        with trio.move_on_after(s.disconnect_timeout_s, shield=True):
                            await ws.aclose()  # a no-op if the session closed it already
                    # Closing the stream and the shield ends the reader on every path,
                    # so this nursery can always exit.
                    await trio.aclose_forcefully(stream)
                    reader.scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) != 1:
                raise
            exc = group.exceptions[0]
            if not entered and isinstance(exc, trio_websocket.ConnectionRejected):
                raise _rejected(exc) from None
            _reraise(exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _open_stream(
        self, host: str, port: int, secure: bool, deadline: float
    ) -> trio.SocketStream | trio.SSLStream[trio.SocketStream]:
        try:
            with trio.fail_at(deadline):
                if self.proxy is not None:
                    tcp = await open_tunnel(self.proxy, host, port)
                else:
                    tcp = await trio.open_tcp_stream(host, port)
                if not secure:
                    return tcp
                context = self.ssl_context or ssl.create_default_context()
                tls = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
                try:
                    await tls.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(tcp)
                    raise
                return tls
        except trio.TooSlowError:
            via = f" through proxy {self.proxy.label}" if self.proxy is not None else ""
            raise ConnectFailed(
                f"cannot connect to {host}:{port}{via} within {self.settings.connect_timeout_s:g} s"
            ) from None
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__ or exc
            hint = ""
            if "WRONG_VERSION_NUMBER" in str(cause):  # a plain HTTP answer to the hello
                hint = (
                    "; the hub does not speak TLS there: use ws:// (or serve it with "
                    "--certfile/--keyfile)"
                )
            raise ConnectFailed(f"TLS handshake with {host}:{port} failed: {cause}{hint}") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from None


async def _upgrade(
    reader: _ShieldedSpawner, stream: trio.abc.Stream, host: str, resource: str, **kwargs: Any
) -> trio_websocket.WebSocketConnection | None:
    """``trio_websocket.wrap_client_stream``, or None as soon as the reader ends first.

    trio-websocket 0.12 waits for the upgrade forever when the server closes the
    connection before answering (its reader records an abnormal close but never wakes
    the opener), so the connect would only fail at ``connect_timeout_s``. A hub process
    that accepted the TCP connection and then exited (a worker finishing its graceful
    restart) must instead be a prompt :class:`ConnectFailed`, retried at once.

    A reader that raises (``ConnectionRejected``) does not count as ended: its error
    reaches the connector's nursery as before.
    """
    result: trio_websocket.WebSocketConnection | None = None
    async with trio.open_nursery() as race:

        async def watch_reader() -> None:
            await reader.ended.wait()
            race.cancel_scope.cancel()

        race.start_soon(watch_reader)
        result = await trio_websocket.wrap_client_stream(
            reader,  # type: ignore[arg-type]  # only start_soon is used
            stream,  # type: ignore[arg-type]
            host,
            resource,
            **kwargs,
        )
        race.cancel_scope.cancel()
    return result


class _ShieldedSpawner:
    """Runs trio-websocket's reader task shielded from the caller's cancellation.

    The reader must keep reading while the session closes the socket under a
    cancelled scope (the daemon stopping): the peer's close frame is what completes
    the close handshake. The connector cancels :attr:`scope` (and closes the stream)
    once the socket is done, so the shield cannot outlive the connection.
    :attr:`ended` is set when the reader returns (the connection is over).
    """

    def __init__(self, nursery: trio.Nursery):
        self._nursery = nursery
        self.scope = trio.CancelScope(shield=True)
        self.ended = trio.Event()

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        self._nursery.start_soon(self._run, fn, *args)

    async def _run(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        with self.scope:
            await fn(*args)
            self.ended.set()


def _reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` (taken out of a one-member group) keeping its own context."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context


def _rejected(exc: trio_websocket.ConnectionRejected) -> HandshakeRejected:
    """Map a refused upgrade, keeping the hub's reason: its JSON body
    ``{"error": {"code", "message"}}`` (or the body's text) and ``Retry-After``."""
    code = message = ""
    body = (exc.body or b"")[:4096].decode("utf-8", "replace")
    try:
        error = json.loads(body).get("error") or {}
        code, message = str(error.get("code", "")), str(error.get("message", ""))
    except (ValueError, AttributeError):
        message = " ".join(body.split())[:300]
    retry_after_s = None
    for name, value in exc.headers or ():
        if name.lower() == b"retry-after":
            try:
                retry_after_s = max(0.0, float(value.decode("latin-1").strip()))
            except ValueError:
                pass
    return HandshakeRejected(exc.status_code, code, message[:300], retry_after_s)


__all__ = [
    "SIDECAR_PATH",
    "Connector",
    "Transport",
    "WebSocketConnector",
    "WebSocketSettings",
    "sidecar_url",
]
