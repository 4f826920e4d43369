"""One connected sidecar socket on the hub.

Each socket gets one nursery, owned by :func:`serve_sidecar`, holding: the reader, the
writer (the only task that sends), the presence heartbeat, the pinger (application-level
ping with a deadline), the relay loop, and one task per delivered job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import anyio
import attrs
import trio
from deskbridge_common import (
    CLOSE_NORMAL,
    CLOSE_PING_TIMEOUT,
    CLOSE_POLICY_VIOLATION,
    CLOSE_SUPERSEDED,
    CLOSE_TOKEN_EXPIRED,
    CLOSE_UNSUPPORTED_DATA,
    PROTOCOL_VERSION,
    Cancel,
    Error,
    Frame,
    Hello,
    Job,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    RemoteProtocolError,
    Timings,
    Welcome,
    decode_frame,
    encode_frame,
)

from . import _metrics
from ._errors import SubstrateUnavailable
from ._jobs import JobEnvelope, MalformedEntry, result_payload
from ._relay import EntrySource, relay_loop
from ._schema import check_tool_schema
from ._substrate import Entry, Substrate

log = logging.getLogger("deskbridge.hub.session")


class SidecarSocket(Protocol):
    """The little a session needs from a WebSocket (Quart's, or a memory fake)."""

    async def receive(self) -> str | bytes:
        """Next message. Raises ``SocketClosed`` (or is cancelled) when the peer is gone."""

    async def send(self, data: str) -> None:
        """Send one text message."""

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` and ``reason``."""


class SocketClosed(Exception):
    """The peer closed the socket or it broke."""


class _EndSession(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


@attrs.define(eq=False)
class HubState:
    """Process-wide state shared by every session in this hub process.

    Attributes:
        substrate: the shared substrate.
        timings: timing knobs.
        consumer: this process's consumer name in group ``bridge-workers`` (unique per
            process).
        inflight: per user, entry IDs being served in this process right now.
        wall_clock: Unix time source (deadlines).
        max_inflight_per_session: most unanswered deliveries per socket.
        draining: set on graceful shutdown: relays stop reading new entries.
    """

    substrate: Substrate
    timings: Timings
    consumer: str
    wall_clock: Callable[[], float]
    max_inflight_per_session: int = 32
    inflight: dict[str, set[str]] = attrs.field(factory=dict)
    draining: bool = False
    sessions: dict[str, Any] = attrs.field(factory=dict)
    requests: int = 0
    requests_changed: trio.Event = attrs.field(factory=trio.Event)

    @contextlib.contextmanager
    def tracking_request(self) -> Iterator[None]:
        """Count a dispatch request waiting in this process, so a graceful shutdown can
        let it get its answer (within the grace) instead of cutting it."""
        self.requests += 1
        try:
            yield
        finally:
            self.requests -= 1
            self.requests_changed.set()
            self.requests_changed = trio.Event()

    async def wait_requests(self) -> None:
        """Return once no dispatch request is waiting in this process."""
        while self.requests:
            await self.requests_changed.wait()


@attrs.define(eq=False)
class _Delivery:
    entry_id: str
    envelope: JobEnvelope
    done: trio.Event = attrs.field(factory=trio.Event)
    result: JobResult | None = None


@attrs.define(eq=False)
class HubSession:
    state: HubState
    socket: SidecarSocket
    user_id: str
    session_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    expires_at: float | None = None
    hello: Hello | None = None
    deliveries: dict[str, _Delivery] = attrs.field(factory=dict)
    _send: Any = None
    _recv: Any = None
    _pongs: dict[str, trio.Event] = attrs.field(factory=dict)
    _nursery: trio.Nursery | None = None
    _limiter: trio.CapacityLimiter | None = None
    _serving: int = 0
    _catalogue: str = "null"
    _superseded: trio.Event = attrs.field(factory=trio.Event)
    _serving_changed: trio.Event = attrs.field(factory=trio.Event)

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the socket until it closes. Never raises for peer misbehaviour:
        protocol errors close the socket with their close code."""
        t = self.state.timings
        try:
            await self._handshake()
        except _EndSession as end:
            await self._close(end.code, end.reason)
            return
        self._send, self._recv = trio.open_memory_channel[str](256)
        self._limiter = trio.CapacityLimiter(self.state.max_inflight_per_session)
        inflight = self.state.inflight.setdefault(self.user_id, set())
        self.state.sessions[self.session_id] = self
        _metrics.session_opened()
        end: _EndSession | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._writer)
                nursery.start_soon(self._guard, self._reader)
                nursery.start_soon(self._guard, self._heartbeat)
                nursery.start_soon(self._guard, self._pinger)
                if self.expires_at is not None:
                    nursery.start_soon(self._expiry)
                source = EntrySource(self.state.substrate, self.user_id, self.state.consumer, t)
                nursery.start_soon(
                    self._guard,
                    lambda: relay_loop(
                        source,
                        inflight,
                        self._dispatch,
                        on_deleted=self._on_deleted,
                        paused=lambda: self.state.draining or self._superseded.is_set(),
                    ),
                )
        except* _EndSession as group:
            end = group.exceptions[0]  # type: ignore[assignment]
        finally:
            if end is None:
                log.info("session %s of %s ends (socket gone)", self.session_id, self.user_id)
            self.state.sessions.pop(self.session_id, None)
            _metrics.session_closed()
            with trio.move_on_after(2.0, shield=True):
                try:
                    await self.state.substrate.clear_presence(self.user_id, self.session_id)
                except SubstrateUnavailable as exc:
                    log.warning("could not clear presence of %s: %s", self.user_id, exc)
        if end is not None:
            log.info(
                "session %s of %s ends: %s %s", self.session_id, self.user_id, end.code, end.reason
            )
            await self._close(end.code, end.reason)

    async def close(self, code: int, reason: str) -> None:
        """End the session from outside (graceful shutdown, superseded): send the close
        frame first, then cancel the session's tasks."""
        await self._close(code, reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _guard(self, fn: Callable[[], Any]) -> None:
        try:
            await fn()
        except SocketClosed:
            raise _EndSession(CLOSE_NORMAL, "socket closed") from None

    async def _close(self, code: int, reason: str) -> None:
        with trio.move_on_after(self.state.timings.close_timeout_s, shield=True):
            try:
                await self.socket.close(code, reason)
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass

    async def _handshake(self) -> None:
        t = self.state.timings
        with trio.move_on_after(t.ping_timeout_s) as scope:
            try:
                raw = await self.socket.receive()
            except SocketClosed:
                raise _EndSession(CLOSE_NORMAL, "closed before hello") from None
        if scope.cancelled_caught:
            raise _EndSession(CLOSE_POLICY_VIOLATION, "no hello within ping timeout")
        frame = self._decode(raw)
        if not isinstance(frame, Hello):
            raise _EndSession(CLOSE_POLICY_VIOLATION, f"expected hello, got {frame.type}")
        if frame.protocol_version != PROTOCOL_VERSION:
            raise _EndSession(
                CLOSE_POLICY_VIOLATION,
                f"unsupported protocol_version {frame.protocol_version}"
                f"; hub speaks {PROTOCOL_VERSION}",
            )
        for i, spec in enumerate(frame.tools):
            problem = check_tool_schema(spec.args_schema)
            if problem:
                raise _EndSession(CLOSE_POLICY_VIOLATION, f"tools[{i}].args_schema: {problem}")
        self.hello = frame
        for other in list(self.state.sessions.values()):
            if other.user_id == self.user_id:
                other.supersede()  # same process: at once; other processes: next heartbeat
        # A hello without tools (the field is optional) means "catalogue unknown": stored
        # as null, so callers are not refused for tools the sidecar never listed.
        catalogue = self._catalogue = json.dumps([attrs.asdict(t) for t in frame.tools] or None)
        try:
            await self.state.substrate.set_catalogue(self.user_id, catalogue)
            await self.state.substrate.set_presence(self.user_id, self.session_id, t.presence_ttl_s)
            _metrics.presence_written("set")
        except SubstrateUnavailable:
            _metrics.presence_failed("unavailable")
            raise _EndSession(1013, "substrate unavailable; try again later") from None
        await self.socket.send(
            encode_frame(
                Welcome(
                    session_id=self.session_id,
                    heartbeat_s=t.heartbeat_s,
                    ping_interval_s=t.ping_interval_s,
                    ping_timeout_s=t.ping_timeout_s,
                )
            )
        )
        log.info(
            "session %s: %s online (sidecar %s)",
            self.session_id,
            self.user_id,
            frame.sidecar_version,
        )

    def _decode(self, raw: str | bytes) -> Frame:
        if isinstance(raw, bytes):
            raise _EndSession(CLOSE_UNSUPPORTED_DATA, "binary frames are not part of the protocol")
        try:
            return decode_frame(raw)
        except RemoteProtocolError as exc:
            log.warning(
                "session %s: bad frame from %s: %s", self.session_id, self.user_id, exc.reason
            )
            raise _EndSession(exc.close_code, exc.reason) from None

    # -- tasks -------------------------------------------------------------------------

    async def _writer(self) -> None:
        async for text in self._recv:
            await self.socket.send(text)

    def _post(self, frame: Frame) -> None:
        self._send.send_nowait(encode_frame(frame))

    async def _reader(self) -> None:
        while True:
            frame = self._decode(await self.socket.receive())
            if isinstance(frame, JobResult):
                delivery = self.deliveries.get(frame.id)
                if delivery is None or delivery.done.is_set():
                    log.warning(
                        "session %s: job_result for id %r not delivered on this socket; refused",
                        self.session_id,
                        frame.id[:64],
                    )
                    continue
                delivery.result = frame
                delivery.done.set()
            elif isinstance(frame, Ping):
                # Blocks when the send queue is full: a peer flooding pings without
                # reading stalls only its own session, and the pinger's deadline ends it.
                await self._send.send(encode_frame(Pong(nonce=frame.nonce)))
            elif isinstance(frame, Pong):
                event = self._pongs.get(frame.nonce)
                if event is not None:
                    event.set()
            elif isinstance(frame, Error):
                log.info(
                    "session %s: sidecar says %s: %r",
                    self.session_id,
                    frame.code,
                    frame.message[:200],
                )
            else:
                raise _EndSession(
                    CLOSE_POLICY_VIOLATION, f"unexpected {frame.type} frame from sidecar"
                )

    async def _heartbeat(self) -> None:
        """Refresh presence every ``heartbeat_s`` while it is still ours (atomically, so a
        heartbeat never steals presence back from a newer session); a newer session of
        the same user (newest wins) makes this one hand over."""
        t = self.state.timings
        interval_s = t.heartbeat_s
        while True:
            with trio.move_on_after(interval_s):
                await self._superseded.wait()
            interval_s = t.heartbeat_s
            if self._superseded.is_set():
                await self._hand_over()
            try:
                ours = await self.state.substrate.refresh_presence(
                    self.user_id, self.session_id, t.presence_ttl_s
                )
            except SubstrateUnavailable as exc:
                # Retry sooner than a full interval: after Redis comes back (empty), the
                # desktop must read online again quickly, not a heartbeat later.
                log.warning("heartbeat for %s failed: %s", self.user_id, exc)
                _metrics.presence_failed("unavailable")
                interval_s = min(1.0, t.heartbeat_s)
                continue
            if not ours:
                _metrics.presence_failed("not_holder")
                await self._hand_over()
            _metrics.presence_written("refresh")
            try:  # the holder keeps the catalogue true (a short-lived rival, a Redis restart)
                await self.state.substrate.set_catalogue(self.user_id, self._catalogue)
            except SubstrateUnavailable:
                interval_s = min(1.0, t.heartbeat_s)

    async def _expiry(self) -> None:
        """Close the session when its token expires (checked against the wall clock at
        most every ``heartbeat_s``, so a wall-clock jump is noticed too)."""
        assert self.expires_at is not None
        while (left := self.expires_at - self.state.wall_clock()) > 0:  # noqa: ASYNC110 - wall clock
            await trio.sleep(min(left, self.state.timings.heartbeat_s))
        raise _EndSession(CLOSE_TOKEN_EXPIRED, "token expired; issue a new one")

    def supersede(self) -> None:
        """A newer session of this user started (newest wins): stop relaying, let the
        running jobs finish, then close with 4001."""
        self._superseded.set()

    async def _hand_over(self) -> None:
        self._superseded.set()  # the relay stops reading new entries
        log.info(
            "session %s of %s superseded; finishing running jobs", self.session_id, self.user_id
        )
        with trio.move_on_after(self.state.timings.grace_s):
            await self.wait_idle()
        raise _EndSession(CLOSE_SUPERSEDED, "superseded by a newer sidecar session")

    async def _pinger(self) -> None:
        t = self.state.timings
        while True:
            await trio.sleep(t.ping_interval_s)
            nonce = uuid.uuid4().hex
            event = self._pongs[nonce] = trio.Event()
            try:
                # The deadline covers queueing the ping too: a peer that stops reading
                # fills the send queue, and must be timed out all the same.
                with trio.move_on_after(t.ping_timeout_s):
                    await self._send.send(encode_frame(Ping(nonce=nonce)))
                    await event.wait()
                if not event.is_set():
                    raise _EndSession(CLOSE_PING_TIMEOUT, f"no pong within {t.ping_timeout_s:g} s")
            finally:
                self._pongs.pop(nonce, None)

    # -- jobs --------------------------------------------------------------------------

    async def _dispatch(self, entry: Entry) -> None:
        assert self._limiter is not None and self._nursery is not None
        await self._limiter.acquire_on_behalf_of(entry.entry_id)
        self._nursery.start_soon(self._serve_entry, entry)

    async def _on_deleted(self, entry_ids: list[str]) -> None:
        """After each reclaim pass: answer "lost" for pending entries whose body is gone
        (XAUTOCLAIM deleted IDs) and for indexed entries trimmed before anyone read them."""
        found = await self.state.substrate.job_ids(self.user_id, entry_ids) if entry_ids else {}
        lost = list(found.items()) + await self.state.substrate.trimmed(self.user_id)
        for entry_id, job_id in lost:
            await self._answer_lost(entry_id, job_id)

    async def _answer_lost(self, entry_id: str, job_id: str | None) -> None:
        substrate = self.state.substrate
        if job_id is None:
            job_id = (await substrate.job_ids(self.user_id, [entry_id])).get(entry_id)
        # Whoever removes the index record answers, so a caller is told once.
        if job_id is not None and await substrate.forget(self.user_id, entry_id):
            log.warning(
                "user %s: entry %s (job %s) was trimmed or deleted before it ran",
                self.user_id,
                entry_id,
                job_id,
            )
            _metrics.job_served("unknown", "lost")
            await self._publish(
                job_id,
                result_payload(
                    "lost",
                    error={
                        "code": "lost",
                        "message": "the queued entry was trimmed or deleted before it ran",
                    },
                ),
            )
        await self._ack(entry_id)

    async def _serve_entry(self, entry: Entry) -> None:
        inflight = self.state.inflight.setdefault(self.user_id, set())
        self._serving += 1
        try:
            await self._serve_entry_inner(entry)
        finally:
            inflight.discard(entry.entry_id)
            assert self._limiter is not None
            self._limiter.release_on_behalf_of(entry.entry_id)
            self._serving -= 1
            self._serving_changed.set()
            self._serving_changed = trio.Event()

    async def wait_idle(self) -> None:
        """Return once no entry is being served on this socket (graceful shutdown)."""
        while self._serving:
            await self._serving_changed.wait()

    async def _serve_entry_inner(self, entry: Entry) -> None:
        if entry.fields is None:
            await self._answer_lost(entry.entry_id, None)
            return
        if entry.fields.get("control") == "cancel":
            await self._relay_cancel(entry.fields.get("job_id", ""))
            await self._ack(entry.entry_id)
            return
        try:
            envelope = JobEnvelope.from_fields(entry.fields)
        except MalformedEntry as exc:
            log.error(
                "user %s: malformed entry %s (%s); acked and dropped",
                self.user_id,
                entry.entry_id,
                exc,
            )
            job_id = entry.fields.get("job_id")
            _metrics.job_served(entry.fields.get("name", "unknown"), "failed")
            if job_id:
                await self._publish(
                    job_id,
                    result_payload("failed", error={"code": "malformed", "message": str(exc)}),
                )
            await self._ack(entry.entry_id)
            return
        if self.state.wall_clock() >= envelope.deadline:
            _metrics.job_served(envelope.name, "expired")
            await self._publish(
                envelope.job_id,
                result_payload(
                    "expired",
                    error={
                        "code": "expired",
                        "message": "deadline passed before the job was forwarded",
                    },
                    detail={"stage": "queued"},
                ),
            )
            await self._ack(entry.entry_id)
            return
        state = json.dumps(
            {
                "stage": "delivered",
                "user_id": self.user_id,
                "session_id": self.session_id,
                "at": self.state.wall_clock(),
            }
        )
        cancelled = await _retrying(
            lambda: self.state.substrate.mark_delivered(
                envelope.job_id, state, ttl_s=self.state.timings.result_ttl_s
            ),
            what=f"mark {envelope.job_id} delivered",
        )
        if cancelled:
            _metrics.job_served(envelope.name, "cancelled")
            await self._publish(
                envelope.job_id,
                result_payload(
                    "cancelled",
                    error={"code": "cancelled", "message": "cancelled before it started"},
                    detail={"stage": "queued"},
                ),
            )
            await self._ack(entry.entry_id)
            return
        delivery_id = uuid.uuid4().hex
        delivery = _Delivery(entry_id=entry.entry_id, envelope=envelope)
        self.deliveries[delivery_id] = delivery
        try:
            frame = encode_frame(
                Job(
                    id=delivery_id,
                    job_id=envelope.job_id,
                    name=envelope.name,
                    args=envelope.args,
                    idempotency_key=envelope.idempotency_key,
                    deadline=envelope.deadline,
                )
            )
        except LocalProtocolError as exc:
            # An entry no sidecar could accept (written by a buggy producer): answer it
            # as failed instead of letting it crash every session it is redelivered to.
            log.error("user %s: entry %s cannot be sent: %s", self.user_id, entry.entry_id, exc)
            self.deliveries.pop(delivery_id, None)
            _metrics.job_served(envelope.name, "failed")
            await self._publish(
                envelope.job_id,
                result_payload("failed", error={"code": "bad_job", "message": exc.reason}),
            )
            await self._ack(entry.entry_id)
            return
        try:
            await self._send.send(frame)
            _metrics.job_dispatched(envelope.name, self.state.wall_clock() - envelope.enqueued_at)
            await delivery.done.wait()
        finally:
            self.deliveries.pop(delivery_id, None)
            if delivery.result is None:  # the socket went away with the job on the desktop
                await self._mark_interrupted(envelope.job_id)
        result = delivery.result
        assert result is not None
        if result.ok:
            payload = result_payload("completed", result=result.result)
        else:
            error = result.error
            code = error.code if error else "failed"
            message = error.message if error else "failed"
            status = code if code in ("expired", "cancelled") else "failed"
            payload = result_payload(status, error={"code": code, "message": message})
        _metrics.job_served(envelope.name, "completed" if result.ok else status)
        await self._publish(envelope.job_id, payload)
        await self._ack(entry.entry_id)

    async def _relay_cancel(self, job_id: str) -> None:
        """A cancel control entry: send ``cancel`` at once for a delivery of that job on
        this socket. (Queued jobs are refused by the cancel flag when read.)"""
        for delivery_id, delivery in list(self.deliveries.items()):
            if delivery.envelope.job_id == job_id and not delivery.done.is_set():
                log.info(
                    "session %s: cancelling job %s (delivery %s)",
                    self.session_id,
                    job_id,
                    delivery_id,
                )
                await self._send.send(encode_frame(Cancel(id=delivery_id)))

    async def _mark_interrupted(self, job_id: str) -> None:
        state = json.dumps(
            {"stage": "interrupted", "user_id": self.user_id, "at": self.state.wall_clock()}
        )
        with trio.move_on_after(2.0, shield=True):
            try:
                await self.state.substrate.set_job_state(
                    job_id, state, ttl_s=self.state.timings.result_ttl_s
                )
            except SubstrateUnavailable:
                pass

    async def _publish(self, job_id: str, payload: str) -> None:
        """RPUSH the result; retried with bounded backoff until it is durable. XACK
        must never run before this returns (invariant 3)."""
        await _retrying(
            lambda: self.state.substrate.publish_result(
                job_id, payload, ttl_s=self.state.timings.result_ttl_s
            ),
            what=f"publish result of {job_id}",
        )
        # Off the caller's path (its BLPOP woke at the RPUSH): remember the job is finished,
        # so a late cancel is answered "finished". Best effort: the answer is already durable.
        finished = json.dumps({"stage": "finished", "user_id": self.user_id})
        try:
            await self.state.substrate.set_job_state(
                job_id, finished, ttl_s=self.state.timings.result_ttl_s
            )
        except SubstrateUnavailable:
            pass

    async def _ack(self, entry_id: str) -> None:
        await _retrying(
            lambda: self.state.substrate.ack(self.user_id, entry_id), what=f"XACK {entry_id}"
        )


async def _retrying(fn: Callable[[], Any], *, what: str) -> Any:
    delay = 0.1
    while True:
        try:
            return await fn()
        except SubstrateUnavailable as exc:
            log.warning("%s failed: %s; retrying in %.1f s", what, exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def serve_sidecar(
    state: HubState, socket: SidecarSocket, user_id: str, *, expires_at: float | None = None
) -> None:
    """Serve one authenticated sidecar socket until it closes (see module docstring).

    Args:
        state: the process-wide hub state.
        socket: the accepted WebSocket.
        user_id: the user, taken from the verified token only.
        expires_at: the token's ``exp`` (Unix seconds, wall clock): the session is closed
            with 4003 when it passes, so a token's lifetime bounds its sessions too.

    Cancellation: ends the session; presence is cleared only if still ours (shielded,
    bounded by 2 s); in-flight entries stay pending and are redelivered.
    """
    await HubSession(state, socket, user_id, expires_at=expires_at).run()


__all__ = ["HubSession", "HubState", "SidecarSocket", "SocketClosed", "serve_sidecar"]
