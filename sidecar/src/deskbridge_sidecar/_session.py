"""One connected socket: hello/welcome, then six tasks in one nursery until it ends.

The protocol's rules (handshake order, which frames the hub may send, outstanding
delivery ids, ping nonces and their deadlines, the close code for each violation) are
the sans-I/O :class:`deskbridge_common.Connection`'s; this module only does the I/O
around it and the sidecar's own work (routing jobs, dedupe, answering). What happens to
a ``job`` or ``cancel`` frame once routed (admission, the tool and status workers,
answering) is ``_session_jobs.SessionJobs``, mixed into :class:`Session`.

The session nursery owns every task of the socket:

* reader — the only task that receives. It feeds each message to the connection and
  routes the events; it never awaits job work:
  jobs go onto memory channels (unbounded; the hub bounds what it has in flight), pings
  are answered at once through the writer, cache hits and refusals are answered
  directly.
* writer — the only task that sends; drains the outbox channel.
* tool worker — strictly serial: takes one job at a time, in arrival order, and awaits
  the daemon's :class:`ToolRunner` (there is one browser).
* status worker — answers ``status`` jobs from live state; never waits behind a tool.
* pinger — application-level ``ping`` every ``ping_interval_s``; no ``pong`` within
  ``ping_timeout_s`` of the ping's *write* drops the socket (close 4002). The writer
  tells the connection of every write, so a ping queued behind our own frames (a 1 MiB
  ``job_result`` on a slow uplink) counts from the end of that write, not from when it
  was queued; a write that stalls past its size-aware bound (the hub stopped reading)
  still drops it (``Connection.writing``/``wrote``).
* watchdog — a wall/monotonic clock gap over ``wedge_gap_s`` drops the socket (1001).

The first task to decide the session is over records why (:class:`SessionEnd`) and
cancels the nursery; the socket is then closed with that code, bounded by
``close_timeout_s`` (by ``DEAD_PEER_CLOSE_S``, 0.5 s, when the hub is presumed gone:
ping timeout, welcome timeout, clock gap). Cancelling a session never cancels a tool
run: runs belong to the daemon (see ``_runner``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Collection

import attrs
import trio
from deskbridge_common import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_NORMAL,
    CRASHED,
    Cancel,
    Connection,
    ConnectionState,
    Error,
    Frame,
    Hello,
    Ignored,
    Job,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    RemoteProtocolError,
    Role,
    Sleeping,
    Timings,
    Welcome,
    close_reason,
)
from deskbridge_common._connection import Event

from ._errors import TransportClosed
from ._outcome import Outcome
from ._runner import ToolRunner
from ._session_jobs import SessionJobs
from ._transport import Transport
from ._version import __version__
from ._watchdog import watch_clocks

log = logging.getLogger("deskbridge.sidecar.session")

# Why a session ended (SessionEnd.cause).
CLOSED = "closed"  #: the hub closed the socket, or the connection broke
PING_TIMEOUT = "ping_timeout"  #: no pong within ping_timeout_s (we close with 4002)
CLOCK_GAP = "clock_gap"  #: the watchdog saw a clock gap (we close with 1001)
PROTOCOL_ERROR = "protocol_error"  #: the hub sent a bad frame (we close with its code)
WELCOME_TIMEOUT = "welcome_timeout"  #: no welcome within ping_timeout_s (we close, 4002)
STOPPED = "stopped"  #: the daemon was cancelled/stopped (we close with 1001)
INTERNAL_ERROR = "internal_error"  #: a bug in the sidecar (we close with 1011)
ASLEEP = "asleep"  #: the machine is about to sleep: ``sleeping`` sent, we close with 1000

#: Causes after which the hub is presumed unreachable: the close frame is sent but its
#: answer is awaited at most DEAD_PEER_CLOSE_S, so a frozen hub or a dead network path
#: does not delay the reconnect by a whole ``close_timeout_s``.
_PEER_PRESUMED_DEAD = frozenset({PING_TIMEOUT, WELCOME_TIMEOUT, CLOCK_GAP})
#: Seconds a close handshake may take when the peer is presumed dead.
DEAD_PEER_CLOSE_S = 0.5

#: Frames waiting for the writer. The reader awaits space here only when the socket
#: itself is not draining, which is backpressure from the network, not from work.
OUTBOX_SIZE = 256


@attrs.frozen
class SessionEnd:
    """How a session ended.

    Attributes:
        cause: one of ``closed``, ``ping_timeout``, ``clock_gap``, ``protocol_error``,
            ``welcome_timeout``, ``stopped``, ``internal_error``.
        code: the close code: the hub's for ``closed`` (1006 if the connection broke),
            else the one we closed with.
        reason: the close reason.
        by_hub: True if the hub (or the network) ended it, False if we did.
        session_id: the hub's session id, or None if no welcome arrived.
        duration_s: seconds from connect to end (trio clock).
        slept_s: for ``clock_gap``, the gap in seconds (the next hello's ``slept_s``).
    """

    cause: str
    code: int
    reason: str
    by_hub: bool
    session_id: str | None
    duration_s: float
    slept_s: float | None = None

    @property
    def welcomed(self) -> bool:
        """True if the hub welcomed this session."""
        return self.session_id is not None


@attrs.frozen
class _Ending:
    cause: str
    code: int
    reason: str
    by_hub: bool


@attrs.define(eq=False)
class Session(SessionJobs):
    """Serve one open transport until it ends. Create one per connection.

    Args:
        transport: the open socket.
        runner: the daemon's tool runner (outlives the session).
        timings: timing knobs (welcome deadline, watchdog, close timeout).
        wall_clock: Unix time source, seconds (deadlines, watchdog, status).
        hello: the frame to open with.
        on_welcome: called once with the hub's welcome, before any job is read.
    """

    transport: Transport
    runner: ToolRunner
    timings: Timings
    wall_clock: Callable[[], float]
    hello: Hello
    on_welcome: Callable[[Welcome], None] = lambda welcome: None
    session_id: str | None = attrs.field(default=None, init=False)
    _end: _Ending | None = attrs.field(default=None, init=False)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _conn: Connection = attrs.field(factory=lambda: Connection(Role.SIDECAR), init=False)
    _outbox: trio.MemorySendChannel[str] | None = attrs.field(default=None, init=False)
    _tool_queue: trio.MemorySendChannel[Job] | None = attrs.field(default=None, init=False)
    _status_queue: trio.MemorySendChannel[Job] | None = attrs.field(default=None, init=False)
    _deliveries: dict[str, Job] = attrs.field(factory=dict, init=False)
    _pong: tuple[str, trio.Event] | None = attrs.field(default=None, init=False)
    #: set (and replaced) when the pinger should look again: a pong, a write
    _ping_news: trio.Event = attrs.field(factory=trio.Event, init=False)
    _unsent: int = attrs.field(default=0, init=False)  # queued for the writer, not yet sent
    _slept_s: float | None = attrs.field(default=None, init=False)
    _last_words: str | None = attrs.field(default=None, init=False)  # sent before the close

    @property
    def tools(self) -> list[str]:
        """Catalogue names announced in hello (``status`` first)."""
        return [t.name for t in self.hello.tools]

    async def run(self) -> SessionEnd:
        """Say hello, wait for welcome, serve until the socket ends, close it.

        Returns:
            Why and how the session ended.

        Raises:
            trio.Cancelled: the daemon is stopping; the socket is closed first with 1001
                (shielded, bounded by ``close_timeout_s``).
            Exception: a bug in a session task (the socket is closed with 1011 first).
        """
        started_at = trio.current_time()
        self._conn = Connection(
            Role.SIDECAR, now_s=started_at, handshake_timeout_s=self.timings.ping_timeout_s
        )
        out_send, out_recv = trio.open_memory_channel[str](OUTBOX_SIZE)
        tool_send, tool_recv = trio.open_memory_channel[Job](math.inf)
        status_send, status_recv = trio.open_memory_channel[Job](math.inf)
        self._outbox, self._tool_queue, self._status_queue = out_send, tool_send, status_send
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._writer, out_recv)
                await self._post(self.hello)
                welcome = await self._wait_welcome()
                if welcome is not None:
                    self.session_id = welcome.session_id
                    self.on_welcome(welcome)
                    nursery.start_soon(self._reader)
                    nursery.start_soon(self._tool_worker, tool_recv)
                    nursery.start_soon(self._status_worker, status_recv)
                    nursery.start_soon(self._pinger, welcome.ping_interval_s)
                    nursery.start_soon(self._watchdog)
        except BaseException as exc:
            if self._end is None:
                if isinstance(exc, Exception):
                    self._end = _Ending(
                        INTERNAL_ERROR, CLOSE_INTERNAL_ERROR, "internal error", False
                    )
                else:
                    self._end = _Ending(STOPPED, CLOSE_GOING_AWAY, "sidecar stopping", False)
            await self._close_transport()
            raise
        await self._close_transport()
        end = self._end
        assert end is not None, "session nursery ended without a recorded cause"
        return SessionEnd(
            cause=end.cause,
            code=end.code,
            reason=end.reason,
            by_hub=end.by_hub,
            session_id=self.session_id,
            duration_s=trio.current_time() - started_at,
            slept_s=self._slept_s,
        )

    def going_to_sleep(self) -> bool:
        """The machine is about to sleep: tell the hub (``sleeping``), then close with
        1000, so the desktop reads ``asleep`` at once instead of online until its pings
        time out. Running tools are not touched (they belong to the daemon).

        Returns:
            True if the session was open and is now ending; False otherwise.
        """
        if self._end is not None or self._conn.state is not ConnectionState.OPEN:
            return False
        self._last_words = self._conn.send(Sleeping())
        self._finish(ASLEEP, CLOSE_NORMAL, "going to sleep")
        return True

    # -- ending ------------------------------------------------------------------------

    def _finish(self, cause: str, code: int, reason: str, *, by_hub: bool = False) -> None:
        if by_hub:
            self._conn.closed(code, reason)
        else:
            self._conn.close(code, reason)
        if self._end is None:
            self._end = _Ending(cause, code, close_reason(reason), by_hub)
        if self._scope is not None:
            self._scope.cancel()

    async def _close_transport(self) -> None:
        end = self._end
        if end is None or end.by_hub:
            return
        bound_s = self.timings.close_timeout_s
        if end.cause in _PEER_PRESUMED_DEAD:
            bound_s = min(bound_s, DEAD_PEER_CLOSE_S)
        with trio.move_on_after(bound_s, shield=True):
            try:
                if end.cause == PROTOCOL_ERROR:
                    # Say why before closing (the error frame's purpose); best effort.
                    with contextlib.suppress(LocalProtocolError):
                        text = self._conn.send(Error(code=PROTOCOL_ERROR, message=end.reason))
                        await self.transport.send(text)
                if self._last_words is not None:
                    await self.transport.send(self._last_words)
                await self.transport.close(end.code, end.reason)
            except (TransportClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # -- receiving ---------------------------------------------------------------------

    async def _receive(self) -> list[Event] | None:
        """The connection's events for the next message; None once the session is over
        (the socket closed, or the hub broke the protocol: recorded, with its close code)."""
        try:
            raw = await self.transport.receive()
        except TransportClosed as exc:
            self._finish(CLOSED, exc.code, exc.reason, by_hub=True)
            return None
        try:
            return self._conn.receive(raw)
        except RemoteProtocolError as exc:
            log.warning("bad frame from hub: %s (closing with %d)", exc.reason, exc.close_code)
            self._finish(PROTOCOL_ERROR, exc.close_code, exc.reason)
            return None

    async def _wait_welcome(self) -> Welcome | None:
        deadline_s = self._conn.deadline_s
        with trio.move_on_at(math.inf if deadline_s is None else deadline_s):
            while (events := await self._receive()) is not None:
                for event in events:
                    if isinstance(event, Welcome):
                        return event
                    await self._route(event)  # a ping or an error (the connection's rules)
            return None
        try:
            self._conn.check_deadlines(trio.current_time())
        except RemoteProtocolError as exc:
            self._finish(WELCOME_TIMEOUT, exc.close_code, exc.reason)
        return None

    async def _reader(self) -> None:
        while (events := await self._receive()) is not None:
            for event in events:
                await self._route(event)

    async def _route(self, event: Event) -> None:
        if isinstance(event, Ping):
            await self._post(Pong(nonce=event.nonce))
        elif isinstance(event, Pong):
            if self._pong is not None and self._pong[0] == event.nonce:
                self._pong[1].set()
                self._wake_pinger()
        elif isinstance(event, Job):
            await self._on_job(event)
        elif isinstance(event, Cancel):
            await self._on_cancel(event)
        elif isinstance(event, Error):
            log.warning("hub says %s: %s", event.code, event.message)
        elif isinstance(event, Ignored):
            log.info("%s from hub ignored: %s", event.frame.type, event.reason)

    # -- the status tool; sending -------------------------------------------------------

    def status(self) -> dict[str, object]:
        """The ``status`` tool's result: live state, never cached."""
        return {
            "ok": True,
            "time": self.wall_clock(),
            "monotonic": trio.current_time(),
            "version": __version__,
            "running": self.runner.running,
            "tools": self.tools,
            "session_id": self.session_id,
        }

    async def _post(self, frame: Frame) -> None:
        """Queue ``frame`` for the writer, encoded now by the connection (so its rules and
        bookkeeping follow the order of the calls, which the outbox keeps)."""
        assert self._outbox is not None
        try:
            text = self._conn.send(frame, now_s=trio.current_time())
        except LocalProtocolError as exc:
            if not self._conn.may_send(frame.type):
                log.debug("%s not sent: the session is closing", frame.type)
                return
            log.error("cannot send %s frame: %s", frame.type, exc)
            if not isinstance(frame, JobResult) or frame.id not in self._conn.outstanding:
                return
            failed = Outcome.failure(CRASHED, f"result could not be encoded: {exc}")
            text = self._conn.send(failed.reply(frame.id))
        self._unsent += 1
        await self._outbox.send(text)

    async def wait_flushed(self, keys: Collection[str]) -> None:
        """Return once no delivery of ``keys`` waits for its answer here and every
        answer queued so far has been handed to the socket (the daemon's shutdown, after
        giving up on running tools). Polls every 10 ms; the caller bounds it."""
        assert self._outbox is not None

        def pending() -> bool:
            waiting = any(job.idempotency_key in keys for job in self._deliveries.values())
            return waiting or self._unsent > 0

        while pending():  # noqa: ASYNC110 - state of two tasks; the caller bounds it
            await trio.sleep(0.01)

    async def _writer(self, outbox: trio.MemoryReceiveChannel[str]) -> None:
        conn = self._conn
        async for text in outbox:
            conn.writing(text, trio.current_time())  # a ping behind it waits for it
            try:
                await self.transport.send(text)
            except TransportClosed as exc:
                self._finish(CLOSED, exc.code, exc.reason, by_hub=True)
                return
            finally:
                self._unsent -= 1
            if conn.wrote(text, trio.current_time()):
                self._wake_pinger()  # a ping's deadline moved

    def _wake_pinger(self) -> None:
        self._ping_news.set()
        self._ping_news = trio.Event()

    async def _pinger(self, interval_s: float) -> None:
        """A ping every ``interval_s`` after the last pong; the connection holds its
        deadline (the welcome's ``ping_timeout_s``), counted from when the writer wrote
        the ping: the frames queued ahead of it restart it as each is written, and a
        write in progress holds it until that write ends or stalls past its size-aware
        bound (``Connection.write_deadline_s``). A stalled socket still counts against
        the hub: a full outbox or a write that never ends drops the socket (4002)."""
        assert self._outbox is not None
        tag = secrets.token_hex(4)
        count = 0
        while True:
            await trio.sleep(interval_s)
            count += 1
            nonce = f"s{tag}-{count}"
            answered = trio.Event()
            self._pong = (nonce, answered)
            try:
                text = self._conn.send(Ping(nonce=nonce), now_s=trio.current_time())
                self._unsent += 1
                queued = False
                while not answered.is_set():
                    deadline_s = self._conn.deadline_s
                    news = self._ping_news
                    with trio.move_on_at(math.inf if deadline_s is None else deadline_s):
                        if not queued:
                            await self._outbox.send(text)
                            queued = True
                            continue
                        await news.wait()
                    self._conn.check_deadlines(trio.current_time())
            except RemoteProtocolError as exc:
                log.warning("%s; dropping the socket", exc.reason)
                self._finish(PING_TIMEOUT, exc.close_code, exc.reason)
                return
            finally:
                self._pong = None

    async def _watchdog(self) -> None:
        t = self.timings
        gap = await watch_clocks(
            interval_s=t.watchdog_interval_s, gap_s=t.wedge_gap_s, wall_clock=self.wall_clock
        )
        log.warning("%s", gap.describe())
        self._slept_s = gap.gap_s
        self._finish(CLOCK_GAP, CLOSE_GOING_AWAY, gap.describe())


__all__ = [
    "ASLEEP",
    "CLOCK_GAP",
    "CLOSED",
    "INTERNAL_ERROR",
    "PING_TIMEOUT",
    "PROTOCOL_ERROR",
    "STOPPED",
    "WELCOME_TIMEOUT",
    "Session",
    "SessionEnd",
]
