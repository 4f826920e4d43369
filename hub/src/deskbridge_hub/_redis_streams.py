"""The job stream on Redis: enqueue, consumer-group reads, XACK, XAUTOCLAIM, consumer
pruning, the entry ID -> job id index and queue inspection; the ``StreamCommands``
part of ``RedisSubstrate`` (contract: ``_substrate.StreamSubstrate``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from coredis.exceptions import (
    ResponseError,
    StreamConsumerGroupError,
    StreamDuplicateConsumerGroupError,
    UnblockedError,
)

from ._inspection import PendingEntry, QueueInfo
from ._redis_base import (
    DELETED_SCAN,
    LUA_DELETED,
    RedisCommandBase,
    Script,
    _entries,
    _ms,
    _str,
    _stream_id,
)
from ._redis_jobs import _no_group
from ._redis_session import _Session
from ._substrate import (
    CANCEL_SENT,
    GROUP,
    Claimed,
    Entry,
    cancel_key,
    index_key,
    jobs_key,
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
#: send_cancel: the cancel flag (SET NX: an existing one keeps its value and TTL) and,
#: unless it says ``sent``, the indexed ``control: cancel`` entry and the ``sent`` mark,
#: in one step: two cancels of one job at once each found the flag unmarked (a SET NX +
#: GET, then the XADD and the mark as later writes) and each wrote an entry.
#: KEYS: cancel flag, stream, index (the user's slot). ARGV: TTL ms, maxlen, job id,
#: the ``sent`` mark. Reply: the entry ID, or nil (sent before).
_SEND_CANCEL = Script(
    """
redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[4] then return false end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
  'control', 'cancel', 'job_id', ARGV[3])
redis.call('HSET', KEYS[3], id, ARGV[3])
redis.call('SET', KEYS[1], ARGV[4], 'XX', 'KEEPTTL')
return id
"""
)
#: This consumer's pending entries with their bodies, oldest first: XPENDING for the
#: consumer, then XRANGE per entry (a missing body: trimmed or deleted). A look, unlike
#: XREADGROUP 0, which restarts each entry's idle time and raises its delivery count: a
#: drain that withholds a gone desktop's entry pushed its reclaim back at every re-attach.
#: KEYS: the stream. ARGV: group, consumer, count. NOGROUP fails the script.
_READ_PENDING = Script(
    """
local out = {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', ARGV[3], ARGV[2])) do
  local body = redis.call('XRANGE', KEYS[1], p[1], p[1])[1]
  if body then out[#out + 1] = body else out[#out + 1] = {p[1], false} end
end
return out
""",
    resend_safe=True,
)
#: The entry IDs of ARGV[2..] at or after the stream's first entry that are no longer in
#: it (``LUA_DELETED``), at most ARGV[1] looked up. KEYS: the stream. Reads only.
_DELETED = Script(
    LUA_DELETED
    + """
local ids = {}
for i = 2, #ARGV do ids[i - 1] = ARGV[i] end
return deleted(KEYS[1], ids, tonumber(ARGV[1]))
""",
    resend_safe=True,
)
#: Most pending entries examined when sweeping for trimmed entries.
_TRIMMED_SCAN = 10_000


class StreamCommands(RedisCommandBase):
    """The job stream's commands of ``RedisSubstrate``."""

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

    async def send_cancel(
        self, user_id: str, job_id: str, *, ttl_s: float, maxlen: int
    ) -> str | None:
        """EVAL ``_SEND_CANCEL`` (see ``Substrate.send_cancel``), after XGROUP CREATE ...
        0 MKSTREAM in the same write on the first write per user and session, as
        :meth:`enqueue`.

        Returns:
            The control entry's ID, or None when one was sent before.

        Raises:
            ValueError: ``maxlen`` < 1 or ``ttl_s`` not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes; the step may or
                may not have run.
        """
        if maxlen < 1:
            raise ValueError(f"send_cancel needs maxlen >= 1, got {maxlen!r}")
        keys = (cancel_key(user_id, job_id), jobs_key(user_id), index_key(user_id))
        args = (_ms(ttl_s), maxlen, job_id, CANCEL_SENT)
        async with self._session("cancel control") as s:
            before: tuple[tuple[Any, ...], ...] = ()
            if user_id not in s.groups:
                before = ((b"XGROUP CREATE", jobs_key(user_id), GROUP, "0", b"MKSTREAM"),)
            *created, sent = await self._script(s, _SEND_CANCEL, keys, args, before=before)
            for reply in (*created, sent):
                if isinstance(reply, BaseException) and not isinstance(
                    reply, StreamDuplicateConsumerGroupError
                ):
                    raise reply  # inside the session: mapped to SubstrateUnavailable
        s.groups.add(user_id)
        return None if sent is None else _str(sent)

    async def read_pending(self, user_id: str, consumer: str, *, count: int) -> list[Entry]:
        """XPENDING key bridge-workers - + count consumer, and XRANGE of each entry, in
        one script (``_READ_PENDING``): idle times and delivery counts are left as they
        were.

        Returns:
            This consumer's pending entries (``fields`` None when the body was trimmed);
            ``[]`` when the group was missing (recreated from 0).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("XPENDING+XRANGE") as s:
            (reply,) = await self._script(
                s, _READ_PENDING, (jobs_key(user_id),), (GROUP, consumer, count)
            )
            if _no_group(reply):
                s.groups.discard(user_id)
                await self._heal_group(s, user_id)
                return []
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
            s.groups.add(user_id)
            return _entries(reply)

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
                raise acked  # inside the session: a timeout is mapped to SubstrateUnavailable
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
        stream is gone), or no longer in it (deleted from its middle: XDEL; at most
        ``DELETED_SCAN`` looked up), and in no consumer's pending entries list: trimmed
        or deleted before any consumer read them.

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
                    raise reply  # inside the session: a timeout is mapped to SubstrateUnavailable
        if isinstance(index, list):  # RESP2 flat reply
            index = dict(zip(index[::2], index[1::2], strict=True))
        floor = _stream_id(first[0][0]) if first else None
        ids = sorted(index, key=_stream_id)
        gone = [e for e in ids if floor is None or _stream_id(e) < floor]
        if floor is not None and len(gone) < len(ids):  # and those deleted from the middle
            async with self._session("XINFO+XRANGE") as s:
                (deleted,) = await self._script(
                    s, _DELETED, (jobs_key(user_id),), (DELETED_SCAN, *ids[len(gone) :])
                )
                if isinstance(deleted, BaseException):
                    raise deleted  # inside the session: mapped to SubstrateUnavailable
            gone += [_str(e) for e in deleted]
        lost = sorted(((e, index[e]) for e in gone), key=lambda pair: _stream_id(pair[0]))
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

    async def queue_info(self, user_id: str, *, count: int = 0) -> QueueInfo:
        """XLEN and XPENDING of the user's stream (read-only; metrics and admin API).

        Args:
            count: list at most this many pending entries, oldest first (0: summary only).

        Returns:
            A :class:`QueueInfo`; a missing stream or group reads as empty.

        Raises:
            SubstrateUnavailable: Redis unreachable, or the last health probe found XLEN
                refused to this user (ACL; unsent, naming the grant).
        """
        refused = self._refuses_view("queue", "a queue read")
        if refused is not None:
            raise refused
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
