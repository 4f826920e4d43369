"""Public fakes for testing code that embeds the sidecar, and the sidecar itself.

* :class:`FakeHub` — a :class:`~deskbridge_sidecar.Connector` that speaks the hub side of
  the protocol over in-memory transports: records every connect attempt, can be down
  (connect fails) or refuse the upgrade with an HTTP status, welcomes each sidecar,
  answers its pings, and hands each session to the test as a :class:`FakeHubSession`
  that sends jobs, pings, cancels and raw text and waits for the answers.
* :class:`FakeWallClock` — a wall clock that follows trio's clock (so ``MockClock`` moves
  it) and can jump, like a laptop waking up.
* :class:`MemoryTransport` / :func:`memory_transport_pair` — the in-memory socket.
* :class:`MemoryDesk` — an approval desk in memory (``Daemon(approvals=...)``): a test
  approves or declines a ``@needs_approval`` tool's job with no files and no polling.

Typical use, with pytest-trio's ``autojump_clock``::

    hub = FakeHub(token="t", wall_clock=wall)
    await nursery.start(hub.serve)
    daemon = Daemon("ws://hub", "t", connector=hub, wall_clock=wall)
    await nursery.start(daemon.run)
    session = await hub.next_session()
    result = await session.call("echo", {"x": 1})
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from deskbridge_common import (
    Cancel,
    Frame,
    Hello,
    Job,
    JobResult,
    Ping,
    Pong,
    ProtocolError,
    Welcome,
    decode_frame,
    encode_frame,
)

from ._consent import MemoryDesk
from ._errors import ConnectFailed, HandshakeRejected, TransportClosed
from ._memory import ABNORMAL_CLOSURE, MemoryTransport, memory_transport_pair


@attrs.define(eq=False)
class FakeWallClock:
    """Unix time that advances with ``trio.current_time()`` plus jumps.

    Call it inside a trio run. Args: ``start`` — Unix time at trio time 0.
    """

    start: float = 1_700_000_000.0
    offset: float = 0.0

    def __call__(self) -> float:
        return self.start + trio.current_time() + self.offset

    def jump(self, seconds: float) -> None:
        """Move the wall clock by ``seconds`` without moving the trio clock."""
        self.offset += seconds


@attrs.frozen
class CloseInfo:
    """How a fake-hub session's socket closed.

    Attributes:
        code: the close code (1006 when the link broke without a close frame).
        reason: the close reason.
        by: ``"sidecar"`` (it closed or dropped the socket) or ``"hub"`` (the test did).
        at: trio time of the close.
    """

    code: int
    reason: str
    by: str
    at: float


@attrs.frozen
class ConnectAttempt:
    """One connect attempt seen by the fake hub.

    Attributes:
        at: trio time of the attempt.
        url: the URL the sidecar dialled.
        headers: the upgrade request headers.
        outcome: ``"accepted"``, ``"down"`` or ``"rejected <status>"``.
    """

    at: float
    url: str
    headers: dict[str, str]
    outcome: str


class _Notifier:
    """Wake every waiter whenever something changes (a tiny condition variable)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait_for(self, predicate: Callable[[], Any]) -> Any:
        while not (value := predicate()):
            await self._event.wait()
        return value


