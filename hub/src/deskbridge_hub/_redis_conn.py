"""Redis connection handling for ``RedisSubstrate``: lifetime, discard on cancel, error
mapping. The commands and scripts live in ``_redis``; this module and that one are the
only ones that import coredis.

Lifecycle (what coredis 6.9 requires, read from its source). A coredis connection is
driven by reader and writer tasks, so it needs a task group that outlives each command;
here a *session* bound to the current event-loop run (an anyio ``RunVar``) owns that task
group and the connections it hosts.

* ``async with substrate:`` opens the session (no I/O: the first command connects);
  leaving closes every connection. A server holds it open for its lifetime (the app's
  ``while_serving``).
* Used without ``async with`` (scripts, CLIs, a different event-loop run than the one that
  entered it), each call opens a one-shot session and closes it before returning: correct,
  at the price of one connection per call.
* A command that is cancelled or times out discards its connection and *waits* (shielded,
  at most ``_CLOSE_WAIT_S``) until the socket is closed before the cancellation
  propagates, so no server-side waiter outlives it.

Why not coredis's own pool (``coredis.ConnectionPool``, 6.9.0 and its main branch as of
2026-11-30; reproduced by ``tests/hub/test_coredis_pool.py`` against real Redis):

1. **A cancelled blocking command leaks a pool slot.** ``Redis._execute_command`` keeps a
   blocking command's connection leased and creates its request with
   ``disconnect_on_cancellation=True``; cancelling it invalidates the connection, and
   ``ConnectionPool.release()`` then returns nothing to the pool's queue (it only puts back
   *usable* connections; the ``None`` placeholder that lets a new connection be opened is
   appended only for connections that die while idle in the queue). After
   ``max_connections`` cancelled BLPOP / XREADGROUP BLOCK calls every later command waits
   forever for a slot. The relay cancels a blocking read each time a desktop disconnects.
2. **The cancelled command's server-side waiter can take the next reply.** ``invalidate()``
   only cancels the connection's task group; the socket is closed later, when those tasks
   next run. Cancellation returns to the caller at once, so an RPUSH sent next on another
   pooled connection can reach Redis before the close and be popped by the stale BLPOP
   waiter, then lost with the socket (16 of 50 tries under trio, 50 of 50 under asyncio,
   in that test). No public coredis API waits for a connection to finish closing.

Neither is fixable by a setting; a wrapper would have to reach into the pool's private
queue and poll private connection state. So we keep coredis's *connections* (the public
``BaseConnection(location, **kwargs)``, ``run(task_status=)``, ``create_request()``,
``usable``) and host them ourselves, which lets a discard wait for the close.

Errors: connection failures, timeouts and the server states that refuse work (LOADING,
READONLY, OOM, MISCONF, BUSY, MASTERDOWN, auth failures) raise ``SubstrateUnavailable``
naming ``host:port`` (never the password). Other server errors are programming errors and
propagate unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis.connection import BaseConnection
from coredis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ReadOnlyError,
    ResponseError,
)
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.pool import ConnectionPool

from . import _metrics
from ._errors import SubstrateUnavailable

#: Server error codes that mean "cannot serve now", not "bad command".
_UNAVAILABLE_CODES = ("OOM", "MISCONF", "BUSY", "MASTERDOWN", "NOREPLICAS", "LOADING")
_UNAVAILABLE_ERRORS = (
    RedisConnectionError,
    OSError,  # includes TimeoutError
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    AuthenticationError,
    AuthorizationError,
    ReadOnlyError,
)
#: Seconds a discarded connection may take to close before we stop waiting.
_CLOSE_WAIT_S = 1.0


def _close_buffers(conn: BaseConnection) -> None:
    """coredis opens memory streams in ``BaseConnection.__init__`` and closes them only
    if ``run()`` gets as far as connecting; close them so a failed or cancelled connect
    leaves nothing open (ResourceWarning). Closing twice is harmless."""
    for value in vars(conn).values():
        if isinstance(value, MemoryObjectSendStream | MemoryObjectReceiveStream):
            value.close()


@attrs.define(eq=False)
class _Conn:
    """One coredis connection, created and run by a task of the session's task group."""

    conn: BaseConnection | None = None
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    ready: anyio.Event = attrs.Factory(anyio.Event)
    closed: anyio.Event = attrs.Factory(anyio.Event)
    error: Exception | None = None

    @property
    def usable(self) -> bool:
        return self.conn is not None and self.conn.usable

    def started(self, value: object = None) -> None:  # anyio TaskStatus, for conn.run()
        self.ready.set()

    def gone(self) -> None:
        self.closed.set()
        self.ready.set()


