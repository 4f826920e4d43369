"""One Redis connection with a short per-command path (issue 10: hub CPU per call).

``WireConnection`` is what ``_redis_session`` hosts for a single Redis (``redis://``,
``rediss://``, ``unix://``; the Cluster keeps coredis's cluster connections). It keeps
coredis's protocol code, the compiled ``Packer`` (commands to RESP) and ``Parser`` (RESP3
to the same reply shapes and the same error classes as a coredis connection, so the
command layer cannot tell them apart), and replaces the part that costs: coredis's
``BaseConnection`` passes every command through a memory stream to a writer task, which
wakes, packs and sends it, and a reader task that sets an anyio ``Event`` per request
inside a fresh ``fail_after`` scope per receive; three task switches and about 500 Python
calls per command (``bench/client_cost.py`` is the reproduction: deskbridge's coredis
path cost 1.8x redis-py's CPU per sequential GET and 3.2x a bare trio socket's). Here the
task that awaits a request writes it itself (every command created before that await goes
in the same write), and one reader task parses replies and wakes their waiters: two
switches per command, none of them through a channel.

The interface is the subset of coredis's ``BaseConnection`` that ``_redis_session`` and
``_redis_pubsub`` use: ``run(task_status=)``, ``usable``, ``create_request(...)`` (an
awaitable; with ``raise_exceptions=False`` an error reply, a timeout or a lost connection
is returned as its exception instance), ``send_command()`` and ``push_messages``.

Lifecycle: ``run()`` connects (TCP or Unix socket, TLS when the URL says so), performs the
handshake (``HELLO 3`` with AUTH, ``SELECT``, ``CLIENT SETNAME``), reports started, and
then reads until the connection is lost, ``invalidate()`` is called, or its task is
cancelled; every way out closes the socket *before* ``run()`` returns and fails the
requests still waiting with coredis's ``ConnectionError``. A write is shielded from
cancellation (at most ``write_timeout_s``), so a cancelled task never leaves half a
command on the wire. Under trio, on a plain (not TLS) socket, a write on a connection with
at most ``_DIRECT_MAX_OUTSTANDING`` requests outstanding (sequential use: latency counts)
first goes straight to the socket (non-blocking ``send``); only what the kernel does not
take at once goes through the stream (the shielded, bounded path), as does every write on
a busier connection (batching counts). That skips, per command, two cancel
scopes and the stream's post-send scheduler pass, which is latency on the critical path
(trio's ``send`` yields after every successful write). The reader reads the socket
itself too (the stream's reads, without its wrappers).
"""

from __future__ import annotations

import socket
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Generator
from typing import Any

import anyio
import anyio.abc
import sniffio
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis._packer import Packer
from coredis.connection import TCPLocation, UnixDomainSocketLocation
from coredis.constants.resp import DataType
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import InvalidResponse, RedisError
from coredis.parser import NotEnoughData, Parser

#: Bytes asked of the socket per receive.
_RECEIVE_BYTES = 65536
#: Most requests outstanding (written or not) for a write to go straight to the socket.
#: More means other tasks are using the connection: the stream's write, which yields once
#: after sending, lets their commands join the next write (fewer, larger writes under
#: load) instead of one send per command.
_DIRECT_MAX_OUTSTANDING = 2
#: Push frames (pub/sub) buffered before the reader waits for their consumer.
_PUSH_BUFFER = 4096


class ConnectFailed(RedisConnectionError):
    """No connection to Redis could be made (refused, unreachable, timed out before the
    handshake ended): nothing was sent on it."""


