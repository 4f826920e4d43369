"""Fakes shipped for tests (as ``trio.testing`` ships its memory streams): the one
in-memory WebSocket both packages' fakes and the in-process hub/sidecar pair use.

Unlike the protocol modules of this package, this module needs trio (both the hub and the
sidecar already depend on it); nothing else in ``deskbridge_common`` imports it.

Each end raises the exception its own package maps a closed socket to (the hub's
``SocketClosed``, the sidecar's ``TransportClosed``): pass a factory per end.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from ._codes import CLOSE_ABNORMAL, CLOSE_NORMAL

#: A throttled send (``MemorySocket.send_bytes_s``) moves this many bytes at a time.
SEND_CHUNK_BYTES = 16 * 1024
#: How often a stalled send (``send_bytes_s`` 0) looks again, seconds.
STALL_POLL_S = 0.25

#: Builds the exception an end raises once it is closed, from ``(code, reason)``.
ClosedError = Callable[[int, str], Exception]


class MemorySocketClosed(Exception):
    """The default closed-socket error of :func:`memory_socket_pair`.

    Attributes:
        code: the close code (1006 when the link broke without a close frame).
        reason: the close reason.
    """

    def __init__(self, code: int, reason: str = ""):
        self.code = code
        self.reason = reason
        super().__init__(f"connection closed ({code}{': ' + reason if reason else ''})")


@attrs.define(eq=False)
class _Direction:
    send: trio.MemorySendChannel[str | bytes]
    receive: trio.MemoryReceiveChannel[str | bytes]
    close: tuple[int, str] | None = None  # set by the sending end's close() or abort()
    ended: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class MemorySocket:
    """One end of an in-memory WebSocket (see :func:`memory_socket_pair`).

    Attributes:
        closed: ``(code, reason)`` once this end is closed (by either side), else None.
        send_bytes_s: this end's uplink, bytes a second (None: instant). A message of
            ``n`` characters takes ``n / send_bytes_s`` seconds to send, in chunks of
            ``SEND_CHUNK_BYTES``; set it to 0 mid-send to model a peer that stopped
            reading (the send then waits until it is raised again or the socket closes).
    """

    _outbound: _Direction
    _inbound: _Direction
    _closed_error: ClosedError = MemorySocketClosed
    closed: tuple[int, str] | None = None
    send_bytes_s: float | None = None

    @property
    def peer_closed(self) -> trio.Event:
        """Set once the other end closed (with a close frame) or dropped the link."""
        return self._inbound.ended

    @property
    def peer_close(self) -> tuple[int, str] | None:
        """The other end's ``(code, reason)`` once it closed or dropped the link."""
        return self._inbound.close

    @property
    def inbox(self) -> trio.MemoryReceiveChannel[str | bytes]:
        """The raw inbound channel (for a test that drains messages itself)."""
        return self._inbound.receive

    async def send(self, message: str | bytes) -> None:
        """Send one message; blocks while the peer's buffer is full.

        Raises:
            Exception: this end's closed error, once this end or the peer is closed.
        """
        if self.closed is not None:
            await trio.lowlevel.checkpoint()
            raise self._closed_error(*self.closed)
        if self.send_bytes_s is not None:
            await self._throttle(len(message))
        try:
            await self._outbound.send.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._error() from None

    async def _throttle(self, size: int) -> None:
        """Spend the time ``size`` bytes take on this end's uplink (``send_bytes_s``).

        Raises:
            Exception: this end's closed error, if it closes meanwhile.
        """
        left = size
        while left > 0:
            rate = self.send_bytes_s
            if rate is None:
                return
            if self.closed is not None or self._inbound.ended.is_set():
                raise self._error()
            if rate <= 0:  # the peer stopped reading: nothing moves
                await trio.sleep(STALL_POLL_S)
                continue
            chunk = min(left, SEND_CHUNK_BYTES)
            await trio.sleep(chunk / rate)
            left -= chunk

    async def receive(self) -> str | bytes:
        """The next message.

        Raises:
            Exception: this end's closed error: the peer closed (its code), the link broke
                (1006), or this end was closed.
        """
        if self.closed is not None:
            await trio.lowlevel.checkpoint()
            raise self._closed_error(*self.closed)
        try:
            return await self._inbound.receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self._error() from None

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Close with ``code``/``reason``; the peer reads what was sent, then the code."""
        await trio.lowlevel.checkpoint()
        if self.closed is None:
            self._outbound.close = (code, reason)
            self._shut((code, reason))

    def abort(self) -> None:
        """Drop the link without a close frame (the peer sees 1006). Idempotent."""
        if self.closed is None:
            self._outbound.close = (CLOSE_ABNORMAL, "connection aborted")
            self._shut((CLOSE_ABNORMAL, "connection aborted"))

    def _shut(self, info: tuple[int, str]) -> None:
        self.closed = info
        self._outbound.send.close()
        self._inbound.receive.close()
        self._outbound.ended.set()

    def _error(self) -> Exception:
        if self._inbound.close is not None:
            info = self._inbound.close
        elif self.closed is not None:
            info = self.closed
        else:
            info = (CLOSE_ABNORMAL, "connection lost")
        self.closed = self.closed or info
        self._outbound.send.close()
        self._inbound.receive.close()
        return self._closed_error(*info)


def memory_socket_pair(
    buffer: int = 16,
    *,
    client_error: ClosedError = MemorySocketClosed,
    server_error: ClosedError = MemorySocketClosed,
) -> tuple[MemorySocket, MemorySocket]:
    """Two connected in-memory sockets ``(client, server)``.

    Args:
        buffer: messages each direction holds before ``send`` blocks (0 = rendezvous).
        client_error: builds the exception the client end raises once closed.
        server_error: the same for the server end.
    """
    a_send, a_recv = trio.open_memory_channel[str | bytes](buffer)
    b_send, b_recv = trio.open_memory_channel[str | bytes](buffer)
    to_server = _Direction(a_send, a_recv)
    to_client = _Direction(b_send, b_recv)
    return (
        MemorySocket(to_server, to_client, client_error),
        MemorySocket(to_client, to_server, server_error),
    )


__all__ = [
    "SEND_CHUNK_BYTES",
    "STALL_POLL_S",
    "ClosedError",
    "MemorySocket",
    "MemorySocketClosed",
    "memory_socket_pair",
]