@attrs.define(eq=False)
class FakeHubSession:
    """The hub's side of one sidecar socket. Obtain from :meth:`FakeHub.next_session`.

    Attributes:
        attempt: the connect attempt that opened it.
        session_id: the id sent in welcome.
        hello: the sidecar's hello (None until received).
        welcome: the welcome sent (None until sent).
        answer_pings: answer the sidecar's pings (set False to play dead).
        received: every frame the sidecar sent, in order.
        received_at: trio time each frame in ``received`` arrived.
        results: job results by delivery id (a list, in case an id is answered twice).
        pongs: trio arrival time of each pong, by nonce.
        closed: how the socket closed, None while open.
        sidecar_end: the sidecar's end of the socket; its ``send_bytes_s`` is the
            sidecar's uplink (set it to model a slow link, 0 for a hub that stopped
            reading).
    """

    hub: FakeHub
    transport: MemoryTransport
    attempt: ConnectAttempt
    session_id: str
    answer_pings: bool
    sidecar_end: MemoryTransport | None = None
    hello: Hello | None = None
    welcome: Welcome | None = None
    received: list[Frame] = attrs.field(factory=list)
    received_at: list[float] = attrs.field(factory=list)
    results: dict[str, list[JobResult]] = attrs.field(factory=dict)
    pongs: dict[str, float] = attrs.field(factory=dict)
    closed: CloseInfo | None = None
    _changed: _Notifier = attrs.field(factory=_Notifier)
    _ids: Any = attrs.field(factory=itertools.count)
    _closing: bool = False

    # -- sending -------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        """Send one frame (encoded strictly).

        Raises:
            TransportClosed: the socket is closed.
        """
        await self.transport.send(encode_frame(frame))

    async def send_text(self, text: str | bytes) -> None:
        """Send raw text, e.g. a malformed frame."""
        await self.transport.send(text)

    async def send_welcome(self, **overrides: Any) -> Welcome:
        """Send welcome (done automatically unless ``FakeHub.auto_welcome`` is False)."""
        fields = {
            "session_id": self.session_id,
            "heartbeat_s": self.hub.heartbeat_s,
            "ping_interval_s": self.hub.ping_interval_s,
            "ping_timeout_s": self.hub.ping_timeout_s,
            **overrides,
        }
        self.welcome = Welcome(**fields)
        await self.send(self.welcome)
        self._changed.notify()
        return self.welcome

    async def send_job(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        id: str | None = None,  # noqa: A002 - the frame's field name
        key: str | None = None,
        job_id: str | None = None,
        deadline: float | None = None,
        timeout_s: float | None = None,
        waited_s: float | None = None,
    ) -> Job:
        """Send a job frame and return it.

        Args:
            name: tool name.
            args: tool args (default ``{}``).
            id: delivery id (default: fresh).
            key: idempotency key (default: fresh).
            job_id: requester's job id (default: fresh).
            deadline: Unix deadline (default: the hub's wall clock + 3600 s).
            timeout_s: seconds left (default: left out of the frame).
            waited_s: seconds since enqueue (default: left out of the frame).
        """
        n = next(self._ids)
        job = Job(
            id=id or f"d-{self.session_id}-{n}",
            job_id=job_id or f"job-{uuid.uuid4().hex[:12]}",
            name=name,
            args={} if args is None else args,
            idempotency_key=key or f"key-{uuid.uuid4().hex[:12]}",
            deadline=deadline if deadline is not None else self.hub.wall_clock() + 3600.0,
            timeout_s=timeout_s,
            waited_s=waited_s,
        )
        await self.send(job)
        return job

    async def call(self, name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> JobResult:
        """Send a job and wait for its result (see :meth:`send_job` for ``kwargs``)."""
        job = await self.send_job(name, args, **kwargs)
        return await self.wait_result(job.id)

    async def ping(self, nonce: str | None = None) -> str:
        """Send a ping; return its nonce (wait for the answer with :meth:`wait_pong`)."""
        nonce = nonce or f"h-{next(self._ids)}"
        await self.send(Ping(nonce=nonce))
        return nonce

    async def cancel(self, delivery_id: str) -> None:
        """Send ``cancel`` for a delivery id."""
        await self.send(Cancel(id=delivery_id))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket from the hub's side with ``code`` and ``reason``."""
        self._closing = True
        await self.transport.close(code, reason)
        self._record_close(code, reason, "hub")

    def abort(self) -> None:
        """Drop the socket without a close frame (a network failure; the sidecar sees 1006)."""
        self._closing = True
        self.transport.abort()
        self._record_close(ABNORMAL_CLOSURE, "connection aborted", "hub")

    # -- waiting -------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], Any]) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked whenever a frame arrives)."""
        return await self._changed.wait_for(predicate)

    async def wait_result(self, delivery_id: str) -> JobResult:
        """Wait for the (first) job_result answering ``delivery_id``."""
        found: list[JobResult] = await self.wait_for(lambda: self.results.get(delivery_id))
        return found[0]

    async def wait_pong(self, nonce: str) -> float:
        """Wait for the pong with ``nonce``; return its trio arrival time."""
        await self.wait_for(lambda: nonce in self.pongs)
        return self.pongs[nonce]

    async def wait_closed(self) -> CloseInfo:
        """Wait until the socket is closed; return how."""
        closed: CloseInfo = await self.wait_for(lambda: self.closed)
        return closed

    def frames(self, kind: type) -> list[Any]:
        """The received frames of one class, e.g. ``session.frames(Error)``."""
        return [f for f in self.received if isinstance(f, kind)]

    # -- serving -------------------------------------------------------------------

    def _record_close(self, code: int, reason: str, by: str) -> None:
        if self.closed is None:
            self.closed = CloseInfo(code=code, reason=reason, by=by, at=trio.current_time())
        self._changed.notify()

    async def _serve(self) -> None:
        try:
            while True:
                raw = await self.transport.receive()
                try:
                    frame = decode_frame(raw)
                except ProtocolError as exc:
                    await self.transport.close(exc.close_code, exc.reason)
                    self._record_close(exc.close_code, exc.reason, "hub")
                    raise AssertionError(f"sidecar sent a bad frame: {exc}") from None
                self.received.append(frame)
                self.received_at.append(trio.current_time())
                if isinstance(frame, Hello) and self.hello is None:
                    self.hello = frame
                    if self.hub.auto_welcome:
                        await self.send_welcome()
                    await self.hub._sessions_send.send(self)
                elif isinstance(frame, Ping):
                    if self.answer_pings:
                        await self.send(Pong(nonce=frame.nonce))
                elif isinstance(frame, Pong):
                    self.pongs.setdefault(frame.nonce, trio.current_time())
                elif isinstance(frame, JobResult):
                    self.results.setdefault(frame.id, []).append(frame)
                self._changed.notify()
        except TransportClosed as exc:
            if not self._closing:
                self._record_close(exc.code, exc.reason, "sidecar")
            else:
                self._changed.notify()


@attrs.define(eq=False)
class FakeHub:
    """An in-memory hub for tests; pass it as ``Daemon(connector=...)``.

    Start it with ``await nursery.start(hub.serve)`` before the daemon connects.

    Args:
        token: if set, any other bearer token is refused with HTTP 401.
        ping_interval_s, ping_timeout_s, heartbeat_s: announced in welcome.
        auto_welcome: answer hello with welcome automatically.
        answer_pings: default for each new session's ``answer_pings``.
        wall_clock: Unix time for default job deadlines.
        buffer: messages each direction of a socket buffers.
        uplink_bytes_s: each new socket's sidecar uplink, bytes a second (None: instant;
            ``FakeHubSession.sidecar_end`` changes it for one socket).

    Attributes:
        down: connect attempts fail with ``ConnectFailed`` while True.
        reject_status: refuse every upgrade with this HTTP status while set.
        reject_code, reject_message, reject_retry_after_s: the refusal's JSON error
            code and message and its ``Retry-After`` (as a hub sends them).
        attempts: every connect attempt, in order.
        sessions: every accepted session, in order.
    """

    token: str | None = None
    ping_interval_s: float = 10.0
    ping_timeout_s: float = 10.0
    heartbeat_s: float = 10.0
    auto_welcome: bool = True
    answer_pings: bool = True
    wall_clock: Callable[[], float] = time.time
    buffer: int = 16
    uplink_bytes_s: float | None = None
    down: bool = False
    reject_status: int | None = None
    reject_code: str = ""
    reject_message: str = ""
    reject_retry_after_s: float | None = None
    attempts: list[ConnectAttempt] = attrs.field(factory=list)
    sessions: list[FakeHubSession] = attrs.field(factory=list)
    _nursery: trio.Nursery | None = None
    _changed: _Notifier = attrs.field(factory=_Notifier)
    _sessions_send: trio.MemorySendChannel[FakeHubSession] = attrs.field(init=False)
    _sessions_recv: trio.MemoryReceiveChannel[FakeHubSession] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._sessions_send, self._sessions_recv = trio.open_memory_channel[FakeHubSession](
            math.inf
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[FakeHub] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Host the hub side's tasks until cancelled; ``started(self)``."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    @asynccontextmanager
    async def connect(
        self, url: str, headers: Sequence[tuple[str, str]]
    ) -> AsyncIterator[MemoryTransport]:
        """The :class:`~deskbridge_sidecar.Connector` method the daemon calls.

        Raises:
            ConnectFailed: ``down`` is True.
            HandshakeRejected: ``reject_status`` is set, or the token does not match.
        """
        await trio.lowlevel.checkpoint()
        if self._nursery is None:
            raise RuntimeError("start FakeHub.serve before connecting")
        header_map = dict(headers)
        status = self.reject_status
        if status is None and self.token is not None:
            if header_map.get("Authorization") != f"Bearer {self.token}":
                status = 401
        outcome = "down" if self.down else ("accepted" if status is None else f"rejected {status}")
        attempt = ConnectAttempt(trio.current_time(), url, header_map, outcome)
        self.attempts.append(attempt)
        self._changed.notify()
        if self.down:
            raise ConnectFailed("connection refused (fake hub is down)")
        if status is not None:
            if self.reject_status is None:  # a wrong token
                raise HandshakeRejected(status, "unauthorized", "bad token")
            raise HandshakeRejected(
                status, self.reject_code, self.reject_message, self.reject_retry_after_s
            )
        client, server = memory_transport_pair(self.buffer)
        client.send_bytes_s = self.uplink_bytes_s
        session = FakeHubSession(
            hub=self,
            transport=server,
            attempt=attempt,
            session_id=f"fake-{len(self.sessions) + 1}",
            answer_pings=self.answer_pings,
            sidecar_end=client,
        )
        self.sessions.append(session)
        self._nursery.start_soon(session._serve)
        try:
            yield client
        finally:
            client.abort()  # a no-op if the sidecar closed it properly

    async def next_session(self) -> FakeHubSession:
        """The next session whose hello arrived (and was welcomed, if ``auto_welcome``)."""
        return await self._sessions_recv.receive()

    async def wait_attempts(self, count: int) -> list[ConnectAttempt]:
        """Wait until at least ``count`` connect attempts were made; return them all."""
        await self._changed.wait_for(lambda: len(self.attempts) >= count)
        return list(self.attempts)


__all__ = [
    "CloseInfo",
    "ConnectAttempt",
    "FakeHub",
    "FakeHubSession",
    "FakeWallClock",
    "MemoryDesk",
    "MemoryTransport",
    "memory_transport_pair",
]
