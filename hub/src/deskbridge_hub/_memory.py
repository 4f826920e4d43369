"""``MemorySubstrate``: the substrate contract in-process, on the running clock.

The embedded default for one hub process, and the substrate of the deterministic tests:
every duration is measured with ``anyio.current_time()``, so trio's ``MockClock`` (with
autojump) drives presence expiry, result expiry and reclaim idle times without real sleeps.

It mirrors the Redis 7.0 semantics the contract names (checked against ``redis-server``
7.0.15 by the contract suite, tests/hub/test_substrate_contract.py):

* presence and result lists expire exactly at ``set time + ttl_s``: a read at an earlier
  instant sees the value, a read at or after it does not;
* ``enqueue`` trims the stream to exactly ``maxlen`` entries, oldest first; trimmed entries
  that were delivered stay in the pending entries list (PEL) with no body;
* reading pending entries re-delivers them: the delivery count goes up and the idle time
  restarts, except for entries whose body is gone (Redis leaves those untouched);
* XAUTOCLAIM drops PEL entries whose body is gone and reports them in ``deleted_ids``
  whatever their idle time (Redis 7 checks existence before idleness);
* a blocked read is woken by an enqueue and each new entry goes to exactly one consumer.

Blocking reads wait on anyio events, never by polling. Test helpers (not part of the
contract): :meth:`MemorySubstrate.delete_stream`, :meth:`MemorySubstrate.set_unavailable`,
:meth:`MemorySubstrate.pending_count`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

import anyio
import anyio.lowlevel
import attrs

from ._directory import MemoryDirectory
from ._errors import SubstrateUnavailable
from ._inspection import PendingEntry, QueueInfo
from ._jobstate import JobState
from ._memory_caller import MemoryCallerCommands, _Mailbox, _ResultList, _Waiters
from ._substrate import (
    Beat,
    BeatReply,
    Claimed,
    Entry,
    Marked,
    Submission,
    cancel_key,
    presence_key,
    proc_key,
    state_key,
    tools_key,
)

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

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


@attrs.define(eq=False)
@attrs.define(eq=False)
class _ProgressLog:
    """One job's progress stream: (sequence, payload) pairs, newest last."""

    entries: deque[tuple[int, str]]
    expires_at: float
    next_seq: int = 1
    changed: anyio.Event = attrs.field(factory=anyio.Event)


