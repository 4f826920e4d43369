"""Redis pub/sub for one hub process: one subscriber connection per session (event-loop
run), shared by every subscription of that process.

``async with substrate.subscribe("bridge:notify:p1") as messages:`` returns once Redis
has confirmed the subscription, so anything published after that is delivered;
``async for message in messages:`` yields :class:`Message`. ``pattern=True`` subscribes
a glob pattern (PSUBSCRIBE). Several local subscriptions to one name share one server
subscription; the last to leave unsubscribes.

Pub/sub is at most once: a message published while the connection is down is lost. So
a subscription never stands alone as the record of anything (keep the durable list or
key and re-read it): when the connection is re-established every subscription receives
a *gap* (``Message(channel, None)``), which means "you may have missed messages; re-read
the durable state". The same gap marks messages dropped because a consumer fell more
than ``buffer`` messages behind (the reader never waits for a slow consumer).

RESP3 (coredis speaks it) delivers pub/sub messages as push frames, which coredis routes
to ``BaseConnection.push_messages``; SUBSCRIBE is sent with ``send_command`` (its
confirmation is a push frame too, not a reply).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis.exceptions import ConnectionError as RedisConnectionError

if TYPE_CHECKING:
    from ._redis_session import _Conn

log = logging.getLogger("deskbridge.hub.redis")

#: Default messages a subscription buffers before it drops (and later reports a gap).
DEFAULT_BUFFER = 1024
#: First and longest pause (seconds) between reconnection attempts; doubles in between.
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 2.0


@attrs.frozen
class Message:
    """One pub/sub message.

    Attributes:
        channel: the channel it was published on.
        data: its payload, or None for a gap (messages may have been missed: the
            connection was re-established or this consumer fell behind).
        pattern: the pattern that matched, for pattern subscriptions.
    """

    channel: str
    data: str | None
    pattern: str | None = None


class Subscription:
    """Messages for one ``subscribe()``; iterate with ``async for``. The iteration ends
    when the substrate closes.

    Attributes:
        name: the channel or pattern.
        dropped: messages dropped because the consumer was ``buffer`` behind.
    """

    def __init__(self, name: str, pattern: bool, buffer: int) -> None:
        self.name = name
        self.pattern = pattern
        self.dropped = 0
        self._missed = False
        send, receive = anyio.create_memory_object_stream[Message](buffer)
        self._send: MemoryObjectSendStream[Message] = send
        self._receive: MemoryObjectReceiveStream[Message] = receive

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def _deliver(self, message: Message) -> None:
        try:
            if self._missed:
                self._send.send_nowait(Message(message.channel, None, message.pattern))
                self._missed = False
            self._send.send_nowait(message)
        except anyio.WouldBlock:
            self.dropped += 1
            self._missed = True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def _close(self) -> None:
        self._send.close()
        self._receive.close()


class SubscriberHost(Protocol):
    """Where a :class:`Subscriber` gets its connection: one node's ``_Session``, or a
    Cluster's ``ClusterSubscriberHost`` (which picks a node on each connect)."""

    connect_timeout_s: float

    def start_soon(self, fn: Callable[[], Coroutine[object, object, None]]) -> None: ...

    async def connect(self) -> _Conn: ...

    async def discard(self, c: _Conn) -> None: ...


