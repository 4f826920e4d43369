"""The job stream of ``MemorySubstrate`` (mixed in): XADD with trimming, the consumer
group's reads (pending and new, blocking), XACK, XAUTOCLAIM, consumer pruning, the
entry-ID -> job-id index (``job_ids``, ``trimmed``, ``forget``) and ``queue_info``.

Also the stream's in-memory records (``_Stream``, ``_Nack``) and the entry-ID helpers
``_parse_id`` / ``_format_id`` / ``_deadline`` the other ``_memory*`` modules share. The
Redis 7.0 semantics mirrored here are listed in ``_memory``'s module docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import attrs

from ._inspection import PendingEntry, QueueInfo
from ._substrate import Claimed, Entry, Submission

StreamID = tuple[int, int]


def _parse_id(entry_id: str) -> StreamID:
    """Parse ``"<ms>-<seq>"`` or ``"<ms>"`` (seq 0), as Redis does; ValueError otherwise."""
    ms, sep, seq = entry_id.partition("-")
    try:
        parsed = (int(ms), int(seq) if sep else 0)
    except ValueError:
        raise ValueError(f"invalid stream entry ID: {entry_id!r}") from None
    if parsed[0] < 0 or parsed[1] < 0:
        raise ValueError(f"invalid stream entry ID: {entry_id!r}")
    return parsed


def _format_id(sid: StreamID) -> str:
    return f"{sid[0]}-{sid[1]}"


def _deadline(timeout_s: float) -> float:
    """Absolute deadline for a Redis-style block: 0 means wait forever."""
    if timeout_s < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout_s!r}")
    return math.inf if timeout_s == 0 else anyio.current_time() + timeout_s


@attrs.define(eq=False)
class _Nack:
    """One pending entries list record (Redis ``streamNACK``)."""

    consumer: str
    delivery_time: float
    delivery_count: int = 1


@attrs.define(eq=False)
class _Stream:
    """A stream and its single consumer group ``bridge-workers`` (they live and die together)."""

    changed: anyio.Event
    entries: dict[StreamID, dict[str, str]] = attrs.Factory(dict)
    last_id: StreamID = (0, 0)
    last_delivered: StreamID = (0, 0)
    pel: dict[StreamID, _Nack] = attrs.Factory(dict)
    seen: dict[str, float] = attrs.Factory(dict)  # consumer -> last read or claim
    #: Newest entry trimmed (Redis ``max-deleted-entry-id``): past the group's last
    #: delivered entry, Redis cannot compute the group's lag.
    max_deleted: StreamID = (0, 0)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class MemoryStreamCommands:
    """Job-stream methods of ``MemorySubstrate`` (see the module docstring)."""

    _streams: dict[str, _Stream]
    _index: dict[str, dict[StreamID, str]]
    _enter: Callable[[], Any]
    _check: Callable[[], None]
    _group: Callable[[str], _Stream | None]
    server_time: Callable[[], float]

    # -- the job stream ----------------------------------------------------------------

    async def enqueue(
        self,
        user_id: str,
        fields: Mapping[str, str],
        *,
        maxlen: int,
        start_within_s: float | None = None,
    ) -> str:
        """XADD (creating the stream and group if missing), then trim to ``maxlen``
        entries, oldest first. Waiting readers wake up. With ``start_within_s`` the
        entry gets ``deadline`` and ``enqueued_at`` from :meth:`server_time`.

        Returns:
            The new entry ID, ``"<ms>-<seq>"`` on the running clock.

        Raises:
            ValueError: ``maxlen`` < 1 or ``fields`` empty.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        if maxlen < 1 or not fields:
            raise ValueError("enqueue needs maxlen >= 1 and at least one field")
        return self._xadd(user_id, fields, now, maxlen=maxlen, start_within_s=start_within_s)

    def _entry_field(self, user_id: str, entry_id: str, name: str) -> str | None:
        """Field ``name`` of entry ``entry_id`` (no checkpoint), None if either is gone."""
        return self._streams[user_id].entries.get(_parse_id(entry_id), {}).get(name)

    def _enqueue_now(self, user_id: str, sub: Submission) -> str:
        """``submit``'s XADD (no checkpoint: part of its atomic step)."""
        now = anyio.current_time()
        return self._xadd(
            user_id, sub.fields, now, maxlen=sub.maxlen, start_within_s=sub.start_within_s
        )

    def _xadd(
        self,
        user_id: str,
        fields: Mapping[str, str],
        now: float,
        *,
        maxlen: int,
        start_within_s: float | None,
    ) -> str:
        fields = {str(k): str(v) for k, v in fields.items()}
        if start_within_s is not None:
            if not start_within_s >= 0:
                raise ValueError(f"start_within_s must be >= 0, got {start_within_s!r}")
            at_ms = math.floor(self.server_time() * 1000)  # whole ms, as the Redis script
            deadline_ms = at_ms + math.ceil(start_within_s * 1000)
            fields |= {
                "deadline": f"{deadline_ms / 1000:.3f}",
                "enqueued_at": f"{at_ms / 1000:.3f}",
            }
        self._group(user_id)
        stream = self._streams[user_id]
        ms = max(int(now * 1000), 0)
        last_ms, last_seq = stream.last_id
        sid = (last_ms, last_seq + 1) if ms <= last_ms else (ms, 0)
        if sid == (0, 0):
            sid = (0, 1)
        stream.last_id = sid
        stream.entries[sid] = fields
        if fields.get("job_id"):
            self._index.setdefault(user_id, {})[sid] = fields["job_id"]
        while len(stream.entries) > maxlen:
            stream.max_deleted = next(iter(stream.entries))
            del stream.entries[stream.max_deleted]
        stream.notify()
        return _format_id(sid)

    def _reply(self, stream: _Stream, sid: StreamID) -> Entry:
        body = stream.entries.get(sid)
        return Entry(_format_id(sid), None if body is None else dict(body))

    async def read_pending(self, user_id: str, consumer: str, *, count: int) -> list[Entry]:
        """This consumer's pending entries, oldest first, at most ``count``; bodies that
        were trimmed come back as ``fields=None``. A look: delivery counts and idle
        times stay those of the entries' last real delivery (a read, a claim).

        Returns:
            The entries; ``[]`` if none, or if the group was missing (then recreated).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        stream = self._group(user_id)
        if stream is None:
            return []
        mine = sorted(sid for sid, nack in stream.pel.items() if nack.consumer == consumer)
        return [self._reply(stream, sid) for sid in mine[:count]]

    async def read_new(
        self, user_id: str, consumer: str, *, count: int, block_ms: int | None
    ) -> list[Entry]:
        """Up to ``count`` entries never delivered to the group, each handed to this
        consumer alone and added to its PEL; waits up to ``block_ms`` milliseconds for
        the first one (0 = forever, as in Redis).

        Returns:
            The entries, or ``[]`` on timeout, or if the group was missing (recreated)
            or the stream was deleted while waiting.

        Raises:
            SubstrateUnavailable: marked unavailable (also while waiting).

        Cancellation: nothing is delivered to a cancelled read.
        """
        await self._enter()
        # No BLOCK: answer at once (an instant deadline still looks once).
        deadline = -math.inf if block_ms is None else _deadline(block_ms / 1000)
        with anyio.CancelScope(deadline=deadline):
            stream = self._group(user_id)
            if stream is not None:
                stream.seen[consumer] = anyio.current_time()
            while stream is not None and stream is self._streams.get(user_id):
                self._check()
                fresh = self._take_fresh(stream, consumer, count)
                if fresh:
                    return fresh
                await stream.changed.wait()
            self._check()
            if stream is not None:  # deleted while we waited: heal now, like the next read
                self._group(user_id)
        return []

    def _read_new_nowait(self, user_id: str, consumer: str, count: int) -> list[Entry]:
        """``read_new`` without BLOCK and without a checkpoint (for steps that must be
        atomic with it)."""
        stream = self._group(user_id)
        if stream is None:
            return []
        stream.seen[consumer] = anyio.current_time()
        return self._take_fresh(stream, consumer, count)

    def _lag(self, user_id: str) -> int | None:
        """The group's lag as Redis's XINFO GROUPS reports it: entries not yet delivered
        to the group, None when it cannot be told (an entry past the group's last
        delivered one was trimmed) or there is no group."""
        stream = self._streams.get(user_id)
        if stream is None or stream.max_deleted > stream.last_delivered:
            return None
        return sum(1 for sid in stream.entries if sid > stream.last_delivered)

    def _pending_count(self, user_id: str) -> int:
        """Entries in the group's pending entries list (every consumer's)."""
        stream = self._streams.get(user_id)
        return 0 if stream is None else len(stream.pel)

    def _take_fresh(self, stream: _Stream, consumer: str, count: int) -> list[Entry]:
        fresh = [sid for sid in stream.entries if sid > stream.last_delivered][:count]
        now = anyio.current_time()
        for sid in fresh:
            stream.pel[sid] = _Nack(consumer, now)
            stream.last_delivered = sid
        return [self._reply(stream, sid) for sid in fresh]

    async def ack(self, user_id: str, entry_id: str) -> int:
        """XACK: remove ``entry_id`` from the PEL (and from the index).

        Returns:
            1 if it was pending, else 0 (also when the stream or group is missing).

        Raises:
            ValueError: malformed entry ID.
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        return self._xack(user_id, entry_id)

    def _xack(self, user_id: str, entry_id: str) -> int:
        """XACK + HDEL of the index, at once (no checkpoint)."""
        sid = _parse_id(entry_id)
        self._index.get(user_id, {}).pop(sid, None)
        stream = self._streams.get(user_id)
        if stream is None or stream.pel.pop(sid, None) is None:
            return 0
        return 1

    async def autoclaim(
        self, user_id: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> Claimed:
        """XAUTOCLAIM: scan the PEL from ``start`` (inclusive), examining at most
        ``10 * count`` records; give ``consumer`` up to ``count`` entries idle for at least
        ``min_idle_ms`` milliseconds (delivery count + 1, idle time restarts), and drop
        records whose body is gone whatever their idle time (they count towards ``count``).

        Returns:
            ``Claimed(next_start, entries, deleted_ids)``; ``next_start`` is ``"0-0"`` when
            the scan reached the end. A missing group is recreated and yields nothing.

        Raises:
            ValueError: malformed ``start`` or ``count`` < 1.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        first = _parse_id(start)
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count!r}")
        stream = self._group(user_id)
        if stream is None:
            return Claimed("0-0", (), ())
        stream.seen[consumer] = now
        scan = sorted(sid for sid in stream.pel if sid >= first)
        claimed: list[Entry] = []
        deleted: list[str] = []
        budget, attempts, i = count, count * 10, 0
        while budget and attempts and i < len(scan):
            attempts -= 1
            sid = scan[i]
            i += 1
            if sid not in stream.entries:
                del stream.pel[sid]
                deleted.append(_format_id(sid))
                budget -= 1
                continue
            nack = stream.pel[sid]
            if now < nack.delivery_time + min_idle_ms / 1000:
                continue
            nack.consumer = consumer
            nack.delivery_time = now
            nack.delivery_count += 1
            claimed.append(self._reply(stream, sid))
            budget -= 1
        next_start = _format_id(scan[i]) if i < len(scan) else "0-0"
        return Claimed(next_start, tuple(claimed), tuple(deleted))

    async def prune_consumers(self, user_id: str, *, idle_ms: int, keep: str) -> int:
        """XGROUP DELCONSUMER every consumer other than ``keep`` with nothing pending and
        idle for at least ``idle_ms`` milliseconds.

        Returns:
            How many were deleted.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        stream = self._streams.get(user_id)
        if stream is None:
            return 0
        busy = {nack.consumer for nack in stream.pel.values()}
        gone = [
            name
            for name, seen in stream.seen.items()
            if name != keep and name not in busy and now >= seen + idle_ms / 1000
        ]
        for name in gone:
            del stream.seen[name]
        return len(gone)

    # -- the entry index ----------------------------------------------------------------

    async def job_ids(self, user_id: str, entry_ids: list[str]) -> dict[str, str]:
        """The job id of each entry ID still indexed (enqueued and not acked).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        index = self._index.get(user_id, {})
        found = {e: index.get(_parse_id(e)) for e in entry_ids}
        return {e: j for e, j in found.items() if j is not None}

    async def trimmed(self, user_id: str) -> list[tuple[str, str]]:
        """Indexed entries no longer in the stream (older than its first entry, deleted
        from its middle, or all when the stream is gone) and in no pending entries list.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        stream = self._streams.get(user_id)
        index = self._index.get(user_id, {})
        entries = stream.entries if stream is not None else {}
        pel = stream.pel if stream is not None else {}
        return [
            (_format_id(sid), job_id)
            for sid, job_id in sorted(index.items())
            if sid not in entries and sid not in pel
        ]

    async def forget(self, user_id: str, entry_id: str) -> bool:
        """Remove ``entry_id`` from the index; True if this call removed it.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        return self._index.get(user_id, {}).pop(_parse_id(entry_id), None) is not None

    async def queue_info(self, user_id: str, *, count: int = 0) -> QueueInfo:
        """XLEN and XPENDING of the user's stream (see RedisSubstrate.queue_info).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        stream = self._streams.get(user_id)
        if stream is None:
            return QueueInfo(0, 0)
        rows = sorted(stream.pel.items())[: max(count, 0)]
        pending = tuple(
            PendingEntry(
                _format_id(sid),
                nack.consumer,
                int(max(now - nack.delivery_time, 0.0) * 1000),
                nack.delivery_count,
            )
            for sid, nack in rows
        )
        return QueueInfo(len(stream.entries), len(stream.pel), pending)
