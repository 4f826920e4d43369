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

Blocking reads wait on anyio events, never by polling. The methods live in mixins, one
module per concern (as the contract is split in ``_substrate``): ``_memory_presence``
(presence, liveness, catalogue, wake-ups, heartbeat), ``_memory_streams`` (the job
stream, its consumer group and entry index), ``_memory_jobs`` (progress, job state),
``_memory_caller`` (the caller's step, results, mailboxes), ``_memory_finish`` (the
holder's finishing step and ``publish_result``), ``_memory_desktop`` (the daemon
record, takeover, asleep) and ``_directory``; this
module composes them and owns the shared state and its bookkeeping. Test helpers (not
part of the contract): :meth:`MemorySubstrate.delete_stream`,
:meth:`MemorySubstrate.set_unavailable`, :meth:`MemorySubstrate.pending_count`,
:meth:`MemorySubstrate.spoil_key`, :meth:`MemorySubstrate.keys_of`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import TracebackType

import anyio
import anyio.lowlevel
import attrs

from ._directory import MemoryDirectory
from ._errors import SubstrateUnavailable
from ._keys import daemons_key, index_key, jobs_key
from ._mcp_store import MemoryMcpSessions
from ._memory_caller import MemoryCallerCommands, _Mailbox, _ResultList, _Waiters, _WakeList
from ._memory_desktop import MemoryDesktopCommands
from ._memory_finish import MemoryFinishCommands
from ._memory_jobs import MemoryJobCommands, _ProgressLog
from ._memory_presence import MemoryPresenceCommands
from ._memory_streams import (
    MemoryStreamCommands,
    StreamID,
    _parse_id,
    _Stream,
)
from ._revocation import MemoryRevocations


@attrs.define(eq=False)
class MemorySubstrate(
    MemoryPresenceCommands,
    MemoryStreamCommands,
    MemoryJobCommands,
    MemoryCallerCommands,
    MemoryDesktopCommands,
    MemoryFinishCommands,
    MemoryDirectory,
    MemoryRevocations,
    MemoryMcpSessions,
):
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
    _hashes: dict[str, tuple[dict[str, str], float]] = attrs.field(factory=dict, init=False)
    _daemon_records: dict[str, tuple[dict[str, str], float]] = attrs.field(factory=dict, init=False)
    _mailboxes: dict[str, _Mailbox] = attrs.field(factory=dict, init=False)
    _wakes: dict[str, _WakeList] = attrs.field(factory=dict, init=False)
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

    def delete_entry(self, user_id: str, entry_id: str) -> None:
        """Delete one entry from the user's stream, as an operator's XDEL: its body goes,
        its index record and any pending entries list entry stay, and the stream's
        largest deleted ID moves up to it (Redis 7: ``max-deleted-entry-id``)."""
        stream = self._streams.get(user_id)
        sid = _parse_id(entry_id)
        if stream is not None and stream.entries.pop(sid, None) is not None:
            stream.max_deleted = max(stream.max_deleted, sid)

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

    def keys_of(self, user_id: str) -> list[str]:
        """The Redis names of the live keys this substrate holds in ``user_id``'s hash
        tag (as ``SCAN MATCH bridge:*{<user_id>}*`` lists them on Redis), sorted: the
        stream (with its group) once made, the entry index while it has entries, every
        string key (presence, state, idempotency record, ...) and result list not
        expired, the daemon record."""
        now = anyio.current_time()
        tag = f"{{{user_id}}}"
        found = [k for k, (_, until) in self._kv.items() if tag in k and now < until]
        found += [k for k, lst in self._results.items() if tag in k and now < lst.expires_at]
        found += [k for k, (_, until) in self._hashes.items() if tag in k and now < until]
        if user_id in self._streams:
            found.append(jobs_key(user_id))
        if self._index.get(user_id):
            found.append(index_key(user_id))
        held = self._daemon_records.get(user_id)
        if held is not None and now < held[1]:
            found.append(daemons_key(user_id))
        return sorted(found)

    # -- internals ---------------------------------------------------------------------

    async def _enter(self) -> float:
        """Checkpoint, then fail if unavailable; returns the current time."""
        await anyio.lowlevel.checkpoint()
        self._check()
        return anyio.current_time()

    async def _enter_ttl(self, ttl_s: float) -> float:
        """:meth:`_enter`, then refuse a ``ttl_s`` that is not positive (ValueError, after
        the unavailability check, as Redis answers an outage before it parses PX)."""
        now = await self._enter()
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        return now

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

    def _extend(self, key: str, now: float, ttl_s: float) -> None:
        """Make a live ``key`` expire no sooner than ``ttl_s`` from ``now`` (Redis'
        ``PEXPIRE ... GT``: never shortened, an absent key stays absent)."""
        if self._get(key, now) is not None:
            value, expires_at = self._kv[key]
            self._kv[key] = (value, max(expires_at, now + ttl_s))

    def _shorten(self, key: str, now: float, ttl_s: float) -> None:
        """Make a live ``key`` expire no later than ``ttl_s`` from ``now`` (Redis'
        ``PEXPIRE ... LT``: never lengthened, an absent key stays absent)."""
        if self._get(key, now) is not None:
            value, expires_at = self._kv[key]
            self._kv[key] = (value, min(expires_at, now + ttl_s))

    async def ping(self) -> None:
        """Raises SubstrateUnavailable when marked unavailable; otherwise returns."""
        await self._enter()

    async def aclose(self) -> None:
        """Nothing to release; state stays. Idempotent."""
        await anyio.lowlevel.checkpoint()

    def history_changes(self) -> int:
        """Always 0: this store never loses writes it acknowledged."""
        return 0

    def health_warnings(self) -> tuple[str, ...]:
        """Always empty: no permissions to lack."""
        return ()
