"""One event-loop run's Redis connections (the *session* of ``_redis_conn``): coredis
connections hosted in the session's task group, shared ones for non-blocking commands
(pipelined), dedicated ones for blocking commands, and the pub/sub subscriber.

How the bound is spent (``max_connections`` = M, at least 3): 2 shared (1 when M < 8),
1 reserved for the pub/sub subscriber (opened on the first subscription), the rest
(M - 3 by default: 13) dedicated to blocking commands. A blocking command that finds
every dedicated connection busy waits for one; if it has a non-blocking form (BLPOP ->
LPOP, XREADGROUP without BLOCK) it waits only ``_SLOT_PATIENCE_S`` and then polls that
form on a shared connection, backing off 10 ms -> 250 ms and taking a dedicated
connection for the rest of its block time as soon as one is free. So many concurrent
blocking waiters can never deadlock the bounded set (a result nobody can read because
every connection waits for a result), and nothing opens beyond the bound; polling costs
commands only while more blocking commands run than there are dedicated connections.
Blocking commands are recognised from the command itself (``_redis_blocking``).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import attrs
from coredis.connection import TCPLocation, UnixDomainSocketLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import ReadOnlyError, ResponseError, UnblockedError
from coredis.pool import ConnectionPool

from ._redis_blocking import block_s, poll_form, poll_reply, with_block_s
from ._redis_pubsub import Subscriber
from ._redis_resend import resend_safe
from ._redis_wire import WireConnection

#: Seconds a discarded connection may take to close before we stop waiting.
_CLOSE_WAIT_S = 1.0
#: Default bound on the connections one hub process holds (issue 10: 16 or fewer).
DEFAULT_MAX_CONNECTIONS = 16
#: One shared, one dedicated for blocking commands, one subscriber.
MIN_CONNECTIONS = 3
#: Seconds a pollable blocking command waits for a dedicated connection before polling.
_SLOT_PATIENCE_S = 0.05
#: First and longest pause (seconds) between polls; doubles in between. 10 ms keeps a
#: result's extra latency small; 250 ms caps one poller at 4 commands a second.
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.25
#: A connection open at least this long (seconds) that answers READONLY (or MASTERDOWN:
#: a replica that does not serve stale data) is closed once its commands in flight are
#: answered, and the next command opens a new one. Either says it reached a replica:
#: the primary was demoted under it (a failover). A URL naming
#: an endpoint that follows the primary (a DNS name or virtual IP that Sentinel or a
#: managed service moves, a TCP proxy) then reaches the new primary; kept, the hub's
#: connections stayed on the old node and it answered ``unavailable`` until restarted
#: (tests/chaos/test_redis_failover.py). With a URL naming the demoted node itself it
#: reaches that node again: at most one new connection per connection and second.
#: The pub/sub subscriber's connection went through the same endpoint to the same node,
#: and a subscriber is never told READONLY (it sends no writes): it is reopened too when
#: a command connection finds a replica (kept, it heard only what the demoted node
#: replicates, nothing at all while that node has no link to the new primary).
_REOPEN_ON_READONLY_AFTER_S = 1.0
#: What Redis says (after ``-UNBLOCKED``) to a command blocked on a primary that is made
#: a replica (``REPLICAOF``: a failover, by Sentinel or by hand); Redis 7's
#: ``disconnectAllBlockedClients``. The stream read's other UNBLOCKED (its stream
#: deleted) is not a demotion.
_DEMOTED_UNBLOCKED = "instance state changed"


@attrs.define(eq=False)
class _Conn:
    """One coredis connection, created and run by a task of the session's task group."""

    conn: WireConnection | None = None
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    ready: anyio.Event = attrs.Factory(anyio.Event)
    closed: anyio.Event = attrs.Factory(anyio.Event)
    error: Exception | None = None
    #: Requests written and not yet answered (shared connections: the load to balance).
    in_flight: int = 0
    #: Exchanges completed on it (0: fresh, so a failure cannot be a stale socket).
    used: int = 0
    #: A PING is checking whether it is alive (a command on it timed out).
    probing: bool = False
    #: When it was opened (``anyio.current_time()``).
    opened_at: float = 0.0

    @property
    def usable(self) -> bool:
        return self.conn is not None and self.conn.usable

    def idle_alive(self) -> bool:
        """``usable``, and for a dedicated connection (its replies read by their
        requesters: no reader task sees its end) not closed by the server while idle."""
        return self.conn is not None and self.conn.idle_alive()

    def started(self, value: object = None) -> None:  # anyio TaskStatus, for conn.run()
        self.ready.set()

    def gone(self) -> None:
        self.closed.set()
        self.ready.set()