class _Session:
    """Connections of one event-loop run. Enter and exit in the same task.

    ``groups`` is scratch space for the command layer: users whose consumer group this
    session created or saw (it dies with the session, as the connections do)."""

    def __init__(
        self, url: str, *, connect_timeout_s: float, max_idle: int, client_name: str | None
    ) -> None:
        # Built inside the run: coredis creates anyio primitives bound to it. The pool
        # object only parses the URL (TLS, auth, db); it is never entered.
        pool = ConnectionPool.from_url(
            url, decode_responses=True, connect_timeout=connect_timeout_s, client_name=client_name
        )
        self._connection_class = pool.connection_class
        self._location = pool.location
        self._connection_kwargs = pool.connection_kwargs
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._tg = anyio.create_task_group()
        self._idle: list[_Conn] = []
        self._live: set[_Conn] = set()
        self.groups: set[str] = set()
        self.closed = False

    async def open(self) -> None:
        await self._tg.__aenter__()

    async def close(self) -> None:
        self.closed = True
        self._idle.clear()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        for c in self._live:  # hosts that never got to run (asyncio cancels before start)
            c.gone()
        self._live.clear()

    def drop_connections(self) -> None:
        """Close every connection (in-flight commands fail); new ones open on demand."""
        self._idle.clear()
        for c in list(self._live):
            c.scope.cancel()

    async def _host(self, c: _Conn) -> None:
        try:
            with c.scope:
                # The pool's connection class matches its location's kind (TCP or Unix
                # socket); coredis types the two pairs apart, so mypy cannot see it.
                c.conn = self._connection_class(self._location, **self._connection_kwargs)  # type: ignore[arg-type]
                await c.conn.run(task_status=c)
        except Exception as exc:  # never crash the session's task group
            c.error = exc
        finally:
            if c.conn is not None:
                _close_buffers(c.conn)
            self._live.discard(c)
            c.gone()

    async def _discard(self, c: _Conn) -> None:
        c.scope.cancel()
        with anyio.move_on_after(_CLOSE_WAIT_S, shield=True):
            await c.closed.wait()

    async def _acquire(self, *, idle_ok: bool) -> tuple[_Conn, bool]:
        """A connection for one exchange, and whether it was reused from the idle list."""
        while idle_ok and self._idle:
            c = self._idle.pop()
            if c.usable:
                return c, True
            c.scope.cancel()
        if self.closed:
            raise RedisConnectionError("the substrate session is closed")
        c = _Conn()
        self._live.add(c)
        self._tg.start_soon(self._host, c)
        try:
            with anyio.fail_after(self._connect_timeout_s):
                await c.ready.wait()
        except BaseException:
            await self._discard(c)
            raise
        if c.error is not None or not c.usable:
            await self._discard(c)
            raise c.error or RedisConnectionError("connection closed during the handshake")
        return c, False

    async def _exchange(
        self, c: _Conn, commands: tuple[tuple[Any, ...], ...], timeout_s: float | None
    ) -> list[Any]:
        assert c.conn is not None
        done = False
        try:
            requests = [
                c.conn.create_request(
                    cmd[0],
                    *cmd[1:],
                    raise_exceptions=False,
                    timeout=timeout_s,
                    disconnect_on_cancellation=True,
                )
                for cmd in commands
            ]
            replies = [await request for request in requests]
            done = True
            return replies
        finally:
            # A timeout or transport failure has made the connection unusable.
            if done and not self.closed and c.usable and len(self._idle) < self._max_idle:
                self._idle.append(c)
            else:
                await self._discard(c)

    async def execute(self, *commands: tuple[Any, ...], timeout_s: float | None) -> list[Any]:
        """Send ``commands`` in one write on one connection and return their replies; an
        error (a server error reply, a transport failure, a ``timeout_s`` timeout; None:
        no timeout) is returned as its exception instance. Cancellation, a timeout or a
        transport failure closes the connection, and waits for the close. If an idle
        connection turns out to have died meanwhile (Redis restarted, idle connections
        killed), the commands are sent once more on a new connection."""
        c, reused = await self._acquire(idle_ok=True)
        replies = await self._exchange(c, commands, timeout_s)
        if reused and not c.usable and any(isinstance(r, RedisConnectionError) for r in replies):
            c, _ = await self._acquire(idle_ok=False)
            replies = await self._exchange(c, commands, timeout_s)
        return replies


