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
import hashlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from coredis.exceptions import (
    NoScriptError,
    ResponseError,
    StreamConsumerGroupError,
    StreamDuplicateConsumerGroupError,
    UnblockedError,
)

from ._directory import RedisDirectory
from ._inspection import PendingEntry, QueueInfo
from ._jobstate import JobState
from ._redis_caller import CallerCommands, Script
from ._redis_conn import RedisConnections
from ._redis_health import Health
from ._redis_pubsub import DEFAULT_BUFFER, Subscription
from ._redis_session import DEFAULT_MAX_CONNECTIONS, ConnectionStatistics, _Session
from ._substrate import (
    GROUP,
    Beat,
    BeatReply,
    Claimed,
    Entry,
    Marked,
    cancel_key,
    index_key,
    jobs_key,
    presence_key,
    proc_key,
    progress_key,
    result_key,
    state_key,
    tools_key,
    wake_key,
)

#: Lua: delete the presence key only while it still holds this session (atomic).
_CLEAR_IF_HOLDER = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: Refresh presence only while it is absent or ours (a heartbeat never steals it back).
_REFRESH_IF_HOLDER = (
    "local v = redis.call('GET', KEYS[1]) "
    "if v == false or v == ARGV[1] then "
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end return 0"
)
#: XADD and index the entry ID -> job id in one atomic step (keys share the {user} slot).
#: With ARGV[3] (milliseconds to start within) the deadline and enqueue time are taken
#: from the server's clock (TIME), so every replica compares them on that one clock.
_XADD_INDEXED = """
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
if ARGV[3] ~= '' then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  fields[#fields + 1] = 'deadline'
  fields[#fields + 1] = string.format('%.3f', (now_ms + tonumber(ARGV[3])) / 1000)
  fields[#fields + 1] = 'enqueued_at'
  fields[#fields + 1] = string.format('%.3f', now_ms / 1000)
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], id, ARGV[2]) end
return id
"""
#: mark_delivered: decide on the server's clock (TIME) whether a job read from the stream
#: may be forwarded; only then record it as delivered. KEYS: state, cancel (the user's slot).
_MARK_DELIVERED = Script(
    """
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
if ARGV[3] ~= '' and tonumber(now) >= tonumber(ARGV[3]) then return {'expired', now} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'cancelled', now} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'delivered', now}
"""
)
#: Lua, one user's heartbeat (all keys in the user's {slot}). KEYS: presence, tools,
#: jobs, index. ARGV: session id, presence TTL ms, catalogue, group, this consumer,
#: reclaim idle ms, "1" to prune consumers. Returns {ours, backlog, reclaim_due,
#: trimmed_due} (see BeatReply). An idle user costs GET+SET presence, GET catalogue,
#: EXISTS, XINFO GROUPS and HLEN inside the script (XINFO CONSUMERS on pruning beats).
_HEARTBEAT = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function older(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local function record(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local ours = 0
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then redis.call('SET', KEYS[2], ARGV[3]) end
  ours = 1
end
local backlog, reclaim, trimmed = 0, 0, 0
local exists = redis.call('EXISTS', KEYS[3]) == 1
local function last_id()
  local tail = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if tail[1] then return tail[1][1] end
  return nil
end
if exists then
  local group = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[3])) do
    local t = record(g)
    if t['name'] == ARGV[4] then group = t end
  end
  if group == nil then
    if last_id() then backlog = 1 end
  else
    local lag = group['lag']
    if not lag then
      local tail = last_id()
      if tail and older(group['last-delivered-id'], tail) then backlog = 1 end
    elseif lag > 0 then
      backlog = 1
    end
    if group['pending'] > 0 then
      local idle = redis.call('XPENDING', KEYS[3], ARGV[4], 'IDLE', ARGV[6], '-', '+', 1)
      if idle[1] then reclaim = 1 end
    end
    if ARGV[7] == '1' then
      for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[3], ARGV[4])) do
        local t = record(c)
        if t['name'] ~= ARGV[5] and t['pending'] == 0 and t['idle'] >= tonumber(ARGV[6]) then
          redis.call('XGROUP', 'DELCONSUMER', KEYS[3], ARGV[4], t['name'])
        end
      end
    end
  end
