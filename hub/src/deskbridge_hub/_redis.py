"""``RedisSubstrate``: the substrate contract on Redis >= 7, through coredis: the
commands and scripts. Connection handling (lifetime per event-loop run, discard on
cancel, error mapping, and why coredis's own pool is not used) is ``_redis_conn``.

anyio APIs only, so it runs under trio and asyncio. ``async with substrate:`` keeps
connections for the block's duration; without it each call uses its own connection
(see ``_redis_conn``). ``aclose()`` closes the current run's connections; the instance
stays usable.

Durations: presence and result TTLs are sent in milliseconds (``PX`` / ``PEXPIRE``,
rounded up, at least 1 ms); BLPOP takes seconds with millisecond precision.

Errors: connection failures, timeouts and the server states that refuse work (LOADING,
READONLY, OOM, MISCONF, BUSY, MASTERDOWN, auth failures) raise ``SubstrateUnavailable``
naming ``host:port`` (never the password). Other server errors are programming errors and
propagate unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from coredis.exceptions import (
    StreamDuplicateConsumerGroupError,
)

from ._directory import RedisDirectory
from ._errors import SubstrateUnavailable
from ._mcp_store import RedisMcpSessions
from ._redis_caller import CallerCommands, RedisClock
from ._redis_cluster import is_cluster_url
from ._redis_conn import RedisConnections
from ._redis_desktop import DesktopCommands
from ._redis_finish import FinishCommands
from ._redis_health import Health
from ._redis_jobs import JobCommands
from ._redis_presence import PresenceCommands
from ._redis_pubsub import DEFAULT_BUFFER, Subscription
from ._redis_session import DEFAULT_MAX_CONNECTIONS, ConnectionStatistics, _Session
from ._redis_streams import StreamCommands
from ._revocation import RedisRevocations
from ._substrate import (
    GROUP,
    jobs_key,
)


class RedisSubstrate(
    PresenceCommands,
    StreamCommands,
    JobCommands,
    CallerCommands,
    FinishCommands,
    DesktopCommands,
    RedisDirectory,
    RedisRevocations,
    RedisMcpSessions,
):
    """The substrate contract on Redis >= 7 (streams, consumer groups, XAUTOCLAIM).

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS) or
            ``unix://path``. Only ``host:port`` ever appears in messages.
        connect_timeout_s: seconds to open a connection (TCP + TLS + HELLO) before the
            call raises SubstrateUnavailable; short so callers learn "unavailable" fast.
        command_timeout_s: seconds a reply may take beyond a command's own blocking time
            before the connection is presumed dead (SubstrateUnavailable).
        health_interval_s: seconds between health probes while entered (role,
            eviction policy, a scripted write; see ``_redis_health``), the first at
            entry; None (default): none in the background.
        max_connections: most Redis connections held at once per event-loop run
            (``DESKBRIDGE_REDIS_MAX_CONNECTIONS``, default 16, at least 3): non-blocking
            commands share a few, blocking ones get dedicated ones, pub/sub one.
        client_name: sent with CLIENT SETNAME on every connection (``CLIENT LIST`` shows
            it), or None.

    No I/O happens until the first command. See the module docstring for the lifecycle:
    ``async with`` keeps connections for the block's duration; without it each call
    uses its own connection. ``aclose()`` is idempotent.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 2.0,
        command_timeout_s: float = 5.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        client_name: str | None = None,
        health_interval_s: float | None = None,
    ) -> None:
        self._connections = RedisConnections(
            url,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            max_connections=max_connections,
            client_name=client_name,
            health_interval_s=health_interval_s,
        )
        self._command_timeout_s = command_timeout_s
        self._cluster = is_cluster_url(url)
        self.address = self._connections.address
        self._redis_clock = RedisClock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisSubstrate:
        """Same as the constructor (``options`` as its keyword arguments); no I/O."""
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RedisSubstrate<{self.address}>"

    async def __aenter__(self) -> RedisSubstrate:
        """Open a session for this event-loop run (no I/O yet).

        Raises:
            RuntimeError: a session is already open in this run.
        """
        await self._connections.enter(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the session's connections; waits for them (cancellation cannot stop it)."""
        await self._connections.exit()

    async def aclose(self) -> None:
        """Close the connections this event-loop run holds; later calls open new ones.
        Idempotent; never raises."""
        await self._connections.aclose()

    def history_changes(self) -> int:
        """Probes that found another replication history (``master_replid``) than the
        one before: a failover or a restart without persistence (``_redis_health``).
        Under Cluster, 0 (each node's history is its own)."""
        return self._connections.monitor.history_changes

    def statistics(self) -> ConnectionStatistics | None:
        """Connections held by this event-loop run's open session (``async with``), or
        None when it is not open: see :class:`ConnectionStatistics`."""
        return self._connections.statistics()

    @contextlib.asynccontextmanager
    async def subscribe(
        self, channel: str, *, pattern: bool = False, buffer: int = DEFAULT_BUFFER
    ) -> AsyncIterator[Subscription]:
        """Subscribe to a pub/sub ``channel`` (a glob pattern if ``pattern``) for the
        block's duration, on the one subscriber connection of this process (per
        event-loop run); ``async for message in subscription`` yields ``Message``.

        Entering returns once Redis confirmed the subscription: anything published
        after that is delivered. Pub/sub is at most once: ``Message.data is None`` is a
        gap (reconnected, or the consumer fell ``buffer`` messages behind); re-read the
        durable state then. See ``_redis_pubsub``.

        Raises:
            SubstrateUnavailable: no subscriber connection or no confirmation in time.

        Cancellation: leaving the block unsubscribes (when no other local subscription
        to ``channel`` remains) without waiting for Redis.
        """
        async with (
            self._connections.session("SUBSCRIBE", map_errors=False) as s,
            contextlib.AsyncExitStack() as stack,
        ):
            with self._connections.mapped("SUBSCRIBE"):
                subscribing = s.subscriber.subscribe(channel, pattern=pattern, buffer=buffer)
                subscription = await stack.enter_async_context(subscribing)
            yield subscription

    async def publish(self, channel: str, message: str) -> int:
        """PUBLISH ``message`` on ``channel``.

        Returns:
            How many subscribers (connections) received it.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("PUBLISH") as s:
            return int(await self._call(s, b"PUBLISH", channel, message))

    # -- plumbing (the interface every command uses) -----------------------------------

    def _session(self, what: str) -> contextlib.AbstractAsyncContextManager[_Session]:
        """``async with self._session("WHAT") as s:`` the open session of this run, or a
        one-shot one; I/O faults inside map to SubstrateUnavailable naming ``what``.
        ``s.execute(*commands, timeout_s=...)`` pipelines commands on one connection."""
        return self._connections.session(what)

    def _outage(self, what: str, exc: BaseException) -> SubstrateUnavailable | None:
        return self._connections.map_error(what, exc)

    def _refuses_work(self, what: str) -> SubstrateUnavailable | None:
        return self._connections.refuses_work(what)

    def _refuses_view(self, view: str, what: str) -> SubstrateUnavailable | None:
        return self._connections.refuses_view(view, what)

    async def _call(self, session: _Session, *command: Any, block_s: float | None = 0.0) -> Any:
        """One command; server errors raise. ``block_s``: its own blocking time (None:
        forever), to which the command timeout is added."""
        return await self._connections.call(session, *command, block_s=block_s)

    async def _heal_group(self, session: _Session, user_id: str) -> None:
        """XGROUP CREATE key GROUP 0 MKSTREAM (from 0: nothing enqueued since is skipped)."""
        try:
            await self._call(session, b"XGROUP CREATE", jobs_key(user_id), GROUP, "0", b"MKSTREAM")
        except StreamDuplicateConsumerGroupError:
            pass
        session.groups.add(user_id)

    async def ping(self) -> None:
        """PING, and the verdict of the last health probe (readiness).

        Raises:
            SubstrateUnavailable: Redis unreachable or still loading its data set, or the
                last probe found it unable to serve the hub (evicting policy, replica,
                writes or scripts refused, missing ACL permission): the message names
                the cause. Probes run only when ``health_interval_s`` is set and the
                substrate is entered (``_redis_health``).
        """
        async with self._session("PING") as s:
            await self._call(s, b"PING")
        refused = self._connections.unusable("the hub")
        if refused is not None:
            raise refused

    def _absent_proves_nothing(self, what: str) -> None:
        """Raise SubstrateUnavailable while the last probe found Redis unable to serve
        the hub: a missing ``what`` then does not mean "never written" or "expired" (it
        may have been evicted, or its holder's writes refused), so "offline" or "unknown"
        would be a guess (issue 11 item 1)."""
        refused = self._connections.unusable(f"a {what} read")
        if refused is not None:
            raise refused

    def health_warnings(self) -> tuple[str, ...]:
        """What the last health probe found that does not stop calls but stops an
        operator view: commands only those views send, refused by the ACL (each with
        its grant). Empty when there is none, or before the first probe."""
        cause = self._connections.monitor.views_refused()
        return () if cause is None else (cause,)

    async def health_check(self) -> Health | None:
        """Probe now (``_redis_health``): role, eviction policy, AOF, a scripted write.

        Returns:
            The Health found (``health.causes`` empty when usable), or None when Redis
            could not be reached. Logs a line when the verdict changes.
        """
        return await self._connections.monitor.check()