class WireRequest:
    """One command's reply; ``await`` it. Created by ``WireConnection.create_request``."""

    __slots__ = (
        "_conn",
        "_done",
        "_event",
        "_value",
        "command",
        "disconnect_on_cancellation",
        "raise_exceptions",
        "timeout_s",
    )

    def __init__(
        self,
        conn: WireConnection,
        command: bytes,
        timeout_s: float | None,
        raise_exceptions: bool,
        disconnect_on_cancellation: bool,
    ) -> None:
        self._conn = conn
        self.command = command
        self.timeout_s = timeout_s
        self.raise_exceptions = raise_exceptions
        self.disconnect_on_cancellation = disconnect_on_cancellation
        self._done = False
        self._event: anyio.Event | Any = None
        self._value: Any = None

    def _resolve(self, value: Any) -> None:
        if not self._done:
            self._done = True
            self._value = value
            if self._event is not None:
                self._event.set()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result().__await__()

    async def _result(self) -> Any:
        try:
            if self._conn._out:
                await self._conn._flush()
            if not self._done:
                # under trio, trio's own primitives: no anyio layer per request
                lib: Any = trio if self._conn._on_trio else anyio
                if self._conn._self_reading:  # no reader task: this one reads the reply
                    waiting = self._conn._read_until(self)
                else:
                    self._event = lib.Event()
                    waiting = self._event.wait()
                if self.timeout_s is None:
                    await waiting
                else:
                    # a timeout already over (<= 0, NaN) answers TimeoutError at once, as
                    # anyio's does (trio's refuses a negative one)
                    over = not self.timeout_s > 0
                    with lib.move_on_after(0 if over else self.timeout_s):
                        await waiting
                if not self._done:
                    self._resolve(
                        TimeoutError(
                            f"{self.command.decode(errors='replace')} timed out after "
                            f"{self.timeout_s} seconds"
                        )
                    )
                    if self.disconnect_on_cancellation:
                        self._conn.invalidate()
            else:
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            if self.disconnect_on_cancellation:
                self._conn.invalidate()
            raise
        if self.raise_exceptions and isinstance(self._value, BaseException):
            raise self._value
        return self._value


