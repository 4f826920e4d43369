"""In-memory transports: two :class:`MemoryTransport` ends joined by memory channels.

They behave like a WebSocket where it matters: messages arrive in order; a bounded
buffer per direction (default 16) so a peer that stops reading eventually blocks the
sender, as TCP and the library queue do; ``close(code, reason)`` delivers the code to the
peer after the messages already sent; ``abort()`` drops the link without a close frame,
which the peer sees as 1006.
"""

from __future__ import annotations

import attrs
import trio
from deskbridge_common import CLOSE_ABNORMAL

from ._errors import TransportClosed

#: Close code seen when the link broke without a close frame (kept for importers).
ABNORMAL_CLOSURE = CLOSE_ABNORMAL


@attrs.define(eq=False)
class _Direction:
    send: trio.MemorySendChannel[str | bytes]
    receive: trio.MemoryReceiveChannel[str | bytes]
    close: tuple[int, str] | None = None  # set by the sending end's close()


@attrs.define(eq=False)
class MemoryTransport:
    """One end of an in-memory socket (see :func:`memory_transport_pair`).

    Attributes:
        closed: ``(code, reason)`` once this end is closed (by either side), else None.
    """

    _outbound: _Direction
    _inbound: _Direction
    closed: tuple[int, str] | None = None

    async def send(self, message: str | bytes) -> None:
        """Send one message; blocks while the peer's buffer is full.

        Raises:
            TransportClosed: this end or the peer is closed.
        """
        if self.closed is not None:
            await trio.lowlevel.checkpoint()
            raise TransportClosed(*self.closed)
        try:
            await self._outbound.send.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._closed_error() from None

    async def receive(self) -> str | bytes:
        """The next message.

        Raises:
            TransportClosed: the peer closed (its code), the link broke (1006), or this
                end was closed.
        """
        if self.closed is not None:
            await trio.lowlevel.checkpoint()
            raise TransportClosed(*self.closed)
        try:
            return await self._inbound.receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self._closed_error() from None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close with ``code``/``reason``; the peer reads what was sent, then the code."""
        await trio.lowlevel.checkpoint()
        if self.closed is None:
            self._outbound.close = (code, reason)
            self._shut((code, reason))

    def abort(self) -> None:
        """Drop the link without a close frame (the peer sees 1006). Idempotent."""
        if self.closed is None:
            self._shut((ABNORMAL_CLOSURE, "connection aborted"))

    def _shut(self, info: tuple[int, str]) -> None:
        self.closed = info
        self._outbound.send.close()
        self._inbound.receive.close()

    def _closed_error(self) -> TransportClosed:
        if self._inbound.close is not None:
            info = self._inbound.close
        elif self.closed is not None:
            info = self.closed
        else:
            info = (ABNORMAL_CLOSURE, "connection lost")
        self.closed = self.closed or info
        self._outbound.send.close()
        self._inbound.receive.close()
        return TransportClosed(*info)


def memory_transport_pair(buffer: int = 16) -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected transports ``(client, server)``.

    Args:
        buffer: messages each direction holds before ``send`` blocks (0 = rendezvous).
    """
    a_send, a_recv = trio.open_memory_channel[str | bytes](buffer)
    b_send, b_recv = trio.open_memory_channel[str | bytes](buffer)
    to_server = _Direction(a_send, a_recv)
    to_client = _Direction(b_send, b_recv)
    return MemoryTransport(to_server, to_client), MemoryTransport(to_client, to_server)


__all__ = ["ABNORMAL_CLOSURE", "MemoryTransport", "memory_transport_pair"]
