"""Fakes and checks for tests (shipped, like ``trio.testing``): an in-memory sidecar
socket pair, and the substrate contract suite :func:`check_substrate`.

``socket_pair()`` returns ``(hub_side, peer)``: ``hub_side`` implements
``SidecarSocket`` for :func:`deskbridge_hub._session.serve_sidecar`; ``peer`` is what a
test drives as the sidecar, speaking frames.
"""

from __future__ import annotations

import attrs
import trio
from deskbridge_common import Frame, decode_frame, encode_frame

from . import _contract_caller as _contract_caller  # registers the caller-path checks
from . import _contract_streams as _contract_streams  # registers the stream checks
from ._contract import CHECKS, SubstrateHarness, check_substrate
from ._errors import SocketClosed


@attrs.define(eq=False)
class _Pipe:
    send: trio.MemorySendChannel[str | bytes]
    recv: trio.MemoryReceiveChannel[str | bytes]
    closed: trio.Event = attrs.field(factory=trio.Event)
    close_code: int | None = None
    close_reason: str | None = None


@attrs.define(eq=False)
class MemoryHubSocket:
    """Hub end of an in-memory socket."""

    _outbox: trio.MemorySendChannel[str | bytes]
    _inbox: trio.MemoryReceiveChannel[str | bytes]
    _state: _Pipe

    async def receive(self) -> str | bytes:
        try:
            return await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise SocketClosed("peer closed") from None

    async def send(self, data: str) -> None:
        if self._state.closed.is_set():
            raise SocketClosed("closed")
        try:
            await self._outbox.send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise SocketClosed("peer gone") from None

    async def close(self, code: int, reason: str) -> None:
        if not self._state.closed.is_set():
            self._state.close_code = code
            self._state.close_reason = reason
            self._state.closed.set()
            await self._outbox.aclose()


@attrs.define(eq=False)
class MemoryPeer:
    """The sidecar's end: send and receive frames, see how the hub closed."""

    _outbox: trio.MemorySendChannel[str | bytes]
    _inbox: trio.MemoryReceiveChannel[str | bytes]
    _state: _Pipe

    async def send(self, frame: Frame) -> None:
        await self._outbox.send(encode_frame(frame))

    async def send_raw(self, data: str | bytes) -> None:
        await self._outbox.send(data)

    async def receive(self) -> Frame:
        """Next frame from the hub. Raises trio.EndOfChannel once the hub closed."""
        return decode_frame(await self._inbox.receive())

    async def disconnect(self) -> None:
        """Drop the socket as a vanished sidecar would."""
        await self._outbox.aclose()

    @property
    def closed(self) -> trio.Event:
        return self._state.closed

    @property
    def close_code(self) -> int | None:
        return self._state.close_code

    @property
    def close_reason(self) -> str | None:
        return self._state.close_reason


def socket_pair(buffer: int = 1000) -> tuple[MemoryHubSocket, MemoryPeer]:
    to_peer_send, to_peer_recv = trio.open_memory_channel[str | bytes](buffer)
    to_hub_send, to_hub_recv = trio.open_memory_channel[str | bytes](buffer)
    state = _Pipe(to_peer_send, to_hub_recv)
    return (
        MemoryHubSocket(to_peer_send, to_hub_recv, state),
        MemoryPeer(to_hub_send, to_peer_recv, state),
    )


__all__ = [
    "CHECKS",
    "MemoryHubSocket",
    "MemoryPeer",
    "SubstrateHarness",
    "check_substrate",
    "socket_pair",
]