end
if redis.call('HLEN', KEYS[4]) > 0 then
  local head = {}
  if exists then head = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1) end
  if head[1] == nil then
    trimmed = 1
  else
    for _, id in ipairs(redis.call('HKEYS', KEYS[4])) do
      if older(id, head[1][1]) then
        trimmed = 1
        break
      end
    end
  end
end
return {ours, backlog, reclaim, trimmed}
"""
_HEARTBEAT_SHA = hashlib.sha1(_HEARTBEAT.encode()).hexdigest()
#: Most pending entries examined when sweeping for trimmed entries.
_TRIMMED_SCAN = 10_000
#: Heartbeats per pipelined write (bounds one write and its reply; 10,000 sessions -> 40).
_HEARTBEAT_CHUNK = 250


def _ms(duration_s: float) -> int:
    """Seconds -> whole milliseconds, rounded up, at least 1."""
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s!r}")
    return max(1, math.ceil(round(duration_s * 1000, 6)))


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _entries(raw: Any) -> list[Entry]:
    """``[[id, [f, v, ...] | nil], ...]`` -> entries (nil body: trimmed or deleted)."""
    out = []
    for entry_id, flat in raw or ():
        fields = None if flat is None else dict(zip(flat[::2], flat[1::2], strict=True))
        out.append(Entry(entry_id, fields))
    return out


class RedisSubstrate(CallerCommands, RedisDirectory):
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
        self.address = self._connections.address

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

    # -- presence ----------------------------------------------------------------------

    async def set_presence(self, user_id: str, session_id: str, ttl_s: float) -> None:
        """SET ``bridge:presence:{user_id}`` = session_id PX ceil(ttl_s * 1000).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("SET presence") as s:
            await self._call(s, b"SET", presence_key(user_id), session_id, b"PX", px)

    async def get_presence(self, user_id: str) -> str | None:
        """GET the presence key: the holder session id, or None.

        Raises:
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub (evicting policy,
                replica, writes refused: absence proves nothing).
        """
        async with self._session("GET presence") as s:
            holder: str | None = await self._call(s, b"GET", presence_key(user_id))
        if holder is None:
            self._absent_proves_nothing("presence")
        return holder

    async def refresh_presence(self, user_id: str, session_id: str, ttl_s: float) -> bool:
        """SET presence PX ttl only if absent or held by ``session_id`` (one Lua script).

        Returns:
            True if refreshed; False if another session holds it.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("refresh presence") as s:
            key = presence_key(user_id)
            return bool(await self._call(s, b"EVAL", _REFRESH_IF_HOLDER, 1, key, session_id, px))

    async def clear_presence(self, user_id: str, session_id: str) -> bool:
        """Delete presence only while it holds ``session_id`` (one Lua script, atomic).

        Returns:
            True if deleted.

        Raises:
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        async with self._session("clear presence") as s:
            key = presence_key(user_id)
            return bool(await self._call(s, b"EVAL", _CLEAR_IF_HOLDER, 1, key, session_id))

    async def set_liveness(self, holder_id: str, ttl_s: float) -> None:
        """SET ``bridge:proc:{holder_id}`` 1 PX ceil(ttl_s * 1000).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("SET liveness") as s:
            await self._call(s, b"SET", proc_key(holder_id), b"1", b"PX", px)

    async def clear_liveness(self, holder_id: str) -> None:
        """DEL ``bridge:proc:{holder_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        async with self._session("DEL liveness") as s:
            await self._call(s, b"DEL", proc_key(holder_id))

    async def holder_alive(self, holder_id: str) -> bool:
        """EXISTS ``bridge:proc:{holder_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("EXISTS liveness") as s:
            return bool(await self._call(s, b"EXISTS", proc_key(holder_id)))

    # -- the job stream ----------------------------------------------------------------

    async def enqueue(
        self,
        user_id: str,
        fields: Mapping[str, str],
        *,
        maxlen: int,
        start_within_s: float | None = None,
    ) -> str:
        """XADD ``bridge:jobs:{user_id}`` MAXLEN ~ maxlen, by a script that also indexes
        the entry and, given ``start_within_s`` (>= 0), adds ``deadline`` and
        ``enqueued_at`` from the server's ``TIME``. The first enqueue per user and
        session sends XGROUP CREATE ... 0 MKSTREAM in the same write (BUSYGROUP ignored).
        If the stream vanished since, XADD recreates it without the group and the next
        read recreates the group from 0, so the entry is still delivered.

        Returns:
            The entry ID.

        Raises:
            ValueError: ``maxlen`` < 1, ``fields`` empty or ``start_within_s`` < 0.
            SubstrateUnavailable: Redis unreachable or refusing writes; the entry may or
                may not have been added.
        """
        if maxlen < 1 or not fields:
            raise ValueError("enqueue needs maxlen >= 1 and at least one field")
        within = ""
        if start_within_s is not None:
            if not start_within_s >= 0:
                raise ValueError(f"start_within_s must be >= 0, got {start_within_s!r}")
            within = str(math.ceil(start_within_s * 1000))
        key = jobs_key(user_id)
        flat = [item for pair in fields.items() for item in pair]
        job_id = fields.get("job_id", "")
        xadd = (b"EVAL", _XADD_INDEXED, 2, key, index_key(user_id), maxlen, job_id, within, *flat)
        async with self._session("XADD") as s:
            if user_id in s.groups:
                added: str = await self._call(s, *xadd)
                return added
            create = (b"XGROUP CREATE", key, GROUP, "0", b"MKSTREAM")
            created, entry_id = await s.execute(create, xadd, timeout_s=self._command_timeout_s)
            for reply in (created, entry_id):
                if isinstance(reply, BaseException) and not isinstance(
                    reply, StreamDuplicateConsumerGroupError
                ):
                    raise reply
            s.groups.add(user_id)
            assert isinstance(entry_id, str), entry_id
            return entry_id

    async def read_pending(self, user_id: str, consumer: str, *, count: int) -> list[Entry]:
        """XREADGROUP GROUP bridge-workers consumer COUNT count STREAMS key 0.

        Returns:
            This consumer's pending entries (``fields`` None when the body was trimmed);
            ``[]`` when the group was missing (recreated from 0).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("XREADGROUP 0") as s:
            return await self._read(s, user_id, consumer, count, None, "0")

    async def read_new(
        self, user_id: str, consumer: str, *, count: int, block_ms: int | None
    ) -> list[Entry]:
        """XREADGROUP GROUP bridge-workers consumer COUNT count BLOCK block_ms STREAMS
        key > (server-side timeout; 0 blocks forever).

        Returns:
            New entries, now in this consumer's PEL; ``[]`` on timeout, or when the group
            was missing or the stream deleted while blocked (group recreated from 0).

        Raises:
            SubstrateUnavailable: Redis unreachable, or no reply ``command_timeout_s``
                after the block should have ended.

        Cancellation: the connection is closed, and the close awaited, before the
        cancellation propagates, so no stale waiter can take a later entry.
        """
        if block_ms is not None and block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {block_ms!r}")
        async with self._session("XREADGROUP >") as s:
            return await self._read(s, user_id, consumer, count, block_ms, ">")

    async def _read(
        self,
        s: _Session,
        user_id: str,
        consumer: str,
        count: int,
        block_ms: int | None,
        cursor: str,
    ) -> list[Entry]:
        key = jobs_key(user_id)
        command: list[Any] = [b"XREADGROUP", b"GROUP", GROUP, consumer, b"COUNT", count]
        if block_ms is not None:
            command += [b"BLOCK", block_ms]
        command += [b"STREAMS", key, cursor]
        block_s = 0.0 if block_ms is None else (block_ms / 1000 if block_ms else None)
        try:
            reply = await self._call(s, *command, block_s=block_s)
        except (StreamConsumerGroupError, UnblockedError):
            s.groups.discard(user_id)
            await self._heal_group(s, user_id)
            return []
        s.groups.add(user_id)
        return _entries(reply.get(key)) if reply else []

    async def ack(self, user_id: str, entry_id: str) -> int:
        """XACK key bridge-workers entry_id, and HDEL it from the index (one round trip).

        Returns:
            1 if the entry was pending, else 0 (also when the stream or group is gone).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("XACK") as s:
            acked, _ = await s.execute(
                (b"XACK", jobs_key(user_id), GROUP, entry_id),
                (b"HDEL", index_key(user_id), entry_id),
                timeout_s=self._command_timeout_s,
            )
        if isinstance(acked, BaseException):
            raise acked
        return int(acked)

    async def autoclaim(
        self, user_id: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> Claimed:
        """XAUTOCLAIM key bridge-workers consumer min_idle_ms start COUNT count (Redis 7:
        PEL entries whose body is gone are removed and listed in ``deleted_ids``).

        Returns:
            ``Claimed(next_start, entries, deleted_ids)``; a missing group is recreated
            from 0 and yields ``Claimed("0-0", (), ())``.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        key = jobs_key(user_id)
        async with self._session("XAUTOCLAIM") as s:
            try:
                reply = await self._call(
                    s, b"XAUTOCLAIM", key, GROUP, consumer, min_idle_ms, start, b"COUNT", count
                )
            except StreamConsumerGroupError:
                s.groups.discard(user_id)
                await self._heal_group(s, user_id)
                return Claimed("0-0", (), ())
        next_start, raw_entries, deleted = reply
        return Claimed(next_start, tuple(_entries(raw_entries)), tuple(deleted))

    async def prune_consumers(self, user_id: str, *, idle_ms: int, keep: str) -> int:
        """XINFO CONSUMERS, then XGROUP DELCONSUMER every consumer other than ``keep``
        with nothing pending and idle for at least ``idle_ms`` (restarted processes leave
        their consumer names behind).

        Returns:
            How many were deleted (0 when the group is missing).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        key = jobs_key(user_id)
        async with self._session("XINFO CONSUMERS") as s:
            try:
                consumers = await self._call(s, b"XINFO", b"CONSUMERS", key, GROUP)
            except (StreamConsumerGroupError, ResponseError):
                return 0
            gone = []
            for info in consumers:
                if isinstance(info, list):  # RESP2 flat reply
                    info = dict(zip(info[::2], info[1::2], strict=True))
                name = info.get("name")
                if name != keep and int(info.get("pending", 1)) == 0:
                    if int(info.get("idle", 0)) >= idle_ms:
                        gone.append(name)
            for name in gone:
                await self._call(s, b"XGROUP", b"DELCONSUMER", key, GROUP, name)
        return len(gone)

    # -- reading at scale: wake-ups and the pipelined heartbeat -------------------------

    async def wake(self, holder_id: str, user_id: str, *, ttl_s: float) -> None:
        """MULTI, RPUSH ``bridge:wake:{holder_id}`` user_id, PEXPIRE ceil(ttl_s * 1000),
        EXEC (one round trip).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        key = wake_key(holder_id)
        async with self._session("RPUSH wake") as s:
            replies = await s.execute(
                (b"MULTI",),
                (b"RPUSH", key, user_id),
                (b"PEXPIRE", key, px),
                (b"EXEC",),
                timeout_s=self._command_timeout_s,
            )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply

    async def wait_wakes(self, holder_id: str, *, timeout_s: float, count: int) -> list[str]:
        """BLMPOP timeout_s 1 ``bridge:wake:{holder_id}`` LEFT COUNT count.

        Returns:
            The user ids popped, or [] on timeout.

        Raises:
            ValueError: negative ``timeout_s``. SubstrateUnavailable: Redis unreachable.

        Cancellation: as :meth:`read_new`; nothing is popped for a cancelled wait.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        seconds = f"{_ms(timeout_s) / 1000:.3f}" if timeout_s else "0"
        key = wake_key(holder_id)
        async with self._session("BLMPOP wake") as s:
            reply = await self._call(
                s, b"BLMPOP", seconds, 1, key, b"LEFT", b"COUNT", count,
                block_s=timeout_s or None,
            )  # fmt: skip
        if not reply:
            return []
        return list(reply[1])

    async def heartbeat(
        self,
        beats: Sequence[Beat],
        *,
        ttl_s: float,
        consumer: str,
        reclaim_idle_ms: int,
        prune: bool = True,
    ) -> list[BeatReply]:
        """One EVALSHA of the heartbeat script per beat, pipelined in writes of up to
        250 (scripts loaded on NOSCRIPT). Each script touches only its user's slot.

        Raises:
            ValueError: ``ttl_s`` not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes (then no reply
                is known; the caller retries every beat).
        """
        px = _ms(ttl_s)
        replies: list[BeatReply] = []
        async with self._session("heartbeat") as s:
            for start in range(0, len(beats), _HEARTBEAT_CHUNK):
                chunk = beats[start : start + _HEARTBEAT_CHUNK]
                commands = [
                    (
                        b"EVALSHA",
                        _HEARTBEAT_SHA,
                        4,
                        presence_key(b.user_id),
                        tools_key(b.user_id),
                        jobs_key(b.user_id),
                        index_key(b.user_id),
                        b.session_id,
                        px,
                        b.catalogue,
                        GROUP,
                        consumer,
                        reclaim_idle_ms,
                        b"1" if prune else b"0",
                    )  # fmt: skip
                    for b in chunk
                ]
                raw = await s.execute(*commands, timeout_s=self._command_timeout_s)
                if any(isinstance(r, NoScriptError) for r in raw):
                    await self._call(s, b"SCRIPT", b"LOAD", _HEARTBEAT)
                    raw = await s.execute(*commands, timeout_s=self._command_timeout_s)
                for reply in raw:
                    if isinstance(reply, BaseException):
                        raise reply
                    ours, backlog, reclaim, trimmed = (bool(int(x)) for x in reply)
                    replies.append(BeatReply(ours, backlog, reclaim, trimmed))
        return replies

    # -- results -----------------------------------------------------------------------

    async def wait_result(self, user_id: str, job_id: str, *, timeout_s: float) -> str | None:
        """BLPOP ``bridge:result:{user_id}:job_id`` timeout_s (server-side; 0 waits forever).

        Args:
            timeout_s: seconds, millisecond precision (a positive value below 1 ms
                waits 1 ms).

        Returns:
            The payload, or None on timeout.

        Raises:
            ValueError: negative ``timeout_s``.
            SubstrateUnavailable: Redis unreachable, or no reply ``command_timeout_s``
                after the timeout.

        Cancellation: as :meth:`read_new`; nothing is popped for a cancelled wait.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        seconds = f"{_ms(timeout_s) / 1000:.3f}" if timeout_s else "0"
        async with self._session("BLPOP result") as s:
            reply = await self._call(
                s, b"BLPOP", result_key(user_id, job_id), seconds, block_s=timeout_s or None
            )
        return None if reply is None else reply[1]

    # -- progress ----------------------------------------------------------------------

    async def publish_progress(
        self, job_id: str, payload: str, *, ttl_s: float, maxlen: int = 64
    ) -> None:
        """MULTI, XADD ``bridge:progress:{job_id}`` MAXLEN ~ maxlen * p payload, PEXPIRE,
        EXEC (one round trip).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        key = progress_key(job_id)
        async with self._session("XADD progress") as s:
            replies = await s.execute(
                (b"MULTI",),
                (b"XADD", key, b"MAXLEN", b"~", maxlen, b"*", b"p", payload),
                (b"PEXPIRE", key, px),
                (b"EXEC",),
                timeout_s=self._command_timeout_s,
            )
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply

    async def read_progress(
        self, job_id: str, after: str, *, block_ms: int
    ) -> list[tuple[str, str]]:
        """XREAD COUNT 100 BLOCK block_ms STREAMS ``bridge:progress:{job_id}`` after.

        Returns:
            ``[(entry_id, payload)]`` in order; ``[]`` on timeout.

        Raises:
            ValueError: negative ``block_ms``.
            SubstrateUnavailable: Redis unreachable.

        Cancellation: as :meth:`read_new` (the blocked connection is discarded).
        """
        if block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {block_ms!r}")
        key = progress_key(job_id)
        async with self._session("XREAD progress") as s:
            reply = await self._call(
                s,
                b"XREAD",
                b"COUNT",
                100,
                b"BLOCK",
                block_ms,
                b"STREAMS",
                key,
                after,
                block_s=block_ms / 1000 if block_ms else None,
            )
        if not reply:
            return []
        entries = reply.get(key) if isinstance(reply, dict) else reply[0][1]
        return [(e.entry_id, e.fields.get("p", "")) for e in _entries(entries) if e.fields]

    # -- bookkeeping -------------------------------------------------------------------

    async def job_ids(self, user_id: str, entry_ids: list[str]) -> dict[str, str]:
        """HMGET ``bridge:index:{user_id}`` for ``entry_ids``.

        Returns:
            ``{entry_id: job_id}`` for the entries still indexed.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        if not entry_ids:
            return {}
        async with self._session("HMGET index") as s:
            values = await self._call(s, b"HMGET", index_key(user_id), *entry_ids)
        return {e: v for e, v in zip(entry_ids, values, strict=True) if v is not None}

    async def trimmed(self, user_id: str) -> list[tuple[str, str]]:
        """Indexed entries older than the stream's first entry (or all of them when the
        stream is gone) and in no consumer's pending entries list: trimmed by MAXLEN
        before any consumer read them.

        Returns:
            ``[(entry_id, job_id)]``, oldest first.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("XRANGE+HGETALL") as s:
            first, index = await s.execute(
                (b"XRANGE", jobs_key(user_id), b"-", b"+", b"COUNT", 1),
                (b"HGETALL", index_key(user_id)),
                timeout_s=self._command_timeout_s,
            )
        for reply in (first, index):
            if isinstance(reply, BaseException):
                raise reply
        if isinstance(index, list):  # RESP2 flat reply
            index = dict(zip(index[::2], index[1::2], strict=True))
        floor = _stream_id(first[0][0]) if first else None
        lost = [
            (entry_id, job_id)
            for entry_id, job_id in index.items()
            if floor is None or _stream_id(entry_id) < floor
        ]
        lost.sort(key=lambda pair: _stream_id(pair[0]))
        if not lost:
            return []
        # Entries read by a consumer are its to answer (issue 11.3): drop the ones pending.
        key = jobs_key(user_id)
        async with self._session("XPENDING") as s:
            try:
                pending = await self._call(
                    s, b"XPENDING", key, GROUP, lost[0][0], lost[-1][0], _TRIMMED_SCAN
                )
            except StreamConsumerGroupError:
                pending = []
        read = {p[0] for p in pending}
        return [pair for pair in lost if pair[0] not in read]

    async def forget(self, user_id: str, entry_id: str) -> bool:
        """HDEL ``entry_id`` from the index; True if this call removed it.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("HDEL index") as s:
            return bool(await self._call(s, b"HDEL", index_key(user_id), entry_id))

    async def set_job_state(
        self, user_id: str, job_id: str, state: JobState, *, ttl_s: float
    ) -> None:
        """SET ``bridge:state:{user_id}:job_id`` state.encode() PX ceil(ttl_s * 1000).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET state") as s:
            await self._call(
                s, b"SET", state_key(user_id, job_id), state.encode(), b"PX", _ms(ttl_s)
            )

    async def claim_job(self, user_id: str, job_id: str, state: JobState, *, ttl_s: float) -> bool:
        """SET ``bridge:state:{user_id}:job_id`` state.encode() NX PX ceil(ttl_s * 1000).

        Returns:
            True if the job id was free and is now claimed.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET NX state") as s:
            reply = await self._call(
                s, b"SET", state_key(user_id, job_id), state.encode(), b"NX", b"PX", _ms(ttl_s)
            )
        return reply is not None

    async def get_job_state(self, user_id: str, job_id: str) -> JobState | None:
        """GET ``bridge:state:{user_id}:job_id``, decoded.

        Raises:
            MalformedState: the stored value is not a job state.
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub.
        """
        async with self._session("GET state") as s:
            raw = await self._call(s, b"GET", state_key(user_id, job_id))
        if raw is None:
            self._absent_proves_nothing("job state")
            return None
        return JobState.decode(raw)

    async def mark_delivered(
        self,
        user_id: str,
        job_id: str,
        state: JobState,
        *,
        ttl_s: float,
        deadline: float | None = None,
    ) -> Marked:
        """One script, one round trip: compare ``deadline`` with the server's ``TIME``,
        check the cancel flag, and only then SET the state PX ceil(ttl_s * 1000).

        Returns:
            :class:`Marked` with the verdict and the server's time.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        limit = "" if deadline is None else repr(float(deadline))
        keys = (state_key(user_id, job_id), cancel_key(user_id, job_id))
        args = (state.encode(), _ms(ttl_s), limit)
        async with self._session("mark delivered") as s:
            (reply,) = await self._script(s, _MARK_DELIVERED, keys, args)
        if isinstance(reply, BaseException):
            raise reply
        verdict, now = reply
        return Marked(verdict=str(verdict), server_time=float(now))

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """SET ``bridge:cancel:{user_id}:job_id`` 1 PX ceil(ttl_s * 1000).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET cancel") as s:
            await self._call(s, b"SET", cancel_key(user_id, job_id), "1", b"PX", _ms(ttl_s))

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """SET ``bridge:tools:{user_id}`` catalogue (no TTL: the last known catalogue).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET tools") as s:
            await self._call(s, b"SET", tools_key(user_id), catalogue)

    async def get_catalogue(self, user_id: str) -> str | None:
        """GET ``bridge:tools:{user_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub.
        """
        async with self._session("GET tools") as s:
            catalogue: str | None = await self._call(s, b"GET", tools_key(user_id))
        if catalogue is None:
            self._absent_proves_nothing("catalogue")
        return catalogue

    async def queue_info(self, user_id: str, *, count: int = 0) -> QueueInfo:
        """XLEN and XPENDING of the user's stream (read-only; metrics and admin API).

        Args:
            count: list at most this many pending entries, oldest first (0: summary only).

        Returns:
            A :class:`QueueInfo`; a missing stream or group reads as empty.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        key = jobs_key(user_id)
        async with self._session("XPENDING") as s:
            length = int(await self._call(s, b"XLEN", key))
            try:
                summary = await self._call(s, b"XPENDING", key, GROUP)
                rows = (
                    await self._call(s, b"XPENDING", key, GROUP, b"-", b"+", count)
                    if count > 0
                    else []
                )
            except (StreamConsumerGroupError, ResponseError):
                return QueueInfo(length, 0)
        pending = tuple(
            PendingEntry(_str(r[0]), _str(r[1]), int(r[2]), int(r[3])) for r in rows or ()
        )
        return QueueInfo(length, int(summary[0]) if summary else 0, pending)

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

    async def health_check(self) -> Health | None:
        """Probe now (``_redis_health``): role, eviction policy, AOF, a scripted write.

        Returns:
            The Health found (``health.causes`` empty when usable), or None when Redis
            could not be reached. Logs a line when the verdict changes.
        """
        return await self._connections.monitor.check()


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
