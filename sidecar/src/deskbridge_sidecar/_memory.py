"""In-memory transports for the sidecar: ``deskbridge_common.testing``'s memory socket
(the one both packages use) with the sidecar's :class:`TransportClosed` on close.

They behave like a WebSocket where it matters: messages arrive in order; a bounded
buffer per direction (default 16) so a peer that stops reading eventually blocks the
sender, as TCP and the library queue do; ``close(code, reason)`` delivers the code to the
peer after the messages already sent; ``abort()`` drops the link without a close frame,
which the peer sees as 1006.
"""

from __future__ import annotations

from deskbridge_common import CLOSE_ABNORMAL
from deskbridge_common.testing import MemorySocket, memory_socket_pair

from ._errors import TransportClosed

#: Close code seen when the link broke without a close frame (kept for importers).
ABNORMAL_CLOSURE = CLOSE_ABNORMAL

#: One end of an in-memory socket raising :class:`TransportClosed` once closed.
MemoryTransport = MemorySocket


def memory_transport_pair(buffer: int = 16) -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected transports ``(client, server)``, each raising
    :class:`TransportClosed` (with the close code) once closed.

    Args:
        buffer: messages each direction holds before ``send`` blocks (0 = rendezvous).
    """
    return memory_socket_pair(buffer, client_error=TransportClosed, server_error=TransportClosed)


__all__ = ["ABNORMAL_CLOSURE", "MemoryTransport", "memory_transport_pair"]