@attrs.frozen
class ConnectionStatistics:
    """What one session holds (``RedisSubstrate.statistics()``).

    Attributes:
        max_connections: the bound on connections held at once.
        opened_total: connections opened since the session started.
        shared: open connections that non-blocking commands share (pipelined).
        blocking: open dedicated connections for blocking commands (idle or busy).
        blocking_busy: dedicated connections carrying a blocking command now.
        blocking_waiting: blocking commands waiting for a dedicated connection.
        subscriber: 1 while the pub/sub connection is open, else 0.
        polls_total: polls sent for blocking commands that found every dedicated
            connection busy (see ``_redis_conn``).
    """

    max_connections: int
    opened_total: int
    shared: int
    blocking: int
    blocking_busy: int
    blocking_waiting: int
    subscriber: int
    polls_total: int


class _Session:
    """Connections of one event-loop run. Enter and exit in the same task.

    ``groups`` is scratch space for the command layer: users whose consumer group this
    session created or saw (it dies with the session, as the connections do)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float,
        command_timeout_s: float,
        max_connections: int,
        client_name: str | None,
    ) -> None:
        # Built inside the run: coredis creates anyio primitives bound to it. The pool
        # object only parses the URL (TLS, auth, db); it is never entered.
        pool = ConnectionPool.from_url(
            url,
            decode_components=True,
            decode_responses=True,
            connect_timeout=connect_timeout_s,
            client_name=client_name,
        )
        if not isinstance(pool.location, TCPLocation | UnixDomainSocketLocation):
            raise ValueError(f"{url!r}: not a Redis server location")
        self._location: TCPLocation | UnixDomainSocketLocation = pool.location
        self._connection_kwargs = pool.connection_kwargs
        self.connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self.max_connections = max_connections
        self._shared_cap, self._blocking_cap = _split(max_connections)
        self._tg = anyio.create_task_group()
        self._live: set[_Conn] = set()
        self._shared: list[_Conn] = []
        self._shared_lock = anyio.Lock()
        self._blocking_idle: list[_Conn] = []
        self._blocking_open = 0  # dedicated connections open or opening
        self._blocking_busy = 0
        self._blocking_waiters: deque[anyio.Event] = deque()
        self._opened_total = 0
        self._polls_total = 0
        self.subscriber = Subscriber(self, command_timeout_s)
        self.groups: set[str] = set()
        self.closed = False
        #: Called when a connection that had served is replaced, with why: ``dead``
        #: (found closed: Redis restarted, a CLIENT KILL, a failover may have happened),
        #: ``replica`` (answered READONLY / MASTERDOWN) or ``demoted`` (a blocked
        #: command ended by the demotion). ``_redis_conn`` counts it and probes Redis
        #: then (its replication history).
        self.on_reconnect: Callable[[str], None] | None = None

    async def open(self) -> None:
        await self._tg.__aenter__()

    async def close(self) -> None:
        self.closed = True
        self._shared.clear()
        self._blocking_idle.clear()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        for c in self._live:  # hosts that never got to run (asyncio cancels before start)
            c.gone()
        self._live.clear()

    def drop_connections(self) -> None:
        """Close every connection (in-flight commands fail); new ones open on demand."""
        self._shared.clear()
        self._blocking_idle.clear()
        for c in list(self._live):
            c.scope.cancel()

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            max_connections=self.max_connections,
            opened_total=self._opened_total,
            shared=len(self._shared),
            blocking=self._blocking_open,
            blocking_busy=self._blocking_busy,
            blocking_waiting=len(self._blocking_waiters),
            subscriber=int(self.subscriber.connected),
            polls_total=self._polls_total,
        )

    def start_soon(self, fn: Callable[[], Coroutine[object, object, None]]) -> None:
        """Run ``fn`` in the session's task group (cancelled when the session closes)."""
        self._tg.start_soon(fn)

    # -- opening and closing one connection ------------------------------------------

    async def _host(self, c: _Conn, dedicated: bool = False) -> None:
        try:
            with c.scope:
                c.conn = WireConnection(
                    self._location, self_read=dedicated, **self._connection_kwargs
                )
                await c.conn.run(task_status=c)
        except Exception as exc:  # never crash the session's task group
            c.error = exc
        finally:
            self._live.discard(c)
            c.gone()

    async def discard(self, c: _Conn) -> None:
        """Close ``c`` and wait (shielded, at most ``_CLOSE_WAIT_S``) until it is closed."""
        c.scope.cancel()
        with anyio.move_on_after(_CLOSE_WAIT_S, shield=True):
            await c.closed.wait()

    async def connect(self, *, dedicated: bool = False) -> _Conn:
        """Open one connection (TCP, TLS, HELLO, AUTH, SELECT, CLIENT SETNAME);
        ``dedicated``: for blocking commands, one request at a time, whose replies the
        awaiting task reads itself (``WireConnection``'s ``self_read``).

        Raises:
            TimeoutError: not ready within ``connect_timeout_s``.
            coredis ConnectionError / AuthenticationError / ...: refused.
        """
        if self.closed:
            raise RedisConnectionError("the substrate session is closed")
        c = _Conn()
        self._live.add(c)
        self._tg.start_soon(self._host, c, dedicated)
        try:
            with anyio.fail_after(self.connect_timeout_s):
                await c.ready.wait()
        except BaseException:
            await self.discard(c)
            raise
        if c.error is not None or not c.usable:
            await self.discard(c)
            raise c.error or RedisConnectionError("connection closed during the handshake")
        self._opened_total += 1
        c.opened_at = anyio.current_time()
        return c

    # -- commands ----------------------------------------------------------------------

    async def execute(
        self, *commands: tuple[Any, ...], timeout_s: float | None, resend: bool | None = None
    ) -> list[Any]:
        """Send ``commands`` in one write on one connection and return their replies; an
        error (a server error reply, a transport failure, a ``timeout_s`` timeout; None:
        no timeout) is returned as its exception instance.

        Non-blocking commands share a connection with other tasks' commands (pipelined;
        ``commands`` stay contiguous, so MULTI ... EXEC is safe). A batch holding a
        blocking command (BLPOP, XREADGROUP ... BLOCK, ...) gets a dedicated connection;
        when all are busy it waits for one, or polls (see the module docstring).

        Cancellation: a non-blocking batch leaves its connection in place (coredis
        consumes the replies); a blocking one closes its connection and waits for the
        close, so no server-side waiter outlives it. A timeout or transport failure
        closes the connection. If a connection that had served earlier commands turns
        out to have died meanwhile (Redis restarted, idle connections killed), the
        commands are sent once more on a new connection, but only when running them
        twice is harmless: Redis may have run them and lost only the reply. ``resend``
        says so (True / False); None: the command table of ``_redis_resend`` decides.
        Otherwise the lost connection's error is their reply."""
        if any(block_s(command) is not False for command in commands):
            return await self._execute_blocking(commands, timeout_s, resend)
        c, reused = await self._shared_connection()
        replies = await self._exchange_shared(c, commands, timeout_s)
        if reused and _died(c, replies):
            if c in self._shared:  # counted here, not again by ``_least_loaded``
                self._shared.remove(c)
                c.scope.cancel()
            self._reconnected("dead")
            if not (resend_safe(commands) if resend is None else resend):
                return replies
            c, _ = await self._shared_connection()
            replies = await self._exchange_shared(c, commands, timeout_s)
        if _on_replica(c, replies) and c in self._shared:
            self._shared.remove(c)  # no new commands on it; closed once they are answered
            self.start_soon(functools.partial(self._retire, c))
            self.subscriber.reopen_if_older(_REOPEN_ON_READONLY_AFTER_S)
            self._reconnected("replica")
        return replies

    def _reconnected(self, why: str) -> None:
        if self.on_reconnect is not None:
            self.on_reconnect(why)

    async def _retire(self, c: _Conn) -> None:
        """Close ``c`` once its commands in flight are answered (at most the command
        timeout from now)."""
        with anyio.move_on_after(self._command_timeout_s):
            while c.in_flight and c.usable:  # noqa: ASYNC110 - a counter, no event to wait on
                await anyio.sleep(0.01)
        c.scope.cancel()

    async def _shared_connection(self) -> tuple[_Conn, bool]:
        c = self._least_loaded()
        if c is not None and (c.in_flight == 0 or len(self._shared) >= self._shared_cap):
            return c, c.used > 0 and c.in_flight == 0
        async with self._shared_lock:  # one opener at a time; the others reuse its result
            c = self._least_loaded()
            if c is not None and (c.in_flight == 0 or len(self._shared) >= self._shared_cap):
                return c, c.used > 0 and c.in_flight == 0
            c = await self.connect()
            self._shared.append(c)
            return c, False

    def _least_loaded(self) -> _Conn | None:
        for dead in [c for c in self._shared if not c.usable]:
            self._shared.remove(dead)
            dead.scope.cancel()
            if dead.used:
                self._reconnected("dead")  # closed by the server or the path, not by us
        return min(self._shared, key=lambda c: c.in_flight, default=None)

    async def _exchange_shared(
        self, c: _Conn, commands: tuple[tuple[Any, ...], ...], timeout_s: float | None
    ) -> list[Any]:
        assert c.conn is not None
        requests = [
            c.conn.create_request(cmd[0], *cmd[1:], raise_exceptions=False, timeout=timeout_s)
            for cmd in commands
        ]
        c.in_flight += len(requests)
        try:
            replies = [await request for request in requests]
        finally:
            c.in_flight -= len(requests)
        c.used += 1
        if not c.probing and any(isinstance(r, TimeoutError) for r in replies):
            # This batch fails; whether the connection is dead is a PING's to say. A
            # timeout alone is no proof: on a saturated event loop (thousands of
            # handshakes at once, issue 10) replies sit unread past the timeout, and
            # dropping the live shared connection failed every handshake and heartbeat
            # in flight on it, which fed the overload.
            c.probing = True
            self.start_soon(functools.partial(self._probe_shared, c))
        return replies

    async def _probe_shared(self, c: _Conn) -> None:
        """PING ``c`` (a command on it timed out); close it unless it answers within the
        command timeout. Other commands go on using it meanwhile."""
        reply: Any = None
        if c.conn is not None and c.usable:
            c.in_flight += 1
            try:  # never raises: this task runs in the session's task group
                reply = await c.conn.create_request(
                    b"PING", raise_exceptions=False, timeout=self._command_timeout_s
                )
            except Exception as exc:  # noqa: BLE001 - any failure means "not alive"
                reply = exc  # (a connection closed meanwhile raises ClosedResourceError)
            finally:
                c.in_flight -= 1
        c.probing = False
        if isinstance(reply, BaseException) or not c.usable:
            c.scope.cancel()  # no answer to a PING either: presumed dead
            if c in self._shared:
                self._shared.remove(c)

    async def _execute_blocking(
        self, commands: tuple[tuple[Any, ...], ...], timeout_s: float | None, resend: bool | None
    ) -> list[Any]:
        polled = len(commands) == 1 and poll_form(commands[0]) is not None
        got = await self._dedicated(_SLOT_PATIENCE_S if polled else None)
        if got is None:
            return [await self._poll(commands[0], timeout_s)]
        c, reused = got
        sent_at = anyio.current_time()
        replies = await self._exchange_dedicated(c, commands, timeout_s)
        if reused and _died(c, replies):
            self._reconnected("dead")
            if not (resend_safe(commands) if resend is None else resend):
                return replies  # a pop may have taken items: its caller's recovery runs
            c, _ = await self._dedicated(None)  # type: ignore[misc]
            sent_at = anyio.current_time()
            replies = await self._exchange_dedicated(c, commands, timeout_s)
        if len(commands) == 1 and _demoted(replies):
            # Ended unanswered by the node's demotion: nothing was popped or read, so it
            # is sent once more, for the time it has left, on a new connection (the
            # idle ones reached the same node and were closed), which an endpoint that
            # follows the primary takes to the new one. Reaching the demoted node again
            # (a URL naming it), it is answered READONLY at once.
            again = _time_left(commands[0], timeout_s, anyio.current_time() - sent_at)
            if again is not None:
                command, timeout_s = again
                c, _ = await self._dedicated(None)  # type: ignore[misc]
                replies = await self._exchange_dedicated(c, (command,), timeout_s)
        return replies

    async def _dedicated(self, patience_s: float | None) -> tuple[_Conn, bool] | None:
        """A dedicated connection and whether it served before, or None when none came
        free within ``patience_s`` of waiting (None: wait as long as it takes). Opening
        a connection is bounded by the connect timeout, not by the patience."""
        deadline = math.inf if patience_s is None else anyio.current_time() + patience_s
        while True:
            got = await self._dedicated_nowait()
            if got is not None:
                return got
            waiter = anyio.Event()
            self._blocking_waiters.append(waiter)
            try:
                with anyio.move_on_after(deadline - anyio.current_time()):
                    await waiter.wait()
            finally:
                if not waiter.is_set():
                    self._blocking_waiters.remove(waiter)
            if not waiter.is_set():
                return None

    async def _dedicated_nowait(self) -> tuple[_Conn, bool] | None:
        while self._blocking_idle:
            c = self._blocking_idle.pop()
            if c.idle_alive():
                self._blocking_busy += 1
                return c, True
            c.scope.cancel()
            self._blocking_open -= 1
            self._reconnected("dead")  # closed while idle: by the server or the path
        if self._blocking_open >= self._blocking_cap:
            return None
        self._blocking_open += 1
        try:
            c = await self.connect(dedicated=True)
        except BaseException:
            self._blocking_open -= 1
            self._wake_one()
            raise
        self._blocking_busy += 1
        return c, False

    def _wake_one(self) -> None:
        if self._blocking_waiters:
            self._blocking_waiters.popleft().set()

    async def _exchange_dedicated(
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
            done = not _on_replica(c, replies)  # else closed: see _REOPEN_ON_READONLY_AFTER_S
            if _demoted(replies):
                done = False
                self._leave_demoted_node()
            elif not done:
                self.subscriber.reopen_if_older(_REOPEN_ON_READONLY_AFTER_S)
                self._reconnected("replica")
            c.used += 1
            return replies
        finally:
            self._blocking_busy -= 1
            # A timeout or transport failure has made the connection unusable.
            if done and not self.closed and c.usable:
                self._blocking_idle.append(c)
            else:
                await self.discard(c)
                self._blocking_open -= 1
            self._wake_one()

    def _leave_demoted_node(self) -> None:
        """A blocked command was told the node it reached is a replica now
        (``_DEMOTED_UNBLOCKED``): every connection open now reached that node. The
        shared ones are retired (closed once their commands in flight are answered),
        the idle dedicated ones closed, the subscriber reopened, and the health probe
        runs (``on_reconnect``); new connections go through the URL's endpoint. Kept,
        the blocking connection answered the next wait READONLY (the holder's
        deliveries waited for two failures' back-off), the shared ones the next write
        of each (a caller told ``unavailable``). A demotion ends each blocked command
        once, so this cannot loop, whatever the URL names; no age rule is needed."""
        for c in self._shared:
            self.start_soon(functools.partial(self._retire, c))
        self._shared.clear()
        idle, self._blocking_idle = self._blocking_idle, []
        for c in idle:  # no command on them: nothing to wait for
            c.scope.cancel()
            self._blocking_open -= 1
            self._wake_one()
        self.subscriber.reopen_if_older(0.0)
        self._reconnected("demoted")

    async def _poll(self, command: tuple[Any, ...], timeout_s: float | None) -> Any:
        """Answer a blocking ``command`` without a dedicated connection: send its
        non-blocking form on a shared connection until it has an answer or the block
        time is over, backing off ``_POLL_FIRST_S`` -> ``_POLL_MAX_S``; switch to a
        dedicated connection (for the time left) as soon as one is free."""
        block = block_s(command)
        assert block is not False
        deadline = math.inf if block is None else anyio.current_time() + block
        form = poll_form(command)
        assert form is not None
        pause_s = _POLL_FIRST_S
        while True:
            self._polls_total += 1
            (reply,) = await self.execute(form, timeout_s=self._command_timeout_s)
            if isinstance(reply, BaseException) or reply:
                return poll_reply(command, reply)
            left_s = deadline - anyio.current_time()
            if left_s <= 0:
                return None
            got = await self._dedicated(min(pause_s, left_s))
            if got is not None:
                c, _ = got
                left_s = deadline - anyio.current_time()
                if left_s <= 0:  # no time left to block: give the connection back
                    self._blocking_busy -= 1
                    self._blocking_idle.append(c)
                    self._wake_one()
                    continue
                again = command if block is None else with_block_s(command, left_s)
                timeout = None if block is None else left_s + self._command_timeout_s
                (reply,) = await self._exchange_dedicated(c, (again,), timeout)
                return reply
            pause_s = min(pause_s * 2, _POLL_MAX_S)


def _split(max_connections: int) -> tuple[int, int]:
    """``max_connections`` -> (shared, dedicated-for-blocking); one more is reserved for
    the pub/sub subscriber, opened only when something subscribes."""
    if max_connections < MIN_CONNECTIONS:
        raise ValueError(f"max_connections must be >= {MIN_CONNECTIONS}, got {max_connections}")
    shared = 2 if max_connections >= 8 else 1
    return shared, max_connections - shared - 1


def _on_replica(c: _Conn, replies: list[Any]) -> bool:
    """``c`` answered READONLY or MASTERDOWN (it reached a replica) and is old enough to
    be opened again (``_REOPEN_ON_READONLY_AFTER_S``)."""
    for r in replies:  # the replies first: an error among them is rare, the clock not free
        if isinstance(r, ReadOnlyError) or (
            isinstance(r, ResponseError) and str(r).startswith("MASTERDOWN")
        ):
            return anyio.current_time() - c.opened_at >= _REOPEN_ON_READONLY_AFTER_S
    return False


def _demoted(replies: list[Any]) -> bool:
    """A blocked command was ended by its node's demotion to a replica."""
    return any(isinstance(r, UnblockedError) and _DEMOTED_UNBLOCKED in str(r) for r in replies)


def _time_left(
    command: tuple[Any, ...], timeout_s: float | None, spent_s: float
) -> tuple[tuple[Any, ...], float | None] | None:
    """``command`` and its reply timeout for what is left of its block time once
    ``spent_s`` seconds of it went, or None when nothing useful is left (under 10 ms)."""
    block = block_s(command)
    if block is None or block is False:  # forever (or not blocking): as it was
        return command, timeout_s
    left_s = block - spent_s
    if left_s < 0.01:
        return None
    return with_block_s(command, left_s), None if timeout_s is None else timeout_s - spent_s


def _died(c: _Conn, replies: list[Any]) -> bool:
    return not c.usable and any(isinstance(r, RedisConnectionError) for r in replies)