@attrs.define(eq=False)
class MemorySubstrate(MemoryCallerCommands, MemoryDirectory):
    """The substrate contract in one process, on ``anyio.current_time()``.

    Construct it with no arguments; it needs no connection, and ``async with`` is
    optional (entering and leaving do nothing, so code can treat both substrates alike).
    State lives as long as the object.

    Args:
        clock: the "server clock" (Redis ``TIME``'s stand-in) that job deadlines are set
            and compared on, Unix seconds. Default: the wall clock when first read, then
            advancing with ``anyio.current_time()`` (so ``MockClock`` moves it too).
    """

    clock: Callable[[], float] | None = attrs.field(default=None, kw_only=True)

    _streams: dict[str, _Stream] = attrs.field(factory=dict, init=False)
    _results: dict[str, _ResultList] = attrs.field(factory=dict, init=False)
    _result_waiters: dict[str, _Waiters] = attrs.field(factory=dict, init=False)
    _progress: dict[str, _ProgressLog] = attrs.field(factory=dict, init=False)
    _unavailable: bool = attrs.field(default=False, init=False)
    _index: dict[str, dict[StreamID, str]] = attrs.field(factory=dict, init=False)
    _kv: dict[str, tuple[str, float]] = attrs.field(factory=dict, init=False)
    _mailboxes: dict[str, _Mailbox] = attrs.field(factory=dict, init=False)
    _wakes: dict[str, _ResultList] = attrs.field(factory=dict, init=False)
    _wake_changed: anyio.Event | None = attrs.field(default=None, init=False)
    _anchor: float | None = attrs.field(default=None, init=False)

    def server_time(self) -> float:
        """The substrate's clock (see ``clock``), Unix seconds."""
        if self.clock is not None:
            return self.clock()
        if self._anchor is None:
            self._anchor = time.time() - anyio.current_time()
        return self._anchor + anyio.current_time()

    async def __aenter__(self) -> MemorySubstrate:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    # -- test helpers ------------------------------------------------------------------

    def delete_stream(self, user_id: str) -> None:
        """Drop the user's stream with its consumer group and PEL (key eviction, or Redis
        restarted without persistence). The next read sees NOGROUP and self-heals; readers
        blocked right now wake up and return ``[]`` (Redis 7: ``UNBLOCKED``)."""
        stream = self._streams.pop(user_id, None)
        if stream is not None:
            stream.notify()

    def set_unavailable(self, unavailable: bool) -> None:
        """While True every call raises SubstrateUnavailable, including blocked reads and
        waits, which wake up to raise (a dropped Redis connection)."""
        self._unavailable = unavailable
        if unavailable:
            for stream in self._streams.values():
                stream.notify()
            for waiters in self._result_waiters.values():
                waiters.event.set()
            self._result_waiters.clear()
            for box in self._mailboxes.values():
                box.notify()
            self._notify_wakes()

    def pending_count(self, user_id: str) -> int:
        """Number of entries in the group's pending entries list (every consumer)."""
        stream = self._streams.get(user_id)
        return 0 if stream is None else len(stream.pel)

    # -- internals ---------------------------------------------------------------------

    async def _enter(self) -> float:
        """Checkpoint, then fail if unavailable; returns the current time."""
        await anyio.lowlevel.checkpoint()
        self._check()
        return anyio.current_time()

    def _check(self) -> None:
        if self._unavailable:
            raise SubstrateUnavailable("in-memory substrate marked unavailable (test fault)")

    def _group(self, user_id: str) -> _Stream | None:
        """The user's stream and group, or None after creating them (the NOGROUP path:
        XGROUP CREATE ... 0 MKSTREAM, so nothing enqueued afterwards is skipped)."""
        stream = self._streams.get(user_id)
        if stream is None:
            self._streams[user_id] = _Stream(changed=anyio.Event())
        return stream

    def _result_list(self, key: str, now: float) -> _ResultList | None:
        lst = self._results.get(key)
        if lst is not None and now >= lst.expires_at:
            del self._results[key]
            return None
        return lst

    # -- presence ----------------------------------------------------------------------

    async def set_presence(self, user_id: str, session_id: str, ttl_s: float) -> None:
        """SET presence = session_id with a TTL of ``ttl_s`` seconds (> 0).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        self._set(presence_key(user_id), session_id, await self._enter(), ttl_s)

    async def get_presence(self, user_id: str) -> str | None:
        """The holder session id, or None when absent or expired.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        return self._get(presence_key(user_id), await self._enter())

    async def refresh_presence(self, user_id: str, session_id: str, ttl_s: float) -> bool:
        """Set presence only if absent (or expired) or held by ``session_id``.

        Returns:
            True if refreshed; False if another session holds it.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        holder = await self.get_presence(user_id)
        if holder is not None and holder != session_id:
            return False
        await self.set_presence(user_id, session_id, ttl_s)
        return True

    async def clear_presence(self, user_id: str, session_id: str) -> bool:
        """Delete presence only if it is live and its value is ``session_id``.

        Returns:
            True if deleted.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        if await self.get_presence(user_id) != session_id:
            return False
        del self._kv[presence_key(user_id)]
        return True

    async def set_liveness(self, holder_id: str, ttl_s: float) -> None:
        """Mark the hub process ``holder_id`` alive for ``ttl_s`` seconds.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        self._set(proc_key(holder_id), "1", await self._enter(), ttl_s)

    async def clear_liveness(self, holder_id: str) -> None:
        """Forget the process's liveness. Raises SubstrateUnavailable when marked so."""
        await self._enter()
        self._kv.pop(proc_key(holder_id), None)

    async def holder_alive(self, holder_id: str) -> bool:
        """Whether the process's liveness is set and not expired.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        return self._get(proc_key(holder_id), await self._enter()) is not None

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
            del stream.entries[next(iter(stream.entries))]
        stream.notify()
        return _format_id(sid)

    def _reply(self, stream: _Stream, sid: StreamID) -> Entry:
        body = stream.entries.get(sid)
        return Entry(_format_id(sid), None if body is None else dict(body))

    async def read_pending(self, user_id: str, consumer: str, *, count: int) -> list[Entry]:
        """This consumer's pending entries, oldest first, at most ``count``; bodies that
        were trimmed come back as ``fields=None``. Entries with a body are re-delivered
        (delivery count + 1, idle time restarts).

        Returns:
            The entries; ``[]`` if none, or if the group was missing (then recreated).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        stream = self._group(user_id)
        if stream is None:
            return []
        stream.seen[consumer] = now
        mine = sorted(sid for sid, nack in stream.pel.items() if nack.consumer == consumer)
        out = []
        for sid in mine[:count]:
            if sid in stream.entries:
                nack = stream.pel[sid]
                nack.delivery_time = now
                nack.delivery_count += 1
            out.append(self._reply(stream, sid))
        return out

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
                fresh = [sid for sid in stream.entries if sid > stream.last_delivered]
                if fresh:
                    now = anyio.current_time()
                    for sid in fresh[:count]:
                        stream.pel[sid] = _Nack(consumer, now)
                        stream.last_delivered = sid
                    return [self._reply(stream, sid) for sid in fresh[:count]]
                await stream.changed.wait()
            self._check()
            if stream is not None:  # deleted while we waited: heal now, like the next read
                self._group(user_id)
        return []

    async def ack(self, user_id: str, entry_id: str) -> int:
        """XACK: remove ``entry_id`` from the PEL (and from the index).

        Returns:
            1 if it was pending, else 0 (also when the stream or group is missing).

        Raises:
            ValueError: malformed entry ID.
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
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

    # -- reading at scale: wake-ups and the pipelined heartbeat -------------------------

    async def wake(self, holder_id: str, user_id: str, *, ttl_s: float) -> None:
        """Append ``user_id`` to the holder's wake list (expiring ``ttl_s`` seconds after
        the last push) and wake its waiter.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self._wake_now(holder_id, user_id, now, ttl_s)

    def _wake_now(self, holder_id: str, user_id: str, now: float, ttl_s: float) -> None:
        wakes = self._wakes.get(holder_id)
        if wakes is None or now >= wakes.expires_at:
            wakes = self._wakes[holder_id] = _ResultList(deque(), now + ttl_s)
        wakes.items.append(user_id)
        wakes.expires_at = now + ttl_s
        self._notify_wakes()

    async def wait_wakes(self, holder_id: str, *, timeout_s: float, count: int) -> list[str]:
        """Pop up to ``count`` user ids from the holder's wake list, waiting up to
        ``timeout_s`` seconds (0 = forever) for the first.

        Returns:
            The user ids, or [] on timeout.

        Raises:
            SubstrateUnavailable: marked unavailable (also while waiting).

        Cancellation: a cancelled wait pops nothing.
        """
        await self._enter()
        with anyio.CancelScope(deadline=_deadline(timeout_s)):
            while True:
                self._check()
                wakes = self._wakes.get(holder_id)
                if wakes is not None and anyio.current_time() >= wakes.expires_at:
                    del self._wakes[holder_id]
                    wakes = None
                if wakes is not None and wakes.items:
                    out = [wakes.items.popleft() for _ in range(min(count, len(wakes.items)))]
                    if not wakes.items:
                        del self._wakes[holder_id]
                    return out
                if self._wake_changed is None:
                    self._wake_changed = anyio.Event()
                await self._wake_changed.wait()
        return []

    def _notify_wakes(self) -> None:
        if self._wake_changed is not None:
            self._wake_changed.set()
            self._wake_changed = None

    async def heartbeat(
        self,
        beats: Sequence[Beat],
        *,
        ttl_s: float,
        consumer: str,
        reclaim_idle_ms: int,
        prune: bool = True,
    ) -> list[BeatReply]:
        """Per beat: refresh presence (and the catalogue) if absent or ours, probe the
        user's stream, drop idle empty consumers other than ``consumer``; the same rules
        as the Redis script.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        replies = []
        for beat in beats:
            key = presence_key(beat.user_id)
            holder = self._get(key, now)
            ours = holder is None or holder == beat.session_id
            if ours:
                self._set(key, beat.session_id, now, ttl_s)
                if self._get(tools_key(beat.user_id), now) != beat.catalogue:
                    self._set(tools_key(beat.user_id), beat.catalogue, now, None)
            stream = self._streams.get(beat.user_id)
            backlog = reclaim = False
            if stream is not None:
                backlog = any(sid > stream.last_delivered for sid in stream.entries)
                idle_s = reclaim_idle_ms / 1000
                reclaim = any(now >= n.delivery_time + idle_s for n in stream.pel.values())
                busy = {n.consumer for n in stream.pel.values()}
                for name, seen in list(stream.seen.items()) if prune else ():
                    if name != consumer and name not in busy and now >= seen + idle_s:
                        del stream.seen[name]
            index = self._index.get(beat.user_id, {})
            floor = min(stream.entries) if stream is not None and stream.entries else None
            trimmed = any(floor is None or sid < floor for sid in index)
            replies.append(BeatReply(ours, backlog, reclaim, trimmed))
        return replies

    # -- results -----------------------------------------------------------------------

    async def publish_progress(
        self, job_id: str, payload: str, *, ttl_s: float, maxlen: int = 64
    ) -> None:
        """Append ``payload`` to the job's progress log (keeping the newest ``maxlen``)
        and (re)set its TTL; wakes readers.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        log = self._progress.get(job_id)
        if log is None or log.expires_at <= now:
            log = self._progress[job_id] = _ProgressLog(deque(maxlen=max(1, maxlen)), now + ttl_s)
        log.entries.append((log.next_seq, payload))
        log.next_seq += 1
        log.expires_at = now + ttl_s
        log.changed.set()
        log.changed = anyio.Event()

    async def read_progress(
        self, job_id: str, after: str, *, block_ms: int
    ) -> list[tuple[str, str]]:
        """Entries after entry ID ``after`` ("0": all), waiting up to ``block_ms`` for a
        first one (0 = forever, as in Redis).

        Raises:
            ValueError: negative ``block_ms`` or a malformed ``after``.
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        if block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {block_ms!r}")
        seen = int(after.split("-", 1)[0])
        with anyio.move_on_after(block_ms / 1000 if block_ms else math.inf):
            while True:
                self._check()
                log = self._progress.get(job_id)
                if log is not None and log.expires_at <= anyio.current_time():
                    del self._progress[job_id]
                    log = None
                if log is not None:
                    found = [(f"{n}-0", p) for n, p in log.entries if n > seen]
                    if found:
                        return found
                    await log.changed.wait()
                else:
                    await anyio.sleep(0.01)
        return []

    # -- bookkeeping -------------------------------------------------------------------

    def _get(self, key: str, now: float) -> str | None:
        held = self._kv.get(key)
        if held is None:
            return None
        if now >= held[1]:
            del self._kv[key]
            return None
        return held[0]

    def _set(self, key: str, value: str, now: float, ttl_s: float | None) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self._kv[key] = (value, math.inf if ttl_s is None else now + ttl_s)

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
        """Indexed entries older than the stream's first entry, or all when the stream
        is gone.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        stream = self._streams.get(user_id)
        floor = min(stream.entries) if stream is not None and stream.entries else None
        index = self._index.get(user_id, {})
        pel = stream.pel if stream is not None else {}
        return [
            (_format_id(sid), job_id)
            for sid, job_id in sorted(index.items())
            if (floor is None or sid < floor) and sid not in pel
        ]

    async def forget(self, user_id: str, entry_id: str) -> bool:
        """Remove ``entry_id`` from the index; True if this call removed it.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        await self._enter()
        return self._index.get(user_id, {}).pop(_parse_id(entry_id), None) is not None

    async def set_job_state(
        self, user_id: str, job_id: str, state: JobState, *, ttl_s: float
    ) -> None:
        """Store what is known about ``job_id`` for ``ttl_s`` seconds.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        self._set(state_key(user_id, job_id), state.encode(), await self._enter(), ttl_s)

    async def claim_job(self, user_id: str, job_id: str, state: JobState, *, ttl_s: float) -> bool:
        """Store the state only if no live state exists for ``job_id``; True if stored.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        if self._get(state_key(user_id, job_id), now) is not None:
            return False
        self._set(state_key(user_id, job_id), state.encode(), now, ttl_s)
        return True

    async def get_job_state(self, user_id: str, job_id: str) -> JobState | None:
        """The stored state, or None.

        Raises:
            MalformedState: the stored value is not a job state.
            SubstrateUnavailable: marked unavailable.
        """
        raw = self._get(state_key(user_id, job_id), await self._enter())
        return None if raw is None else JobState.decode(raw)

    async def mark_delivered(
        self,
        user_id: str,
        job_id: str,
        state: JobState,
        *,
        ttl_s: float,
        deadline: float | None = None,
    ) -> Marked:
        """Expired (``deadline`` passed on :meth:`server_time`), else cancelled (flag
        set), else set the state and answer delivered.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        at = self.server_time()
        if deadline is not None and at >= deadline:
            return Marked("expired", at)
        if self._get(cancel_key(user_id, job_id), now) is not None:
            return Marked("cancelled", at)
        self._set(state_key(user_id, job_id), state.encode(), now, ttl_s)
        return Marked("delivered", at)

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """Flag ``job_id`` as cancelled for ``ttl_s`` seconds.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        self._set(cancel_key(user_id, job_id), "1", await self._enter(), ttl_s)

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """Store the user's tool catalogue (no TTL). Raises SubstrateUnavailable."""
        self._set(tools_key(user_id), catalogue, await self._enter(), None)

    async def get_catalogue(self, user_id: str) -> str | None:
        """The user's last tool catalogue, or None. Raises SubstrateUnavailable."""
        return self._get(tools_key(user_id), await self._enter())

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

    async def ping(self) -> None:
        """Raises SubstrateUnavailable when marked unavailable; otherwise returns."""
        await self._enter()

    async def aclose(self) -> None:
        """Nothing to release; state stays. Idempotent."""
        await anyio.lowlevel.checkpoint()