class RedisConnections:
    """The connections of one ``RedisSubstrate``: one session per event-loop run.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS) or
            ``unix://path``. Only ``host:port`` ever appears in messages.
        connect_timeout_s: seconds to open a connection (TCP + TLS + HELLO) before the
            call raises SubstrateUnavailable; short so callers learn "unavailable" fast.
        command_timeout_s: seconds a reply may take beyond a command's own blocking time
            before the connection is presumed dead (SubstrateUnavailable).
        max_idle_connections: idle connections kept per open session.
        client_name: sent with CLIENT SETNAME on every connection (``CLIENT LIST`` shows
            it), or None.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float,
        command_timeout_s: float,
        max_idle_connections: int,
        client_name: str | None,
    ) -> None:
        self._url = url
        self._client_name = client_name
        self._connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._max_idle = max_idle_connections
        self._session_var: anyio.lowlevel.RunVar[_Session | None] = anyio.lowlevel.RunVar(
            f"deskbridge-redis-session-{id(self)}", default=None
        )
        parts = urlsplit(url)
        if parts.scheme == "unix":
            self.address = parts.path
        else:
            self.address = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"

    async def enter(self, owner: object) -> None:
        """Open a session for this event-loop run (no I/O yet).

        Raises:
            RuntimeError: a session is already open in this run.
        """
        if self._session_var.get() is not None:
            raise RuntimeError(f"{owner!r} is already open in this event loop")
        session = self._new_session()
        await session.open()
        self._session_var.set(session)

    async def exit(self) -> None:
        """Close the session's connections; waits for them (cancellation cannot stop it)."""
        session = self._session_var.get()
        self._session_var.set(None)
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        """Close the connections this event-loop run holds; later calls open new ones.
        Idempotent; never raises."""
        session = self._session_var.get()
        if session is not None:
            session.drop_connections()
        await anyio.lowlevel.checkpoint()

    def _new_session(self) -> _Session:
        return _Session(
            self._url,
            connect_timeout_s=self._connect_timeout_s,
            max_idle=self._max_idle,
            client_name=self._client_name,
        )

    @contextlib.asynccontextmanager
    async def session(self, what: str) -> AsyncIterator[_Session]:
        """The open session of this run, or a one-shot one; maps I/O faults at the edge
        (``what`` names the command in the SubstrateUnavailable message)."""
        with self.mapped(what):
            session = self._session_var.get()
            if session is not None and not session.closed:
                yield session
                return
            session = self._new_session()
            await session.open()
            try:
                yield session
            finally:
                await session.close()

    @contextlib.contextmanager
    def mapped(self, what: str) -> Iterator[None]:
        """Raise SubstrateUnavailable for I/O faults and refusing server states."""
        try:
            yield
        except _UNAVAILABLE_ERRORS as exc:
            _metrics.substrate_error(what)
            raise SubstrateUnavailable(
                f"Redis at {self.address} unavailable ({what}): {exc}"
            ) from exc
        except ResponseError as exc:
            if str(exc).split(" ", 1)[0] in _UNAVAILABLE_CODES:
                _metrics.substrate_error(what)
                raise SubstrateUnavailable(
                    f"Redis at {self.address} refused {what}: {exc}"
                ) from exc
            raise

    async def call(self, session: _Session, *command: Any, block_s: float | None = 0.0) -> Any:
        """One command; server errors raise. ``block_s``: its own blocking time (None:
        forever), to which the command timeout is added."""
        timeout_s = None if block_s is None else block_s + self.command_timeout_s
        (reply,) = await session.execute(command, timeout_s=timeout_s)
        if isinstance(reply, BaseException):
            raise reply
        return reply
