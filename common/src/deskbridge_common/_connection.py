"""The protocol's rules as one sans-I/O state machine (after h11's and wsproto's).

A :class:`Connection` is one end of one socket, hub or sidecar. The I/O layer feeds it
every text message it receives (:meth:`Connection.receive` -> events) and asks it for the
text of every frame it sends (:meth:`Connection.send` -> text). The connection owns:

* the handshake: the sidecar says ``hello`` first, the hub answers ``welcome``
  (:class:`ConnectionState`: ``AWAIT_HELLO`` -> ``AWAIT_WELCOME`` -> ``OPEN``; then
  ``CLOSING`` once a close is decided, ``CLOSED`` once the socket is gone);
* which frame types each role may send in each state (:data:`SENDABLE`, one table; the
  receiving end checks the peer against the same table);
* outstanding delivery ids (a ``job`` sent and not yet answered by ``job_result``):
  ``job_result``, ``progress`` and ``cancel`` must name one;
* outstanding ping nonces and their deadlines, and the handshake's deadline; a ping's
  deadline counts from when the caller's writer *wrote* it (:meth:`Connection.writing`,
  :meth:`Connection.wrote`), not from when it was queued: the time spent writing our own
  frames ahead of it over a slow link is not the peer's silence;
* the close code for every violation: a bad frame from the peer raises
  :class:`RemoteProtocolError` (close the socket with its ``close_code``), a frame this
  side must not send raises :class:`LocalProtocolError` (a bug here).

No I/O and no clock: where a deadline is involved the caller passes its own time
(``now_s``, any monotonic clock in seconds, the same one every call). Tests drive a
hub/sidecar pair of connections by hand with no event loop.
"""

from __future__ import annotations

import enum

import attrs