class WireConnection:
    """One Redis connection (see the module docstring).

    Args:
        location: coredis's ``TCPLocation`` or ``UnixDomainSocketLocation`` (from
            ``ConnectionPool.from_url``, which parses the URL).
        connect_timeout: seconds for the socket, TLS and the handshake together.
        decode_responses: decode bulk and simple strings as ``encoding`` (UTF-8).
        username, password: sent with HELLO's AUTH when either is given.
        db: the database to SELECT (0: none sent).
        client_name: sent with CLIENT SETNAME, or None.
        ssl_context: TLS for ``rediss://``, or None.
        write_timeout_s: seconds a write may wait for the socket to take it before the
            connection is presumed dead.
        self_read: the task awaiting a reply reads it from the socket itself, and no
            reader task runs (a dedicated connection: one request at a time, no push
            frames; one scheduler pass and one wake-up fewer per command). Only under
            trio on a plain socket; otherwise the reader task reads, as without it. An
            idle connection's end is then seen by :meth:`idle_alive`, not by a reader.

    Other keyword arguments of coredis's connections are accepted and ignored.
    """

    def __init__(
        self,
        location: TCPLocation | UnixDomainSocketLocation,
        *,
        connect_timeout: float | None = None,
        decode_responses: bool = True,
        encoding: str = "utf-8",
        username: str | None = None,
        password: str | None = None,
        db: int | None = 0,
        client_name: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        write_timeout_s: float = 10.0,
        self_read: bool = False,
        **_ignored: Any,
    ) -> None:
        self.location = location
        self._connect_timeout = connect_timeout
        self._decode = decode_responses
        self._encoding = encoding
        self._username = username
        self._password = password
        self._db = db or 0
        self.client_name = client_name
        self._ssl_context = ssl_context
        self._write_timeout_s = write_timeout_s
        self._packer = Packer(encoding)
        self._parser = Parser()
        self._stream: anyio.abc.ByteStream | None = None
        #: The plain socket under ``_stream`` when writes may go to it directly.
        self._raw: socket.socket | None = None
        #: Running under trio (its primitives, not anyio's wrappers, per request).
        self._on_trio = False
        self._self_read = self_read
        #: Requesters read their replies (``self_read``, under trio on a plain socket).
        self._self_reading = False
        self._requests: deque[WireRequest] = deque()
        self._out: list[bytes] = []
        self._sending = False
        self._ready = False
        self._terminated = False
        self._scope = anyio.CancelScope()
        self._write_wanted = anyio.Event()
        self._push_in: MemoryObjectSendStream[list[Any]] | None = None
        self._push_out: MemoryObjectReceiveStream[list[Any]] | None = None

    def __repr__(self) -> str:
        return f"WireConnection<{self.location}>"

    @property
    def usable(self) -> bool:
        """Connected, handshake done, and neither lost nor invalidated."""
        return self._ready and not self._terminated

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, handshake, report ``task_status.started()``, then read replies until
        the connection ends. Returns when it ends after the start; raises before it.

        Raises:
            coredis ConnectionError: the socket could not be opened or the handshake
                failed for a transport reason (the cause is chained).
            coredis AuthenticationError / ResponseError: the server refused the handshake
                (wrong password, no such database).
            TimeoutError: not connected within ``connect_timeout``.
        """
        if self._stream is not None or self._terminated:
            raise RuntimeError("a WireConnection runs once")
        self._push_in, self._push_out = anyio.create_memory_object_stream[list[Any]](_PUSH_BUFFER)
        try:
            with self._scope:
                try:
                    with anyio.fail_after(self._connect_timeout):
                        self._stream = await self._connect()
                        await self._handshake()
                    self._on_trio = sniffio.current_async_library() == "trio"
                    self._raw = _direct_socket(self._stream) if self._on_trio else None
                    self._self_reading = self._self_read and self._raw is not None
                except OSError as exc:
                    raise ConnectFailed(
                        f"Unable to establish a connection to {self.location}: {exc}"
                    ) from exc
                self._ready = True
                task_status.started()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer)
                    if self._self_reading:  # replies are read by their requesters
                        await anyio.sleep_forever()
                    else:
                        await self._read()
                    tg.cancel_scope.cancel()
        finally:
            self._ready = False
            self._terminated = True
            self._fail_all(RedisConnectionError("Connection lost"))
            self._push_in.close()
            self._push_out.close()
            if self._stream is not None:
                with anyio.CancelScope(shield=True):
                    await self._stream.aclose()

    async def _connect(self) -> anyio.abc.ByteStream:
        if isinstance(self.location, UnixDomainSocketLocation):
            return await anyio.connect_unix(self.location.path)
        if self._ssl_context is not None:
            return await anyio.connect_tcp(
                self.location.host,
                self.location.port,
                tls=True,
                ssl_context=self._ssl_context,
                tls_standard_compatible=False,
            )
        return await anyio.connect_tcp(self.location.host, self.location.port)

    async def _handshake(self) -> None:
        """HELLO 3 (+ AUTH), SELECT, CLIENT SETNAME, pipelined in one write and read here
        (the reader does not run yet). A refusal raises its coredis error class."""
        hello: list[Any] = [3]
        if self._username or self._password:
            hello += ["AUTH", self._username or "default", self._password or ""]
        commands: list[tuple[Any, ...]] = [(b"HELLO", *hello)]
        if self._db:
            commands.append((b"SELECT", self._db))
        if self.client_name is not None:
            commands.append((b"CLIENT SETNAME", self.client_name))
        assert self._stream is not None
        for command in commands:
            self._out.extend(self._packer.pack_command(*command))
        await self._stream.send(b"".join(self._out))
        self._out.clear()
        replies: list[Any] = []
        while len(replies) < len(commands):
            try:
                data = await self._stream.receive(_RECEIVE_BYTES)
            except (anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                raise RedisConnectionError(
                    f"{self.location} closed the connection during the handshake"
                ) from exc
            self._parser.feed(data)
            while len(replies) < len(commands):
                parsed = self._parse()
                if isinstance(parsed, NotEnoughData):
                    break
                replies.append(parsed[1])
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        if not isinstance(replies[0], dict) or replies[0].get("proto") != 3:
            raise RedisConnectionError(f"HELLO 3 was not accepted: {replies[0]!r}")

    def _parse(self) -> Any:
        """The parser's next reply, or NotEnoughData.

        Raises:
            coredis ConnectionError: the bytes are not RESP (:meth:`_not_redis`).
        """
        try:
            return self._parser.parse(self._decode, self._encoding)
        except InvalidResponse as exc:
            raise self._not_redis(exc) from exc

    def _not_redis(self, exc: InvalidResponse) -> RedisConnectionError:
        """A connection error for a peer whose answer is not RESP: a port where another
        service answers (an HTTP server, a proxy). coredis' own InvalidResponse escaped
        as a traceback (`serve`'s lifespan, `revoke`) instead of "unavailable"."""
        return RedisConnectionError(
            f"{self.location} answered in what is not Redis' protocol ({exc}): "
            "is it a Redis server (and, for rediss://, one that speaks TLS)?"
        )

    def invalidate(self, reason: str | None = None) -> None:
        """Mark the connection unusable and close it (``run()`` returns once the socket is
        closed). Safe to call more than once."""
        self._terminated = True
        self._scope.cancel()

    def _fail_all(self, error: BaseException) -> None:
        while self._requests:
            self._requests.popleft()._resolve(error)

    # -- reading -------------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._stream is not None
        stream, parser, requests = self._stream, self._parser, self._requests
        decode, encoding = self._decode, self._encoding
        raw = self._raw
        while True:
            try:
                if raw is not None:
                    data = await _receive_direct(raw)
                else:
                    data = await stream.receive(_RECEIVE_BYTES)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._terminated = True
                return
            except OSError:
                self._terminated = True
                return
            parser.feed(data)
            while True:
                try:
                    parsed = parser.parse(decode, encoding)
                except InvalidResponse as exc:  # fail the waiting requests, end the connection
                    self._terminated = True
                    self._fail_all(self._not_redis(exc))
                    return
                if isinstance(parsed, NotEnoughData):
                    break
                kind, value = parsed
                if kind == DataType.PUSH:
                    assert self._push_in is not None
                    await self._push_in.send(value)  # type: ignore[arg-type]
                elif requests:
                    requests.popleft()._resolve(value)

    async def _read_until(self, request: WireRequest) -> None:
        """Read and resolve replies in order until ``request`` has its own (a
        ``self_read`` connection: the awaiting task reads). What is read is parsed before
        any wait, so a cancelled wait loses no bytes; a reply that was there already
        still costs one scheduler pass (not a cancellation point: the reply is taken).
        The end of the connection fails every request still waiting and closes it
        (``invalidate``), as the reader task's end does."""
        assert self._raw is not None
        raw, parser, requests = self._raw, self._parser, self._requests
        waited = False
        while not request._done:
            try:
                parsed = parser.parse(self._decode, self._encoding)
            except InvalidResponse as exc:  # as the reader task: fail them, end it
                self._terminated = True
                self._fail_all(self._not_redis(exc))
                self.invalidate()
                break
            if not isinstance(parsed, NotEnoughData):
                kind, value = parsed
                if kind == DataType.PUSH:
                    assert self._push_in is not None
                    try:  # none expected on a dedicated connection: never waited for
                        self._push_in.send_nowait(value)  # type: ignore[arg-type]
                    except anyio.WouldBlock:
                        pass
                elif requests:
                    requests.popleft()._resolve(value)
                continue
            try:
                data = raw.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(raw)
                except trio.ClosedResourceError:  # closed by ``run`` (invalidated)
                    data = b""
                else:
                    waited = True
                    continue
            except OSError:
                data = b""
            if not data:
                self._terminated = True
                self._fail_all(RedisConnectionError("Connection lost"))
                self.invalidate()
                break
            parser.feed(data)
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def idle_alive(self) -> bool:
        """Whether the connection is usable, looking at the socket itself when its
        replies are read by their requesters and none is outstanding (nobody else would
        see that the server closed it meanwhile: Redis restarted, a ``CLIENT KILL``, an
        idle timeout). A connection found closed, failed, or holding bytes nobody asked
        for is invalidated. One non-blocking peek; otherwise the same as ``usable``."""
        raw = self._raw
        if not self._self_reading or raw is None or self._requests or not self.usable:
            return self.usable
        try:
            raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            pass
        # EOF, a reset, or bytes nobody asked for (the protocol is out of step)
        self._terminated = True
        self.invalidate()
        return False

    # -- writing -------------------------------------------------------------------------

    def _ensure_usable(self) -> None:
        if self._terminated or self._stream is None:
            raise RedisConnectionError(f"the connection to {self.location} is closed")

    def create_request(
        self,
        command: bytes,
        *args: Any,
        raise_exceptions: bool = True,
        timeout: float | None = None,
        disconnect_on_cancellation: bool = False,
        **_ignored: Any,
    ) -> WireRequest:
        """Queue ``command`` (written when the returned request is first awaited, or by a
        request queued after it) and return its request.

        ``timeout``: seconds to wait for the reply (None: forever); then the request
        answers ``TimeoutError`` (raised or returned, per ``raise_exceptions``), and a
        request with ``disconnect_on_cancellation`` closes the connection, as it does
        when the awaiting task is cancelled.

        Raises:
            coredis ConnectionError: the connection is closed.
        """
        self._ensure_usable()
        request = WireRequest(self, command, timeout, raise_exceptions, disconnect_on_cancellation)
        self._out.extend(self._packer.pack_command(command, *args))
        self._requests.append(request)
        return request

    def send_command(self, command: bytes, *args: Any) -> None:
        """Write ``command`` expecting no reply (SUBSCRIBE and friends: their
        confirmations arrive as push frames).

        Raises:
            coredis ConnectionError: the connection is closed.
        """
        self._ensure_usable()
        self._out.extend(self._packer.pack_command(command, *args))
        self._write_wanted.set()

    async def _writer(self) -> None:
        """Writes what ``send_command`` queued (requests are written by their awaiters)."""
        while True:
            await self._write_wanted.wait()
            self._write_wanted = anyio.Event()
            await self._flush()

    async def _flush(self) -> None:
        """Write everything queued; one writer at a time (a task arriving while another
        writes leaves its bytes to it). Shielded and bounded: a cancelled caller never
        leaves a partial command on the wire; a socket that takes nothing for
        ``write_timeout_s`` closes the connection."""
        if self._sending:
            return
        raw = self._raw
        if (
            raw is not None
            and self._out
            and not self._terminated
            and len(self._requests) <= _DIRECT_MAX_OUTSTANDING
        ):
            data = b"".join(self._out)
            self._out.clear()
            try:
                sent = raw.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.invalidate()
                return
            if sent == len(data):
                return
            self._out.append(data[sent:])  # the rest, through the stream
        self._sending = True
        try:
            with anyio.CancelScope(shield=True):
                while self._out and self._stream is not None and not self._terminated:
                    data = b"".join(self._out)
                    self._out.clear()
                    with anyio.move_on_after(self._write_timeout_s) as scope:
                        await self._stream.send(data)
                    if scope.cancelled_caught:
                        self.invalidate()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.invalidate()
        finally:
            self._sending = False

    @property
    async def push_messages(self) -> AsyncGenerator[list[Any], None]:
        """The push frames (pub/sub messages and confirmations) in order; ends with
        coredis's ``ConnectionError`` when the connection is lost."""
        if self._push_out is None:
            raise RedisConnectionError(f"the connection to {self.location} is not open")
        try:
            while True:
                yield await self._push_out.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise RedisConnectionError("Connection lost while waiting for push messages") from exc


async def _receive_direct(sock: socket.socket) -> bytes:
    """The next bytes on ``sock`` (only under trio), as trio's socket stream reads them (read;
    if nothing is there, wait until readable and read again; after a read that did not
    wait, one scheduler pass, so a reader with data always there cannot starve the
    loop) without the stream's wrappers around each read.

    Raises:
        anyio.EndOfStream: the peer closed the connection.
        OSError: the socket failed.
    """
    try:
        data = sock.recv(_RECEIVE_BYTES)
    except BlockingIOError:
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data = sock.recv(_RECEIVE_BYTES)
                break
            except BlockingIOError:
                continue
    else:
        await trio.lowlevel.checkpoint()  # cancelled (the connection is closing): raises
    if not data:
        raise anyio.EndOfStream
    return data


def _direct_socket(stream: anyio.abc.ByteStream) -> socket.socket | None:
    """The socket a write may go to directly (the caller runs under trio; not asyncio,
    whose transport buffers): a plain TCP or Unix socket stream's, not TLS (whose stream
    encrypts)."""
    if not isinstance(stream, anyio.abc.SocketStream):
        return None
    raw: socket.socket | None = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    return raw


__all__ = ["RedisError", "WireConnection", "WireRequest"]
