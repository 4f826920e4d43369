"""One connected sidecar socket on the hub: the session wires one nursery.

:meth:`HubSession.run` reads top to bottom: the handshake (hello -> welcome), then one
nursery owned by the session holding

* the **writer**, the only task that sends on the socket;
* the **reader**, which routes frames and never awaits a job (invariant 4);
* the **heartbeat** (``_presence.PresenceKeeper``): presence, supersede, hand-over;
* the **timers**: an application-level ping with a deadline and the token's expiry,
  kept for every session of the process by one task (``_pacer``), which visits
  :meth:`HubSession.pace` (``_session_timers``), and the token's revocation
  (:meth:`HubSession.revoke`, from ``_revocation``); a watch task raises what they decided;
* one **serving task** per entry the process reader (``_reader``) hands it; serving one
  entry is ``_delivery.EntryServer``, socket-free, with this session as its
  :class:`~deskbridge_hub._delivery.Executor`. The session does not read the stream:
  it attaches a :class:`~deskbridge_hub._reader.Listener` to the process reader.

The protocol's rules — hello first, the protocol version, which frames a sidecar may
send, outstanding delivery ids, ping nonces and deadlines, a close code per violation —
are the sans-I/O :class:`deskbridge_common.Connection`'s (the sidecar's session drives the
same one); this module does the I/O around it and the hub's own policy (tool schemas,
presence, relaying).

Any task ends the session by raising :class:`~deskbridge_hub._errors.EndSession` (or
``SocketClosed``); the close frame is sent after the nursery ended and presence is
cleared (if still ours).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio
from deskbridge_common import (
    CLOSE_NORMAL,
    CLOSE_TRY_AGAIN_LATER,
    Cancel,
    Connection,
    Error,
    Frame,
    Hello,
    Ignored,
    Job,
    JobResult,
    Ping,
    Pong,
    Progress,
    RemoteProtocolError,
    Role,
    Sleeping,
)
from deskbridge_common._connection import Event

from . import _directory, _metrics
from ._asleep import SleepRecord
from ._beats import SessionGone
from ._cancel_notice import Forwarded, answer_cancel_notice
from ._delivery import EntryServer
from ._desk_stage import Outstanding, stage_recorder
from ._errors import EndSession, SocketClosed
from ._handshake import handshake
from ._inbound import InboundBudget
from ._logging import fields
from ._peer_noise import LogBudget
from ._presence import PresenceKeeper
from ._process import HubState
from ._reader import Listener
from ._session_timers import SessionTimers
from ._substrate import Entry

log = logging.getLogger("deskbridge.hub.session")

#: Frames queued for the writer before a sender waits (backpressure per socket).
SEND_QUEUE = 256
#: Called by the reader with (job_id, frame) for each ``progress`` frame of a delivery on
#: this socket. Runs on the reader: it must not block (invariant 4: reading never waits on
#: work); hand the frame on with ``send_nowait`` or a non-blocking publish.
ProgressHook = Callable[[str, Progress], None]


class SidecarSocket(Protocol):
    """The little a session needs from a WebSocket (Quart's, or a memory fake)."""

    async def receive(self) -> str | bytes:
        """Next message. Raises ``SocketClosed`` (or is cancelled) when the peer is gone."""

    async def send(self, data: str) -> None:
        """Send one text message."""

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` and ``reason``."""


@attrs.define(eq=False)
class HubSession(SessionTimers):
    state: HubState
    socket: SidecarSocket
    user_id: str
    session_id: str = ""
    expires_at: float | None = None
    #: the token's ``iat`` (None: it has none), for revocations (``revoke``)
    issued_at: float | None = None
    hello: Hello | None = None
    deliveries: dict[str, Outstanding] = attrs.field(factory=dict)
    on_progress: ProgressHook | None = None
    sleep: SleepRecord | None = None  # whether the desktop went to sleep (``_asleep``)
    _conn: Connection = attrs.field(init=False)
    _send: trio.MemorySendChannel[str] = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel[str] = attrs.field(init=False)
    #: held while one frame is written (by the writer, or directly: ``_queue``)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: frames handed to the writer and not written yet (taken from the channel or not)
    _backlog: int = 0
    _nursery: trio.Nursery | None = None
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _presence: PresenceKeeper | None = None
    _listener: Listener | None = None
    _ending: str | None = None
    #: jobs whose delivery was reported ``running`` and ended unanswered (``reported_running``)
    _ran_unanswered: set[str] = attrs.field(factory=set)
    _reading_stopped: trio.Event = attrs.field(factory=trio.Event)
    _serving: int = 0
    #: ``wait_idle`` parks here until no entry is served (unparked as each one ends)
    _serving_ended: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _next_ping_s: float = 0.0
    _heard_s: float = 0.0  # when the sidecar's last message arrived (trio clock)
    _probing: bool = False
    _pings_sent: int = 0
    _peer_pings: bool = False  # the sidecar pings on its own (``_session_timers``)
    _timed_out: EndSession | None = None
    _time_is_up: trio.Event = attrs.field(factory=trio.Event)
    _done: bool = False
    _abandoned: bool = False
    _handed_over: bool = False
    #: superseded by a newer session in this process: at the end, the reader may hand
    #: what this session was given to the newer one at once (``ProcessReader.release``)
    _release_at_end: bool = False
    #: why the session was ended from outside (``close``, ``abandon``): for its log line
    _end_note: tuple[int | None, str] | None = None
    #: lines about the peer's refused or ignored frames (``_peer_noise``)
    _noise: LogBudget = attrs.field(factory=LogBudget)
    #: how fast the peer's messages are read (``_inbound``: a flooder slows only itself)
    _inbound: InboundBudget = attrs.field(factory=InboundBudget)
    _last_size: int = 0

    def __attrs_post_init__(self) -> None:
        self.session_id = self.session_id or self.state.new_session_id()
        self._conn = Connection(
            Role.HUB,
            now_s=trio.current_time(),
            handshake_timeout_s=self.state.timings.ping_timeout_s,
        )
        self._send, self._recv = trio.open_memory_channel[str](SEND_QUEUE)
        self._limiter = trio.CapacityLimiter(self.state.max_inflight_per_session)

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> int | None:
        """Serve the socket until it closes. Never raises for peer misbehaviour:
        protocol errors close the socket with their close code.

        Returns:
            The close code of a handshake refused before the welcome (e.g. 1013: the
            store was unavailable), else None (welcomed, then served).
        """
        try:
            presence = await self._handshake()
        except EndSession as refused:
            await self._close(refused.code, refused.reason)
            return refused.code
        server = EntryServer(
            self.state.substrate, self.state.timings, self.user_id, self.session_id,
            self.state.wall_clock, self.hello.daemon_id if self.hello else None,
            running_jobs=self.state.running_jobs,
            tools=frozenset(t.name for t in self.hello.tools) if self.hello else frozenset(),
        )  # fmt: skip
        self.state.add_session(self)
        _metrics.session_opened()
        await _directory.connected(self)  # the admin API's index (best effort)
        ended: list[EndSession] = []
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._writer)
                nursery.start_soon(self._guard, self._reader)
                nursery.start_soon(self._guard, lambda: presence.watch(self.wait_idle))
                nursery.start_soon(self._watch_timers)
                self._heard_s = trio.current_time()
                self._next_ping_s = self._heard_s + self.state.timings.ping_interval_s
                # visited now: ``pace`` plans from the ping *and* the token's expiry (a
                # first visit at the ping closed a 3 s token 30 s late)
                self.state.pacer.add(self, self._heard_s)
                # Reading this user's stream is the process reader's (``_reader``).
                self._listener = Listener(
                    self.user_id, self.session_id, presence.catalogue,
                    dispatch=lambda entry: self._dispatch(entry, server.serve),
                    on_deleted=server.answer_deleted,
                    on_superseded=self.supersede,
                    capacity=lambda: int(self._limiter.available_tokens),
                    stopped=self._reading_stopped,
                    delivered_state=server.delivered_state,
                    daemon_id=self.hello.daemon_id if self.hello else None,
                    on_retaken=self._record_again,
                    on_cut_off=self._cut_off_soon,
                    on_cancel=self._cancel_asked,
                )  # fmt: skip
                if self.state.drain.active:
                    self.stop_reading()
                self.state.reader.attach(self._listener)
        except* EndSession as group:
            ended += [e for e in group.exceptions if isinstance(e, EndSession)]
        finally:
            self._done = True
            self.state.pacer.discard(self)  # now, not at its next visit (``_pacer``)
            if self._listener is not None:
                if self._release_at_end:
                    self.state.reader.release(self._listener)
                self.state.reader.detach(self._listener)
            # why, for the log and the directory: ended from outside (``close``,
            # ``abandon``; the peer's close echo may end a task first), by a task, or the
            # socket went
            code, why = self._end_note or (
                (ended[0].code, ended[0].reason) if ended else (None, "socket gone")
            )
            log.info(
                "session %s of %s ends: %s",
                self.session_id,
                self.user_id,
                why if code is None else f"{code} {why}",
                extra=fields(user_id=self.user_id, session_id=self.session_id),
            )
            if self._noise.held():
                log.info(
                    "session %s: %d more lines about its frames left out",
                    self.session_id,
                    self._noise.held(),
                )
            self.state.remove_session(self)
            _metrics.session_closed()
            # before presence goes: never a bare "offline" between (an abandoned session's
            # daemon is already back: it did not go to sleep)
            if self.sleep is not None and not self._abandoned:
                await self.sleep.ended(ended[0] if ended else None, on_purpose=bool(self._ending))
            await presence.clear()
            await _directory.disconnected(self, code, why)
        if ended:
            end = ended[0]
            await self._close(end.code, end.reason)
        return None

    async def close(self, code: int, reason: str) -> None:
        """End the session from outside (graceful shutdown): send the close frame
        first, then cancel the session's tasks. Jobs still running are answered
        ``in_doubt`` at once (issue 11.4)."""
        self._ending = self._ending or reason
        self._end_note = self._end_note or (code, reason)
        self._conn.close(code, reason)
        await self._close(code, reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _cut_off_soon(self) -> None:
        """The process reader says this process is cut off from Redis: end the
        session (``cut_off``, in this session's nursery)."""
        if self._nursery is not None and not self._done:
            with contextlib.suppress(RuntimeError):  # the nursery is closing
                self._nursery.start_soon(self.cut_off)

    async def cut_off(self) -> None:
        """End the session because this process cannot reach Redis (``_reader``'s
        cut-off): the close frame (1013, try again later) first, so the sidecar
        reconnects at once to a replica that can serve it, then the session's tasks are
        cancelled. Not an end on purpose (no ``in_doubt`` answers: they could not be
        published anyway): running deliveries are left as for a socket gone, pending on
        this consumer, and the daemon's next session, on any process, takes them over
        at once and its ledger answers them."""
        reason = "hub cannot reach Redis; reconnect"
        self._end_note = self._end_note or (CLOSE_TRY_AGAIN_LATER, reason)
        self.stop_reading()
        self._conn.close(CLOSE_TRY_AGAIN_LATER, reason)
        await self._close(CLOSE_TRY_AGAIN_LATER, reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _record_again(self) -> None:
        """Presence had been lost and a beat wrote it again: so may the directory have
        been (``_directory.recorded_again``, in this session's nursery)."""
        if self._nursery is not None and not self._done:
            with contextlib.suppress(RuntimeError):  # the nursery is closing
                self._nursery.start_soon(_directory.recorded_again, self)

    def stop_reading(self) -> None:
        """Read no new entries (draining, or superseded); running jobs go on."""
        self._reading_stopped.set()

    def supersede(self, *, local: bool = False) -> None:
        """A newer session of this user holds presence (newest wins): stop reading, let
        the running jobs finish (within the grace), then close with 4001.

        Args:
            local: the newer session is in this process: jobs still running at the end
                of the grace stay pending and its drain redelivers them at once (the
                desktop's ledger answers them); otherwise their callers are answered
                ``in_doubt`` when this session ends, for good (the newer session may be
                another desktop's: the entries are acknowledged, not delivered again).
        """
        if not local:
            self._ending = self._ending or "superseded by a newer sidecar session"
            self._handed_over = True
        else:
            self._release_at_end = True  # after its grace, the newer session's drain serves them
        self.stop_reading()
        if self._listener is not None:
            self.state.reader.stop_beating(self._listener)
        if self._presence is not None:
            self._presence.supersede()

    def abandon(self) -> None:
        """The same desktop daemon (``hello.daemon_id``) started a newer session in this
        process, so this socket is dead even if no close or reset reached it (a
        half-open cut): end the session at once. Its running deliveries are cancelled as
        for a socket gone (recorded ``interrupted``, never answered ``in_doubt``: the
        daemon still has them), stay pending, and the newer session's drain redelivers
        them, which the daemon's ledger joins or answers."""
        log.info(
            "session %s of %s: its daemon is back on a newer socket; ending this one",
            self.session_id,
            self.user_id,
            extra=fields(user_id=self.user_id, session_id=self.session_id),
        )
        self._abandoned = True
        # A supersede told earlier (another process's notice: the daemon passed through
        # there first) no longer says what happens to the running deliveries: the same
        # daemon is back here, so they stay pending for it, never a final ``in_doubt``.
        self._ending = None
        self._handed_over = False
        self._end_note = self._end_note or (None, "abandoned: its daemon is back on a newer socket")
        self.stop_reading()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def ended_reason(self) -> str | None:
        """Why the session is ending on purpose, if it is (``_delivery.Executor``)."""
        return self._ending

    def handed_over(self) -> bool:
        """Superseded through another process (``_delivery.Executor``): its ``in_doubt``
        answers are final."""
        return self._handed_over

    async def wait_idle(self) -> None:
        """Return once no entry is being served on this socket (graceful shutdown)."""
        while self._serving:
            await self._serving_ended.park()

    async def _guard(self, fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
        except SocketClosed:
            raise EndSession(CLOSE_NORMAL, "socket closed") from None

    async def _close(self, code: int, reason: str) -> None:
        self._conn.close(code, reason)
        with trio.move_on_after(self.state.timings.close_timeout_s, shield=True):
            try:
                await self.socket.close(code, reason)
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass

    async def _receive(self) -> list[Event]:
        """The connection's events for the next message.

        Raises:
            SocketClosed: the peer closed the socket or it broke.
            EndSession: the sidecar broke the protocol (with the Connection's close code).
        """
        raw = await self.socket.receive()
        self._heard_s = trio.current_time()  # any message proves the peer alive (pings)
        self._last_size = len(raw)
        try:
            return self._conn.receive(raw)
        except RemoteProtocolError as exc:
            log.warning(
                "session %s: bad frame from %s: %s", self.session_id, self.user_id, exc.reason
            )
            raise EndSession(exc.close_code, exc.reason) from None

    def _encode(self, frame: Frame) -> str:
        """The text of ``frame`` from the connection (its rules, its bookkeeping).

        Raises:
            EndSession: the session is closing (with its close code); nothing more may be
                sent but ``error``.
            LocalProtocolError: ``frame`` breaks the protocol (a bug here, or a job no
                sidecar could accept).
        """
        code = self._conn.close_code
        if code is not None and not self._conn.may_send(frame.type):
            raise EndSession(code, self._conn.close_reason or "closing")
        return self._conn.send(frame, now_s=trio.current_time())

    async def _handshake(self) -> PresenceKeeper:
        """hello -> checks -> presence announced -> welcome (``_handshake.handshake``)."""
        return await handshake(self)

    # -- tasks -------------------------------------------------------------------------

    async def _queue(self, text: str, *, direct: bool = False) -> None:
        """Hand ``text`` to the writer; wait only while the send queue is full (a peer
        not reading). With room, no scheduler pass: the caller's next await is one. A
        cancelled caller queues nothing (as ``send`` would).

        Args:
            direct: write ``text`` from this task when nothing is being written or
                waits to be (a job of a sequential call: one hand-off to the writer
                task fewer, issue 10); returns once it is written. Otherwise, or when a
                write is in progress or frames wait, it is queued behind them.

        Raises:
            trio.ClosedResourceError, trio.BrokenResourceError: the writer is gone.
            EndSession: a direct write found the socket closed (as the writer's
                ``_guard`` says it).
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled: nothing is queued
        if direct and not self._backlog:
            try:
                self._write_lock.acquire_nowait()
            except trio.WouldBlock:
                pass  # a write in progress: queued behind it
            else:
                try:
                    await self._write(text)
                except SocketClosed:
                    raise EndSession(CLOSE_NORMAL, "socket closed") from None
                finally:
                    self._write_lock.release()
                return
        self._backlog += 1
        try:
            try:
                self._send.send_nowait(text)
            except trio.WouldBlock:
                await self._send.send(text)
        except BaseException:  # not queued
            self._backlog -= 1
            raise

    def _queue_nowait(self, text: str) -> None:
        """Hand ``text`` to the writer without waiting (the pacer's pings).

        Raises:
            trio.WouldBlock: the send queue is full.
            trio.ClosedResourceError, trio.BrokenResourceError: the writer is gone.
        """
        self._backlog += 1
        try:
            self._send.send_nowait(text)
        except BaseException:  # not queued
            self._backlog -= 1
            raise

    async def _write(self, text: str) -> None:
        """Write one frame (the caller holds ``_write_lock``). The Connection hears of
        every write (``writing``/``wrote``): a ping's timeout counts from when it was
        written, and the pings still queued behind restart theirs (a backlog of jobs on
        a slow link, or one large job, is not the peer's silence); a write that stalls
        past its size-aware bound (a peer that stopped reading) still ends the session
        (4002, at the pacer's visit)."""
        conn = self._conn
        conn.writing(text, trio.current_time())
        await self.socket.send(text)
        if conn.wrote(text, trio.current_time()):
            deadline_s = conn.deadline_s  # may be sooner than the visit planned
            if deadline_s is not None and not self._done:
                self.state.pacer.add(self, deadline_s)

    async def _writer(self) -> None:
        """Writes the queued frames in order, one at a time (a direct write of
        ``_queue`` in progress first ends: the lock is fair)."""
        lock = self._write_lock
        async for text in self._recv:
            try:
                lock.acquire_nowait()
            except trio.WouldBlock:
                await lock.acquire()
            try:
                await self._write(text)
            finally:
                lock.release()
                self._backlog -= 1

    async def _reader(self) -> None:
        while True:
            answered = False
            for event in await self._receive():
                answered |= await self._route(event)
            if not answered:  # the peer's own initiative: within its budget (_inbound)
                wait_s = self._inbound.charge(trio.current_time(), self._last_size)
                if wait_s > 0.0:  # over it: the peer's sends wait on TCP
                    await trio.sleep(wait_s)

    async def _route(self, event: Event) -> bool:
        """Act on one event of the peer's; True when it answered a delivery the hub sent
        (so its cost is bounded by what the hub sends, not charged to the peer's budget)."""
        if isinstance(event, JobResult):
            delivery = self.deliveries.get(event.id)
            if delivery is None:  # its serving task is gone (cancelled): nobody waits
                self._refused(event, "its delivery is no longer awaited")
                return False
            delivery.answer(event)
            return True
        elif isinstance(event, Progress):
            delivery = self.deliveries.get(event.id)
            if delivery is not None:
                delivery.report(event.stage)  # recorded by the task serving it
                if self.on_progress is not None:
                    self.on_progress(delivery.job_id, event)
        elif isinstance(event, Ping):
            self._peer_pings = True  # its pings keep it alive: the hub stops pinging it
            # Blocks when the send queue is full: a peer flooding pings without
            # reading stalls only its own session, and the pinger's deadline ends it.
            await self._queue(self._encode(Pong(nonce=event.nonce)))
        elif isinstance(event, Pong):
            pass  # the Connection has cleared its ping's deadline
        elif isinstance(event, Sleeping) and self.sleep is not None and self._nursery:
            self._nursery.start_soon(self.sleep.going_to_sleep)  # the reader never waits
        elif isinstance(event, Error):
            self._noisy(logging.INFO, "sidecar says %s: %r", event.code, event.message[:200])
        elif isinstance(event, Ignored):
            if isinstance(event.frame, JobResult):
                self._refused(event.frame, event.reason)
            else:
                self._noisy(logging.INFO, "%s ignored: %s", event.frame.type, event.reason)
        return False

    def _refused(self, result: JobResult, why: str) -> None:
        self._noisy(
            logging.WARNING,
            "job_result for id %r not delivered on this socket; refused (%s)",
            result.id[:64],
            why,
        )

    def _noisy(self, level: int, message: str, *args: object) -> None:
        """Log a line about a frame the peer should not have sent, within the session's
        budget (``_peer_noise``: a burst, then one line a minute saying how many were
        left out)."""
        held = self._noise.admit(trio.current_time())
        if held is None:
            return
        if held:
            message += " (%d more such lines about this session's frames left out)"
            args += (held,)
        log.log(level, "session %s: " + message, self.session_id, *args)

    # -- jobs: this session as the delivery module's executor ---------------------------

    async def _dispatch(
        self, entry: Entry, serve: Callable[[Entry, HubSession], Awaitable[None]]
    ) -> None:
        assert self._nursery is not None
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled: nothing is started
        try:  # room now (the usual case): no scheduler pass before the job is served
            self._limiter.acquire_on_behalf_of_nowait(entry.entry_id)
        except trio.WouldBlock:
            await self._limiter.acquire_on_behalf_of(entry.entry_id)
        try:
            self._nursery.start_soon(self._serve_entry, entry, serve)
        except RuntimeError:  # its tasks ended meanwhile (its nursery closed): not taken
            self._limiter.release_on_behalf_of(entry.entry_id)
            self.stop_reading()
            raise SessionGone(f"session {self.session_id} ended") from None

    async def _serve_entry(
        self, entry: Entry, serve: Callable[[Entry, HubSession], Awaitable[None]]
    ) -> None:
        self._serving += 1
        answered = False
        try:
            await serve(entry, self)
            answered = True
        finally:
            self.state.inflight.setdefault(self.user_id, set()).discard(entry.entry_id)
            self.state.reader.served(self.user_id, answered=answered, entry_id=entry.entry_id)
            self._limiter.release_on_behalf_of(entry.entry_id)
            self._serving -= 1
            if self._serving_ended:  # someone waits (a hand-over): no Event per entry
                self._serving_ended.unpark_all()

    async def execute(self, job: Job, *, epoch: int | None = None) -> JobResult:
        """Send ``job`` and wait for its ``job_result`` (see ``_delivery.Executor``),
        recording the desktop's stage reports meanwhile (``_desk_stage``, fenced)."""
        frame = self._encode(job)  # LocalProtocolError: no sidecar could accept it
        delivery = self.deliveries[job.id] = Outstanding(job_id=job.job_id, epoch=epoch)
        record = stage_recorder(self.state, self.user_id, job.job_id, self.session_id, epoch)
        try:
            # a job into a socket silent for a while: is anyone there? (asked first: a
            # direct write returns once written, and the ping then follows it)
            self.probe()
            await self._queue(frame, direct=True)
            return await delivery.wait(record)
        finally:
            self.deliveries.pop(job.id, None)
            if delivery.running and not delivery.done.is_set():
                self._ran_unanswered.add(job.job_id)  # read by ``reported_running``

    def reported_running(self, job_id: str) -> bool:
        """Whether the desktop reported ``running`` for this session's delivery of
        ``job_id`` that ended unanswered (see ``_delivery.Executor``); read once."""
        if job_id in self._ran_unanswered:
            self._ran_unanswered.discard(job_id)
            return True
        return False

    def _cancel_asked(self, job_id: str) -> None:
        """A cancel notice (``_cancel_notice``), from the process reader: answered in this
        session's nursery (a reader must not wait on one session)."""
        if self._nursery is None or self._done:
            return
        with contextlib.suppress(RuntimeError):  # its tasks ended: left as for a session gone
            self._nursery.start_soon(
                lambda: answer_cancel_notice(
                    self.state.substrate,
                    self.user_id,
                    job_id,
                    forwarded=self._delivery_of,
                    send_cancel=self.cancel,
                    wall_clock=self.state.wall_clock,
                    ttl_s=self.state.timings.result_ttl_s,
                )
            )

    def _delivery_of(self, job_id: str) -> Forwarded | None:
        """A delivery of ``job_id`` on this socket (answered or not), or None."""
        for delivery in self.deliveries.values():
            if delivery.job_id == job_id:
                daemon_id = self.hello.daemon_id if self.hello else None
                return Forwarded(self.session_id, daemon_id, delivery.epoch)
        return None

    async def cancel(self, job_id: str) -> None:
        """A cancel control entry or notice: send ``cancel`` at once for a delivery of that
        job on this socket, once per delivery. (Queued jobs are refused by the cancel
        flag when read.)"""
        for delivery_id, delivery in list(self.deliveries.items()):
            if (
                delivery.job_id == job_id
                and not delivery.done.is_set()
                and not delivery.cancel_sent
                and delivery_id in self._conn.outstanding
            ):
                delivery.cancel_sent = True
                log.info(
                    "session %s: cancelling job %s (delivery %s)",
                    self.session_id,
                    job_id,
                    delivery_id,
                )
                await self._queue(self._encode(Cancel(id=delivery_id)))


async def serve_sidecar(
    state: HubState,
    socket: SidecarSocket,
    user_id: str,
    *,
    expires_at: float | None = None,
    issued_at: float | None = None,
    on_progress: ProgressHook | None = None,
) -> int | None:
    """Serve one authenticated sidecar socket until it closes (see module docstring).

    Args:
        state: the process-wide hub state.
        socket: the accepted WebSocket.
        user_id: the user, taken from the verified token only.
        expires_at: the token's ``exp`` (Unix seconds, wall clock): the session is closed
            with 4003 when it passes, so a token's lifetime bounds its sessions too.
        issued_at: the token's ``iat`` (Unix seconds; None: it has none): a revocation
            of the user with a later cut-off closes the session (4003, ``_revocation``).
        on_progress: called with ``(job_id, Progress)`` for each ``progress`` frame of a
            delivery on this socket, from the reader (it must not block).

    Returns:
        The close code of a handshake refused before the welcome, else None.

    Cancellation: ends the session; presence is cleared only if still ours (shielded,
    bounded by ``CLEANUP_TIMEOUT_S``); in-flight entries stay pending and are
    redelivered.
    """
    return await HubSession(
        state, socket, user_id, expires_at=expires_at, issued_at=issued_at, on_progress=on_progress
    ).run()


__all__ = [
    "HubSession",
    "HubState",
    "ProgressHook",
    "SidecarSocket",
    "SocketClosed",
    "serve_sidecar",
]
