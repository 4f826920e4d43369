"""The deadlines of one sidecar socket on the hub, mixed into ``_session.HubSession``:
the application-level ping (its deadline is the ``Connection``'s) and the token's expiry,
both driven by the process's one timer task (``_pacer``, issue 10: two timer tasks per
socket were most of an idle hub's CPU at 10,000 desktops). :meth:`SessionTimers.pace`
decides; :meth:`SessionTimers._watch_timers`, a task of the session's nursery, raises
:class:`~deskbridge_hub._errors.EndSession` to end the session."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import trio
from deskbridge_common import (
    CLOSE_PING_TIMEOUT,
    CLOSE_TOKEN_EXPIRED,
    Connection,
    Frame,
    Ping,
    RemoteProtocolError,
)

from ._errors import EndSession
from ._revocation import REVOKED_REASON

#: A job forwarded to a socket silent this long (seconds) is followed by a ping
#: (:meth:`SessionTimers.probe`); sockets busier than this prove themselves by their
#: traffic, so back-to-back calls add no pings.
PROBE_SILENCE_S = 1.0

if TYPE_CHECKING:
    from ._process import HubState


class SessionTimers:
    """Ping, token expiry and revocation of ``HubSession`` (see the module docstring)."""

    state: HubState
    expires_at: float | None
    issued_at: float | None
    _ending: str | None
    _conn: Connection
    _next_ping_s: float
    _heard_s: float
    _probing: bool
    _pings_sent: int
    _peer_pings: bool
    _timed_out: EndSession | None
    _time_is_up: trio.Event
    _done: bool

    def _queue_nowait(self, text: str) -> None:  # pragma: no cover - HubSession's
        raise NotImplementedError

    def _encode(self, frame: Frame) -> str:  # pragma: no cover - HubSession's
        raise NotImplementedError

    def pace(self, now_s: float) -> float | None:
        """The pacer's visit: end the session if its pong is late (4002) or its token
        expired (4003; the wall clock is checked at most every ``heartbeat_s``, so a
        wall-clock jump is noticed too). A sidecar that has pinged on its own
        (``_peer_pings``) is never pinged on a schedule: its pings prove it alive, and
        the session ends (4002) once nothing has come from it for ``ping_interval_s +
        ping_timeout_s``, the same window as an unanswered ping of the hub's. A peer
        that has not pinged gets a ping once the socket has been silent for
        ``ping_interval_s`` (the first one half of ``ping_timeout_s`` later, so that a
        sidecar's first ping, due an interval after its welcome, arrives first). Either
        way a ping goes out at once when :meth:`probe` asked, while none is outstanding.
        A ping's deadline (``ping_timeout_s``, the Connection's) counts from when the
        writer wrote it, and restarts while frames queued ahead of it are written; a
        write that stalls past its size-aware bound, or a peer that stops reading and
        fills the send queue (the ping is then dropped: its deadline counts from now),
        is timed out all the same. Never blocks, never raises.

        Why not "ping after ``ping_interval_s`` of silence" for every peer: a real
        sidecar pings every ``ping_interval_s`` *after its last pong*, so its pings
        arrive an interval plus a round trip apart, and the hub's silence check always
        fell that round trip earlier: every idle desktop was pinged both ways, four
        frames an interval where two prove the same.

        Args:
            now_s: the trio clock now.

        Returns:
            When to visit next (trio clock), or None once the session is ending.
        """
        if self._done or self._timed_out is not None:
            return None
        t = self.state.timings
        try:
            self._conn.check_deadlines(now_s)
        except RemoteProtocolError as exc:
            self._end_now(EndSession(exc.close_code, exc.reason))
            return None
        visit: list[float] = []
        if self.expires_at is not None:
            left = self.expires_at - self.state.wall_clock()
            if left <= 0:
                self._ending = "token expired"
                self._end_now(EndSession(CLOSE_TOKEN_EXPIRED, "token expired; issue a new one"))
                return None
            visit.append(now_s + min(left, t.heartbeat_s))
        if self._peer_pings and not self._probing:
            # its own pings keep it: only silence past an interval and a timeout ends it
            silent_until_s = self._heard_s + t.ping_interval_s + t.ping_timeout_s
            if now_s >= silent_until_s and not self._conn.pending_pings:
                waited = t.ping_interval_s + t.ping_timeout_s
                why = f"nothing from the sidecar (its pings stopped) for {waited:g} s"
                self._end_now(EndSession(CLOSE_PING_TIMEOUT, why))
                return None
            visit.append(silent_until_s)
        elif not self._conn.pending_pings:
            due_s = self._next_ping_s
            if not self._probing:
                # the first ping waits half a timeout longer: a sidecar's first ping comes
                # an interval after its welcome arrived, after the hub's count started
                grace_s = t.ping_timeout_s / 2 if self._pings_sent == 0 else 0.0
                due_s = max(due_s, self._heard_s + t.ping_interval_s + grace_s)
            if now_s >= due_s:
                self._pings_sent += 1
                self._probing = False
                nonce = f"p{self._pings_sent:x}"  # only has to be unique on this socket
                try:
                    text = self._encode(Ping(nonce=nonce))  # its timeout counts from its write
                except EndSession:
                    return None  # closing: nothing more to ping
                try:
                    self._queue_nowait(text)
                except trio.WouldBlock:
                    # the peer stopped reading: this ping's deadline, from now, ends it
                    self._conn.dropped(text)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return None
                due_s = self._next_ping_s = now_s + t.ping_interval_s
            visit.append(due_s)
        deadline_s = self._conn.deadline_s
        if deadline_s is not None:
            visit.append(deadline_s)
        if not visit:  # a ping outstanding with no deadline: look again in an interval
            visit.append(now_s + t.ping_interval_s)
        return max(min(visit), now_s)

    def probe(self) -> None:
        """Ping now (at the pacer's next turn) if the socket has been silent for
        ``PROBE_SILENCE_S`` or more and no ping is outstanding: called after a job is
        forwarded, so a job sent into a dead socket (a half-open connection, a laptop
        gone without a word) ends the session within ``ping_timeout_s`` of the job
        instead of up to ``ping_interval_s + ping_timeout_s`` after the socket died.
        The pong also tells the hub the job frame reached the sidecar's connection."""
        now_s = trio.current_time()
        if self._done or self._conn.pending_pings or now_s - self._heard_s < PROBE_SILENCE_S:
            return
        self._probing = True
        self._next_ping_s = now_s
        self.state.pacer.add(self, now_s)

    def revoke(self, before_s: float) -> bool:
        """The user's tokens issued before ``before_s`` were revoked (``_revocation``):
        if this session's token is one of them (or has no ``iat``), end the session now
        with 4003 and :data:`~deskbridge_hub._revocation.REVOKED_REASON`, on purpose (its
        running jobs are answered ``in_doubt``, as when the token expires). Never blocks.

        Returns:
            True if the session is ended by it.
        """
        if self._done or self._timed_out is not None:
            return False
        if self.issued_at is not None and self.issued_at >= before_s:
            return False
        self._ending = "token revoked"
        self._end_now(EndSession(CLOSE_TOKEN_EXPIRED, REVOKED_REASON))
        return True

    def _end_now(self, end: EndSession) -> None:
        self._timed_out = end
        self._time_is_up.set()

    async def _watch_timers(self) -> NoReturn:
        """Raise what :meth:`pace` decided (a late pong, an expired token)."""
        await self._time_is_up.wait()
        assert self._timed_out is not None
        raise self._timed_out
