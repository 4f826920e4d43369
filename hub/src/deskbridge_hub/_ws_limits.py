"""Bounds on what one WebSocket peer can make the hub process hold, below the session.

Hypercorn (0.18, with wsproto 1.3) assembles each incoming message before the app sees it,
and two things there were unbounded for a hostile peer holding a valid token (measured
against a real ``deskbridge-hub serve``, docs/security.md "A malicious sidecar"):

- **permessage-deflate.** Hypercorn accepts the extension whenever the client offers it,
  and wsproto inflates each received chunk with no output limit: a 200 KB frame inflating
  to 200 MB raised one hub worker from 75 MB to 400 MB resident (295 MB after), and
  stalled other users' calls 1.6 s, before the 2 MiB message cap could apply (it counts
  inflated text). The sidecar (trio-websocket) never offers the extension, so the hub now
  declines it: a compressed frame is a protocol error (close **1002**), and no socket
  carries a zlib context (~300 KB each, per direction) either.
- **Bytes after an oversized message.** Hypercorn's ``WebsocketBuffer`` appends a chunk
  *before* comparing the total with ``websocket_max_message_size``, and after the first
  overflow (close **1009**) it keeps the buffer: every later chunk the peer sends (a
  continuation that never ends, or new messages) was appended too, for as long as the peer
  kept the TCP connection open: 100 MB sent after the 1009 raised the worker to 231 MB.
  :class:`BoundedWebsocketBuffer` checks before it stores and, once over, stores nothing
  more; the socket is then silent to the session, whose liveness timer ends it (4002,
  ``ping_interval_s + ping_timeout_s``) if the peer never answers the close. Hypercorn's
  1009 carries no reason, so the peer could not tell which limit it crossed:
  :class:`ClosingConnection` gives it one, :data:`MESSAGE_TOO_BIG_REASON`.

- **Frames wsproto refuses** (invalid UTF-8, reserved bits, an unknown opcode, an
  unmasked frame, a control frame over 125 bytes): wsproto reports its own parse failure
  as a ``CloseConnection`` event with the right code and reason, but leaves the connection
  ``OPEN``, and Hypercorn answers a close only in ``REMOTE_CLOSING``: it dropped the TCP
  connection with no close frame, so the peer learnt neither code nor reason.
  :class:`ClosingConnection` marks that event as a close to answer, so Hypercorn sends the
  close frame (**1002** protocol error, **1007** invalid UTF-8, with wsproto's reason)
  before it ends the connection.

Neither library has a setting for this, so :func:`install` replaces the two names in
Hypercorn's ``ws_stream`` module (and the connection class, the third), where ``WSStream``
looks them up for every new socket. The replacements keep the names' interfaces.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from deskbridge_common import CLOSE_MESSAGE_TOO_BIG, MAX_FRAME_BYTES
from hypercorn.protocol import ws_stream
from wsproto.connection import Connection, ConnectionState
from wsproto.events import CloseConnection, Event
from wsproto.extensions import PerMessageDeflate

#: The transport's cap on one assembled message: 2 MiB (characters of a text message,
#: bytes of a binary one). The protocol's own cap (``MAX_FRAME_BYTES``, 1 MiB of UTF-8)
#: is checked by the codec on what gets through; this one bounds what Hypercorn holds.
MAX_MESSAGE_SIZE = 2 * 1024 * 1024
#: The reason of the transport's 1009 (Hypercorn sends none): the limit, and the
#: protocol's own, lower one that the codec names in its 1009s.
MESSAGE_TOO_BIG_REASON = (
    f"message over {MAX_MESSAGE_SIZE >> 20} MiB ({MAX_MESSAGE_SIZE} characters), the hub's "
    f"WebSocket message limit; a frame may be at most {MAX_FRAME_BYTES >> 20} MiB"
)


class DeclinedPerMessageDeflate(PerMessageDeflate):
    """permessage-deflate (RFC 7692) as an extension the server never agrees to."""

    def accept(self, offer: str) -> None:
        """Decline every offer: the handshake answer names no extension."""
        return None


class BoundedWebsocketBuffer(ws_stream.WebsocketBuffer):
    """Hypercorn's message buffer, holding at most ``min(max_length, MAX_MESSAGE_SIZE)``.

    Args:
        max_length: Hypercorn's ``websocket_max_message_size`` (characters or bytes).
    """

    def __init__(self, max_length: int) -> None:
        super().__init__(min(max_length, MAX_MESSAGE_SIZE))
        self.overflowed = False

    def extend(self, event: Any) -> None:
        """Append one wsproto ``Message`` event's data.

        Raises:
            hypercorn.protocol.ws_stream.FrameTooLargeError: the message would exceed the
                cap, or an earlier one did (nothing is stored from then on: the
                connection is closing with 1009).
        """
        if self.overflowed or self.length + len(event.data) > self.max_length:
            self.overflowed = True
            self.value = None
            raise ws_stream.FrameTooLargeError()
        super().extend(event)


class ClosingConnection(Connection):
    """wsproto's connection, whose own parse failures are closes Hypercorn answers, and
    whose reasonless 1009 (Hypercorn's, for a message over the buffer's cap) names the
    limit."""

    def send(self, event: Event) -> bytes:
        """wsproto's ``send``; a ``CloseConnection`` with code 1009 and no reason gets
        :data:`MESSAGE_TOO_BIG_REASON` (only Hypercorn closes so: the session's 1009s
        carry the codec's reason). Raises what wsproto raises."""
        if (
            isinstance(event, CloseConnection)
            and event.code == CLOSE_MESSAGE_TOO_BIG
            and not event.reason
        ):
            event = CloseConnection(code=event.code, reason=MESSAGE_TOO_BIG_REASON)
        return super().send(event)

    def events(self) -> Generator[Event, None, None]:
        """wsproto's events; a ``CloseConnection`` that no close frame produced (the
        state is still ``OPEN``: wsproto refused a frame) moves the state to
        ``REMOTE_CLOSING``, so that the caller's answer (``event.response()``, the same
        code and reason) is sent as the close frame."""
        for event in super().events():
            if isinstance(event, CloseConnection) and self.state is ConnectionState.OPEN:
                self._state = ConnectionState.REMOTE_CLOSING
            yield event


def install() -> None:
    """Make every WebSocket Hypercorn accepts from now on in this process use the bounded
    buffer, decline permessage-deflate and answer a refused frame with a close frame.
    Idempotent."""
    ws_stream.Connection = ClosingConnection  # type: ignore[attr-defined]
    ws_stream.WebsocketBuffer = BoundedWebsocketBuffer  # type: ignore[misc]
    ws_stream.PerMessageDeflate = DeclinedPerMessageDeflate  # type: ignore[attr-defined]


__all__ = [
    "MAX_MESSAGE_SIZE",
    "MESSAGE_TOO_BIG_REASON",
    "BoundedWebsocketBuffer",
    "ClosingConnection",
    "DeclinedPerMessageDeflate",
    "install",
]
