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
from deskbridge_common.testing import MemorySocket, memory_socket_pair

from . import _contract_caller as _contract_caller  # registers the caller-path checks
from . import _contract_cancel as _contract_cancel  # registers the cancel read/write-back checks
from . import _contract_desktop as _contract_desktop  # registers the desktop checks
from . import _contract_finish as _contract_finish  # registers the finishing-step checks
from . import _contract_jobs as _contract_jobs  # registers the result and progress checks
from . import _contract_keep as _contract_keep  # registers the kept-alive record checks
from . import _contract_mcp as _contract_mcp  # registers the MCP session checks
from . import _contract_revoke as _contract_revoke  # registers the token revocation checks
from . import _contract_room as _contract_room  # registers the queue-bound checks
from . import _contract_streams as _contract_streams  # registers the stream checks
from ._contract import CHECKS, SubstrateHarness, check_substrate
from ._errors import SocketClosed


def _socket_closed(code: int, reason: str) -> SocketClosed:
    return SocketClosed(f"socket closed ({code}{': ' + reason if reason else ''})")


#: Hub end of an in-memory socket (``deskbridge_common.testing.MemorySocket`` raising
#: the hub's ``SocketClosed``): implements ``SidecarSocket``.
MemoryHubSocket = MemorySocket


@attrs.define(eq=False)
class MemoryPeer:
    """The sidecar's end, speaking frames: send and receive them, see how the hub closed."""

    _socket: MemorySocket

    async def send(self, frame: Frame) -> None:
        """Send one frame.

        Raises:
            trio.ClosedResourceError: this end disconnected.
            trio.BrokenResourceError: the hub closed the socket.
        """
        await self.send_raw(encode_frame(frame))

    async def send_raw(self, data: str | bytes) -> None:
        """Send one message as is (raises as :meth:`send`)."""
        try:
            await self._socket.send(data)
        except SocketClosed:
            if self._socket.peer_close is None:
                raise trio.ClosedResourceError("this end disconnected") from None
            raise trio.BrokenResourceError("the hub closed the socket") from None

    async def receive(self) -> Frame:
        """Next frame from the hub. Raises trio.EndOfChannel once the hub closed."""
        try:
            return decode_frame(await self._socket.receive())
        except SocketClosed:
            raise trio.EndOfChannel from None

    async def disconnect(self) -> None:
        """Drop the socket as a vanished sidecar would (no close frame)."""
        await trio.lowlevel.checkpoint()
        self._socket.abort()

    @property
    def _inbox(self) -> trio.MemoryReceiveChannel[str | bytes]:
        return self._socket.inbox

    @property
    def closed(self) -> trio.Event:
        """Set once the hub closed the socket."""
        return self._socket.peer_closed

    @property
    def close_code(self) -> int | None:
        close = self._socket.peer_close
        return None if close is None else close[0]

    @property
    def close_reason(self) -> str | None:
        close = self._socket.peer_close
        return None if close is None else close[1]


def socket_pair(buffer: int = 1000) -> tuple[MemoryHubSocket, MemoryPeer]:
    """An in-memory sidecar socket: ``(hub_side, peer)``.

    Args:
        buffer: messages each direction holds before ``send`` blocks.
    """
    peer, hub_side = memory_socket_pair(
        buffer, client_error=_socket_closed, server_error=_socket_closed
    )
    return hub_side, MemoryPeer(peer)


__all__ = [
    "CHECKS",
    "MemoryHubSocket",
    "MemoryPeer",
    "SubstrateHarness",
    "check_substrate",
    "socket_pair",
]