class Subscriber:
    """The pub/sub connection of one session and its reader task (started on the first
    subscription, then kept, reconnecting with backoff while anything is subscribed)."""

    def __init__(self, session: SubscriberHost, command_timeout_s: float) -> None:
        self._session = session
        self._command_timeout_s = command_timeout_s
        self._subs: dict[tuple[bool, str], set[Subscription]] = {}
        self._confirmations: dict[tuple[bool, str], anyio.Event] = {}
        self._conn: _Conn | None = None
        self._changed = anyio.Event()
        self._wanted = anyio.Event()
        self._running = False
        self._last_error: BaseException | None = None
        self._failures = 0  # connection attempts that failed (subscribe fails fast)

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.usable

    @contextlib.asynccontextmanager
    async def subscribe(
        self, name: str, *, pattern: bool = False, buffer: int = DEFAULT_BUFFER
    ) -> AsyncIterator[Subscription]:
        """Subscribe ``name`` (a pattern if ``pattern``) for the block's duration.

        Raises:
            TimeoutError / coredis ConnectionError: no subscriber connection within the
                connect timeout, or no confirmation within the command timeout (the
                caller maps both to SubstrateUnavailable).
        """
        key = (pattern, name)
        sub = Subscription(name, pattern, buffer)
        try:
            await self._subscribe(key, sub)
            yield sub
        finally:
            sub._close()
            self._unsubscribe(key, sub)

    async def _subscribe(self, key: tuple[bool, str], sub: Subscription) -> None:
        first = key not in self._subs
        self._subs.setdefault(key, set()).add(sub)
        self._wanted.set()
        if not self._running:
            self._running = True
            self._session.start_soon(self._run)
        elif first:
            self._send_subscribe(key)  # when not connected, the reader sends it on connect
        deadline = anyio.current_time() + self._session.connect_timeout_s
        deadline += self._command_timeout_s
        failures = self._failures
        while not ((confirmed := self._confirmations.get(key)) and confirmed.is_set()):
            changed = self._changed
            with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                await changed.wait()
            if scope.cancelled_caught or self._failures > failures:
                raise RedisConnectionError(
                    f"no pub/sub subscription confirmed: {self._last_error or 'no reply'}"
                )

    def reopen_if_older(self, age_s: float) -> None:
        """Close the subscriber connection if it is at least ``age_s`` seconds old (a
        command connection of the same session found the node it reaches demoted to a
        replica); the reader connects again at once, through the URL's endpoint, and
        every subscription gets a gap. No-op when not connected."""
        c = self._conn
        if c is None or not c.usable or anyio.current_time() - c.opened_at < age_s:
            return
        log.warning(
            "the pub/sub connection reaches a Redis replica (a command connection was "
            "answered READONLY or MASTERDOWN, or unblocked by the demotion): reconnecting it"
        )
        c.scope.cancel()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _send_subscribe(self, key: tuple[bool, str]) -> None:
        if self._conn is not None and self._conn.usable:
            assert self._conn.conn is not None
            self._confirmations[key] = anyio.Event()
            verb = b"PSUBSCRIBE" if key[0] else b"SUBSCRIBE"
            self._conn.conn.send_command(verb, key[1])

    def _unsubscribe(self, key: tuple[bool, str], sub: Subscription) -> None:
        subs = self._subs.get(key)
        if subs is None:
            return
        subs.discard(sub)
        if subs:
            return
        del self._subs[key]
        self._confirmations.pop(key, None)
        if self._conn is not None and self._conn.usable:
            assert self._conn.conn is not None
            verb = b"PUNSUBSCRIBE" if key[0] else b"UNSUBSCRIBE"
            self._conn.conn.send_command(verb, key[1])

    async def _run(self) -> None:
        pause_s = _RECONNECT_FIRST_S
        reconnected = False
        try:
            while True:
                if not self._subs:
                    self._wanted = anyio.Event()
                    await self._wanted.wait()
                try:
                    c = await self._session.connect()
                except Exception as exc:  # down: retry while anything is subscribed
                    self._last_error = exc
                    self._failures += 1
                    self._pulse()
                    await anyio.sleep(pause_s)
                    pause_s = min(pause_s * 2, _RECONNECT_MAX_S)
                    continue
                pause_s = _RECONNECT_FIRST_S
                self._conn = c
                for key in list(self._subs):
                    self._send_subscribe(key)
                self._pulse()
                if reconnected:
                    for subs in self._subs.values():
                        for sub in subs:
                            sub._deliver(Message(sub.name, None))
                await self._read(c)
                self._conn = None
                self._confirmations.clear()
                await self._session.discard(c)
                reconnected = True
        finally:
            self._running = False
            for subs in self._subs.values():
                for sub in subs:
                    sub._close()

    async def _read(self, c: _Conn) -> None:
        assert c.conn is not None
        try:
            async for push in c.conn.push_messages:
                self._dispatch(push)
        except (RedisConnectionError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return

    def _dispatch(self, push: list[Any]) -> None:
        kind = _text(push[0]).lower() if push else ""
        if kind == "message" and len(push) >= 3:
            self._fan_out((False, _text(push[1])), Message(_text(push[1]), _text(push[2])))
        elif kind == "pmessage" and len(push) >= 4:
            pattern = _text(push[1])
            self._fan_out((True, pattern), Message(_text(push[2]), _text(push[3]), pattern))
        elif kind in ("subscribe", "psubscribe") and len(push) >= 2:
            confirmed = self._confirmations.get((kind == "psubscribe", _text(push[1])))
            if confirmed is not None:
                confirmed.set()
                self._pulse()

    def _fan_out(self, key: tuple[bool, str], message: Message) -> None:
        for sub in self._subs.get(key, ()):
            sub._deliver(message)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