from ._codec import decode_frame, encode_frame
from ._codes import (
    CLOSE_PING_TIMEOUT,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    close_reason,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._frames import (
    PROTOCOL_VERSION,
    Cancel,
    Frame,
    Hello,
    Job,
    JobResult,
    Ping,
    Pong,
    Progress,
    Welcome,
)

#: The slowest link on which one frame's write still counts as the peer reading (bytes a
#: second): a ping queued behind a write in progress waits for that write up to
#: ``ping_timeout_s + len(frame) / MIN_WRITE_BYTES_S`` (a 1 MiB frame: 10 s + 128 s)
#: before the peer counts as having stopped reading. Frames are ASCII (the codec escapes
#: the rest), so a frame's length in characters is its size in bytes.
MIN_WRITE_BYTES_S = 8 * 1024


class Role(enum.Enum):
    """Which end of the socket a :class:`Connection` is."""

    HUB = "hub"
    SIDECAR = "sidecar"

    @property
    def peer(self) -> Role:
        """The other end."""
        return Role.SIDECAR if self is Role.HUB else Role.HUB


class ConnectionState(enum.Enum):
    """Where a connection is in its life (both ends go through the same states)."""

    AWAIT_HELLO = "await_hello"  #: nothing said yet; the sidecar must open with hello
    AWAIT_WELCOME = "await_welcome"  #: hello said; the hub must answer welcome
    OPEN = "open"  #: jobs, results, progress, cancels and pings flow
    CLOSING = "closing"  #: a close is decided (here, or for the peer's violation)
    CLOSED = "closed"  #: the socket is gone


_S = ConnectionState
#: Longer than any ping's text (a nonce is at most 200 characters): longer texts are not
#: looked up among the queued pings.
_PING_TEXT_MAX = 256
_HUB, _SIDECAR = Role.HUB, Role.SIDECAR

#: Frame types each role may send in each state. The receiving end holds the peer to the
#: same table. ``error`` may always be sent until the socket is gone (it says why a close
#: is coming). Pings may start as soon as the hub has the hello.
SENDABLE: dict[tuple[Role, ConnectionState], frozenset[str]] = {
    (_SIDECAR, _S.AWAIT_HELLO): frozenset({"hello"}),
    (_SIDECAR, _S.AWAIT_WELCOME): frozenset({"pong", "error"}),
    (_SIDECAR, _S.OPEN): frozenset({"job_result", "progress", "sleeping", "ping", "pong", "error"}),
    (_SIDECAR, _S.CLOSING): frozenset({"error"}),
    (_HUB, _S.AWAIT_HELLO): frozenset({"error"}),
    (_HUB, _S.AWAIT_WELCOME): frozenset({"welcome", "ping", "error"}),
    (_HUB, _S.OPEN): frozenset({"job", "cancel", "ping", "pong", "error"}),
    (_HUB, _S.CLOSING): frozenset({"error"}),
}

#: Frames that move the handshake on (sent or received, the same for both ends).
TRANSITIONS: dict[tuple[str, ConnectionState], ConnectionState] = {
    ("hello", _S.AWAIT_HELLO): _S.AWAIT_WELCOME,
    ("welcome", _S.AWAIT_WELCOME): _S.OPEN,
}

#: The frame a role waits for from its peer in a handshake state (for the error message).
_EXPECTED: dict[tuple[Role, ConnectionState], str] = {
    (_HUB, _S.AWAIT_HELLO): "hello",
    (_SIDECAR, _S.AWAIT_WELCOME): "welcome",
}


@attrs.frozen
class Ignored:
    """A frame that broke no rule but has nothing left to act on; worth a log line.

    Returned by :meth:`Connection.receive` for a ``job_result`` whose delivery id is not
    outstanding (answered already, or never sent on this socket), a ``cancel`` for a
    delivery already answered (the answer and the cancel crossed), and a ``pong`` for no
    outstanding ping.

    Attributes:
        frame: the frame.
        reason: why it was ignored.
    """

    frame: Frame
    reason: str


Event = Frame | Ignored


@attrs.define(eq=False)
class Connection:
    """One end of one deskbridge socket, as a state machine with no I/O.

    Args:
        role: which end this is.
        now_s: the caller's clock now, seconds; starts the handshake deadline.
        handshake_timeout_s: how long the handshake may take (the hub waits for hello,
            the sidecar for welcome), seconds; None for no deadline.
        ping_timeout_s: how long a ping may go unanswered, seconds, until a welcome says
            otherwise (the welcome's ``ping_timeout_s`` then applies to both ends).
        min_write_bytes_s: the slowest write (bytes a second) that still counts as the
            peer reading, for a ping queued behind it (:data:`MIN_WRITE_BYTES_S`).

    Attributes:
        role: which end this is.
        state: the :class:`ConnectionState`.
        hello: the hello sent or received, once there is one.
        welcome: the welcome sent or received, once there is one.
        close_code: the code the socket should close (or was closed) with, once decided:
            the first of a violation's code, :meth:`close`, :meth:`closed`.
        close_reason: the matching reason (at most 123 bytes of UTF-8).
    """

    role: Role
    now_s: float = 0.0
    handshake_timeout_s: float | None = None
    ping_timeout_s: float | None = None
    min_write_bytes_s: float = MIN_WRITE_BYTES_S
    state: ConnectionState = attrs.field(default=_S.AWAIT_HELLO, init=False)
    hello: Hello | None = attrs.field(default=None, init=False)
    welcome: Welcome | None = attrs.field(default=None, init=False)
    close_code: int | None = attrs.field(default=None, init=False)
    close_reason: str | None = attrs.field(default=None, init=False)
    _handshake_deadline_s: float | None = attrs.field(default=None, init=False)
    _outstanding: set[str] = attrs.field(factory=set, init=False)
    _pings: dict[str, float | None] = attrs.field(factory=dict, init=False)
    #: our pings sent and not yet written (their text -> nonce), in the order sent
    _queued: dict[str, str] = attrs.field(factory=dict, init=False)
    #: the write in progress: when it started (caller's clock) and its size in bytes
    _write_start_s: float | None = attrs.field(default=None, init=False)
    _write_bytes: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.handshake_timeout_s is not None:
            self._handshake_deadline_s = self.now_s + self.handshake_timeout_s

    # -- introspection -------------------------------------------------------------------

    @property
    def outstanding(self) -> frozenset[str]:
        """Delivery ids sent (hub) or received (sidecar) in a ``job`` and not yet answered."""
        return frozenset(self._outstanding)

    @property
    def pending_pings(self) -> dict[str, float | None]:
        """Nonces of our pings not yet answered, each with its deadline (caller's clock)."""
        return dict(self._pings)

    @property
    def queued_pings(self) -> frozenset[str]:
        """Nonces of our pings sent (:meth:`send`) and not yet written (:meth:`wrote`)."""
        return frozenset(self._queued.values())

    @property
    def write_deadline_s(self) -> float | None:
        """While a write is in progress (:meth:`writing`) and a ping waits behind it: when
        that write counts as stalled, ``ping_timeout_s + size / min_write_bytes_s`` after
        it started (caller's clock, seconds); else None."""
        start_s = self._write_start_s
        if start_s is None or not self._queued or self.ping_timeout_s is None:
            return None
        return start_s + self.ping_timeout_s + self._write_bytes / self.min_write_bytes_s

    def _ping_deadlines(self) -> list[tuple[float, bool]]:
        """Each ping's deadline as judged now, with True where it is the write's bound (a
        queued ping waits for the write in progress ahead of it: never before it ends,
        unless the write itself stalls)."""
        write_s = self.write_deadline_s
        queued = self._queued.values() if write_s is not None else ()
        deadlines = []
        for nonce, deadline_s in self._pings.items():
            if deadline_s is None:
                continue
            if write_s is not None and write_s > deadline_s and nonce in queued:
                deadlines.append((write_s, True))
            else:
                deadlines.append((deadline_s, False))
        return deadlines

    @property
    def deadline_s(self) -> float | None:
        """The earliest time :meth:`check_deadlines` would raise at, or None if nothing is
        waiting on a deadline (caller's clock, seconds). It moves: later while a write
        that a ping waits behind is in progress, and from the end of each write
        (:meth:`wrote`) for the pings still queued."""
        deadlines = [d for d, _ in self._ping_deadlines()] if self._pings else []
        if (
            self.state in (_S.AWAIT_HELLO, _S.AWAIT_WELCOME)
            and self._handshake_deadline_s is not None
        ):
            deadlines.append(self._handshake_deadline_s)
        return min(deadlines, default=None)

    def may_send(self, frame_type: str) -> bool:
        """True if this end may send a ``frame_type`` frame in its current state."""
        return frame_type in SENDABLE.get((self.role, self.state), frozenset())

    # -- receiving -----------------------------------------------------------------------

    def receive(self, data: str | bytes) -> list[Event]:
        """Take in one WebSocket message from the peer.

        Args:
            data: the message; text (a ``bytes`` message is a binary frame: refused).

        Returns:
            The events it makes: the frame itself, or an :class:`Ignored`; nothing once
            a close is decided (``CLOSING``: frames still in flight are dropped). A
            ``ping`` is returned for the caller to answer with ``pong``.

        Raises:
            RemoteProtocolError: the message breaks the protocol; the connection is now
                ``CLOSING`` and ``close_code`` (also the error's) says how to close:
                1003 binary, 1007 not JSON or a wrong-typed field, 1008 a frame the peer
                may not send now (wrong direction, before the handshake, an unsupported
                protocol version, a repeated delivery id, progress for no outstanding
                delivery), 1009 too big.
            LocalProtocolError: called after :meth:`closed` (a bug in the caller).
        """
        if self.state is _S.CLOSED:
            raise LocalProtocolError("$", "receive() on a closed connection")
        if self.state is _S.CLOSING:
            return []
        try:
            if isinstance(data, bytes):
                raise RemoteProtocolError(
                    "$", "binary frames are not part of the protocol", CLOSE_UNSUPPORTED_DATA
                )
            frame = decode_frame(data)
            return [self._receive_frame(frame)]
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise

    def _receive_frame(self, frame: Frame) -> Event:
        peer = self.role.peer
        if frame.type not in SENDABLE[(peer, self.state)]:
            expected = _EXPECTED.get((self.role, self.state))
            message = (
                f"expected {expected}, got {frame.type}"
                if expected
                else f"unexpected {frame.type} frame from {peer.value}"
            )
            raise RemoteProtocolError("type", message, CLOSE_POLICY_VIOLATION)
        if isinstance(frame, Hello) and frame.protocol_version != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                "protocol_version",
                f"unsupported protocol_version {frame.protocol_version}; "
                f"hub speaks {PROTOCOL_VERSION}",
                CLOSE_POLICY_VIOLATION,
            )
        if isinstance(frame, Job):
            if frame.id in self._outstanding:
                raise RemoteProtocolError(
                    "id", "delivery id is already outstanding", CLOSE_POLICY_VIOLATION
                )
            self._outstanding.add(frame.id)
        elif isinstance(frame, Progress):
            if frame.id not in self._outstanding:
                raise RemoteProtocolError(
                    "id", "progress for a delivery that is not outstanding", CLOSE_POLICY_VIOLATION
                )
        elif isinstance(frame, JobResult):
            if frame.id not in self._outstanding:
                return Ignored(frame, "job_result for a delivery id not outstanding on this socket")
            self._outstanding.discard(frame.id)
        elif isinstance(frame, Cancel):
            if frame.id not in self._outstanding:
                return Ignored(frame, "cancel for a delivery not outstanding (answered already?)")
        elif isinstance(frame, Pong):
            if frame.nonce not in self._pings:
                return Ignored(frame, "pong for no outstanding ping")
            del self._pings[frame.nonce]
            if self._queued:  # answered before we saw it written: it is no longer queued
                self._queued = {t: n for t, n in self._queued.items() if n != frame.nonce}
        self._advance(frame)
        return frame

    # -- sending -------------------------------------------------------------------------

    def send(self, frame: Frame, *, now_s: float | None = None) -> str:
        """Check ``frame`` against the rules, serialise it once, and account for it.

        Args:
            frame: the frame to send.
            now_s: the caller's clock now, seconds; required for a ``ping`` while a ping
                timeout is known (it starts the ping's deadline), ignored otherwise.

        Returns:
            The text to send (the caller must send it, in the order of the calls). A
            ping's text is *queued* until the caller reports it written (:meth:`wrote`)
            or not queued after all (:meth:`dropped`); its deadline counts from its
            write.

        Raises:
            LocalProtocolError: this end may not send ``frame`` now (its direction or
                state, a delivery id or nonce it does not own or already uses, a wrong
                protocol version), or it cannot be encoded (see ``encode_frame``). The
                connection is unchanged.
        """
        if not self.may_send(frame.type):
            raise LocalProtocolError(
                "type",
                f"{self.role.value} may not send {frame.type} in state {self.state.value}",
                CLOSE_POLICY_VIOLATION,
            )
        if isinstance(frame, Hello) and frame.protocol_version != PROTOCOL_VERSION:
            raise LocalProtocolError("protocol_version", f"this end speaks {PROTOCOL_VERSION}")
        if isinstance(frame, Job) and frame.id in self._outstanding:
            raise LocalProtocolError("id", "delivery id is already outstanding")
        if isinstance(frame, JobResult | Progress | Cancel) and frame.id not in self._outstanding:
            raise LocalProtocolError("id", f"{frame.type} for a delivery that is not outstanding")
        deadline_s: float | None = None
        if isinstance(frame, Ping):
            if frame.nonce in self._pings:
                raise LocalProtocolError("nonce", "a ping with this nonce is outstanding")
            if self.ping_timeout_s is not None:
                if now_s is None:
                    raise LocalProtocolError("$", "send(Ping) needs now_s to start its deadline")
                deadline_s = now_s + self.ping_timeout_s
        text = encode_frame(frame)  # raises before any state changes
        if isinstance(frame, Job):
            self._outstanding.add(frame.id)
        elif isinstance(frame, JobResult):
            self._outstanding.discard(frame.id)
        elif isinstance(frame, Ping):
            self._pings[frame.nonce] = deadline_s
            if deadline_s is not None:
                self._queued[text] = frame.nonce
        self._advance(frame)
        return text

    # -- writing: a ping's deadline counts from its write --------------------------------

    def writing(self, text: str, now_s: float) -> None:
        """The caller's writer starts writing ``text`` (one frame; call before the write,
        for every frame). Pings queued behind it are not judged until it ends
        (:meth:`wrote`), unless the write itself stalls: past
        ``ping_timeout_s + len(text) / min_write_bytes_s`` from ``now_s``
        (:attr:`write_deadline_s`) the peer counts as having stopped reading (4002).

        Args:
            text: the frame's text, as :meth:`send` returned it.
            now_s: the caller's clock now, seconds.
        """
        self._write_start_s = now_s
        self._write_bytes = len(text)

    def wrote(self, text: str, now_s: float) -> bool:
        """The caller's writer has written ``text`` (call after every write, in order).
        A ping's timeout counts from its write; the pings still queued behind restart
        theirs (writing the frames ahead of them over a slow link, a backlog of jobs or
        one large result, is not the peer's silence). A writer stuck on one frame (a
        peer that stops reading) never gets here: :attr:`write_deadline_s` ends it.

        Args:
            text: the frame's text, as :meth:`send` returned it.
            now_s: the caller's clock now, seconds.

        Returns:
            True if a ping's deadline moved (:attr:`deadline_s` may now be earlier than
            it was during the write: a caller that plans its next check from it plans
            again), False if no ping was queued.
        """
        self._write_start_s = None
        if not self._queued:
            return False
        written = self._queued.pop(text, None) if len(text) <= _PING_TEXT_MAX else None
        if written is not None:
            self.restart_ping_deadline(written, now_s)
        for nonce in self._queued.values():
            self.restart_ping_deadline(nonce, now_s)
        return True

    def dropped(self, text: str) -> None:
        """A ping's ``text`` was not queued after all (the caller's send queue was full:
        the peer stopped reading): its deadline stays counted from its :meth:`send`, and
        writes no longer restart it.

        Args:
            text: the ping's text, as :meth:`send` returned it.
        """
        self._queued.pop(text, None)

    # -- deadlines and closing -----------------------------------------------------------

    def restart_ping_deadline(self, nonce: str, now_s: float) -> None:
        """Count an outstanding ping's ``ping_timeout_s`` from ``now_s`` instead of from
        its :meth:`send` (a caller whose sends wait in a queue: the ping was written
        only now, or the frames ahead of it were still being written). No-op for a
        nonce not outstanding or a ping without a deadline.

        Args:
            nonce: the ping's nonce.
            now_s: the caller's clock now, seconds.
        """
        if self._pings.get(nonce) is not None and self.ping_timeout_s is not None:
            self._pings[nonce] = now_s + self.ping_timeout_s

    def check_deadlines(self, now_s: float) -> None:
        """Fail the connection if a deadline has passed.

        Args:
            now_s: the caller's clock now, seconds (the clock of ``now_s`` everywhere).

        Raises:
            RemoteProtocolError: the handshake did not finish in ``handshake_timeout_s``
                (the hub closes with 1008 "no hello ...", the sidecar with 4002 "no
                welcome ..."), or a ping went unanswered for ``ping_timeout_s`` from
                its write (4002 "no pong ..."), or a write that a ping waits behind did
                not end within ``ping_timeout_s + size / min_write_bytes_s`` (4002 "a
                frame of ... bytes not written ...": the peer stopped reading). The
                connection is then ``CLOSING``.
        """
        if self.state in (_S.CLOSING, _S.CLOSED):
            return
        handshake = self._handshake_deadline_s
        if self.state is not _S.OPEN and handshake is not None and now_s >= handshake:
            waited = self.handshake_timeout_s
            if self.role is Role.HUB:
                exc = RemoteProtocolError(
                    "", f"no hello within {waited:g} s", CLOSE_POLICY_VIOLATION
                )
            else:
                exc = RemoteProtocolError("", f"no welcome within {waited:g} s", CLOSE_PING_TIMEOUT)
            self._fail(exc)
            raise exc
        for deadline_s, stalled in self._ping_deadlines() if self._pings else ():
            if now_s >= deadline_s:
                why = (
                    f"a frame of {self._write_bytes} bytes not written within "
                    f"{deadline_s - (self._write_start_s or 0.0):g} s (the peer stopped reading)"
                    if stalled
                    else f"no pong within {self.ping_timeout_s:g} s"
                )
                exc = RemoteProtocolError("", why, CLOSE_PING_TIMEOUT)
                self._fail(exc)
                raise exc

    def close(self, code: int, reason: str) -> None:
        """Decide to close (this end's choice: shutdown, superseded, token expiry). Only
        ``error`` frames may be sent from now on; received frames are dropped.

        Args:
            code: the close code to use.
            reason: why (cut to fit a close frame).
        """
        if self.state is not _S.CLOSED:
            self.state = _S.CLOSING
        self._record_close(code, reason)

    def closed(self, code: int, reason: str = "") -> None:
        """The socket is gone (the peer's close code, or 1006 if it broke). Final."""
        self.state = _S.CLOSED
        self._record_close(code, reason)

    def _record_close(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code = code
            self.close_reason = close_reason(reason)

    def _fail(self, exc: ProtocolError) -> None:
        self.close(exc.close_code, exc.reason)

    def _advance(self, frame: Frame) -> None:
        if isinstance(frame, Hello):
            self.hello = frame
        elif isinstance(frame, Welcome):
            self.welcome = frame
            self.ping_timeout_s = frame.ping_timeout_s
        self.state = TRANSITIONS.get((frame.type, self.state), self.state)


__all__ = [
    "MIN_WRITE_BYTES_S",
    "SENDABLE",
    "TRANSITIONS",
    "Connection",
    "ConnectionState",
    "Event",
    "Ignored",
    "Role",
]
