"""The relay loop: moves entries from a user's stream to that user's socket.

Order of business (DESIGN.md; the seed's recovery lessons):

1. Drain this consumer's own pending entries from ``0`` first, skipping entries already
   in flight; as soon as nothing unserved is pending, switch to new entries, so the
   drain can never spin on its own un-acked entry. Drain again when an entry it skipped
   leaves the in-flight set: if an older session of the user in this process ended
   without an answer for it, it is ours and is redelivered now, not after the reclaim
   idle.
2. Read new entries (``>``) with ``BLOCK read_block_ms``.
3. When a read comes back empty (idle) or every ``reclaim_idle_s / 4``, run XAUTOCLAIM
   with min-idle = ``reclaim_idle_s`` to take over entries of dead consumers.

Entries are handed to ``dispatch(entry)`` which must run in a task of the caller's
nursery; the relay adds the entry ID to the in-flight set before dispatching (and
removes it again if ``dispatch`` raises or is cancelled before it started the task),
and the dispatcher removes it only after XACK (or when it gives up on the socket).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import attrs
from deskbridge_common import Timings

from . import _metrics
from ._errors import SubstrateUnavailable
from ._retry import READ_ERROR_BACKOFF_S, READ_ERROR_WARN_EVERY
from ._substrate import Entry, Substrate

log = logging.getLogger("deskbridge.hub.relay")

#: Entries asked for per read, and per XAUTOCLAIM batch.
READ_BATCH = 32
#: Most XAUTOCLAIM batches per reclaim pass (bounds one pass's work).
RECLAIM_MAX_BATCHES = 100
#: Lower bound on the time between reclaim passes while entries keep coming, seconds.
RECLAIM_MIN_EVERY_S = 1.0


class Flag(Protocol):
    """A one-way flag (``trio.Event``, ``anyio.Event``)."""

    def is_set(self) -> bool: ...


@attrs.define(eq=False)
class EntrySource:
    """Reads entries for one user on behalf of one consumer (per-user blocking reads).

    A shared multiplexed reader can replace it later without touching the relay.
    """

    substrate: Substrate
    user_id: str
    consumer: str
    timings: Timings
    batch: int = READ_BATCH

    async def pending(self) -> list[Entry]:
        return await self.substrate.read_pending(self.user_id, self.consumer, count=self.batch)

    async def new(self) -> list[Entry]:
        return await self.substrate.read_new(
            self.user_id, self.consumer, count=self.batch, block_ms=self.timings.read_block_ms
        )

    async def reclaim(self) -> tuple[list[Entry], list[str]]:
        """XAUTOCLAIM entries idle for at least ``reclaim_idle_s``; full scan."""
        entries: list[Entry] = []
        deleted: list[str] = []
        start = "0-0"
        min_idle_ms = int(self.timings.reclaim_idle_s * 1000)
        for _ in range(RECLAIM_MAX_BATCHES):  # bounded work per pass
            claimed = await self.substrate.autoclaim(
                self.user_id, self.consumer, min_idle_ms=min_idle_ms, start=start, count=self.batch
            )
            entries.extend(claimed.entries)
            deleted.extend(claimed.deleted_ids)
            start = claimed.next_start
            if start in ("0-0", "0"):
                break
        # Restarted processes leave their consumer names behind; drop the idle empty ones.
        await self.substrate.prune_consumers(self.user_id, idle_ms=min_idle_ms, keep=self.consumer)
        return entries, deleted


async def relay_loop(
    source: EntrySource,
    inflight: set[str],
    dispatch: Callable[[Entry], Awaitable[None]],
    *,
    on_deleted: Callable[[list[str]], Awaitable[None]] | None = None,
    stopped: Flag | None = None,
) -> None:
    """Run until cancelled, dispatching every entry of the user's stream exactly once
    per delivery.

    Args:
        source: where entries come from.
        inflight: entry IDs being served right now in this process (shared by every
            session of the user in this process); never dispatched again while present.
        dispatch: called with each fresh entry; must start the serving task and return
            promptly (the relay adds to ``inflight`` first).
        on_deleted: called after every reclaim pass with the pending entry IDs whose body
            no longer exists (XAUTOCLAIM deleted IDs; possibly none), so the session can
            answer their callers and sweep entries trimmed before anyone read them.
        stopped: once set (graceful shutdown, a newer session of the user) no new entry
            is read: the loop parks until cancelled, serving tasks finish on their own.

    Raises:
        Nothing of its own: substrate errors are logged and retried with bounded backoff.

    Cancellation: stops between reads; in-flight entries stay in the pending entries
    list and are redelivered by the next drain or reclaim.
    """
    draining = True
    # Own pending entries the last drain skipped because another session of this user
    # in this process was serving them. If that session ends without an ack (its socket
    # died; the sidecar reconnected here first), the entry is ours and idle: drain again
    # instead of waiting for the reclaim idle.
    skipped: set[str] = set()
    failures = 0
    reclaim_every_s = max(source.timings.reclaim_idle_s / 4, RECLAIM_MIN_EVERY_S)
    last_reclaim = -float("inf")
    while True:
        if stopped is not None and stopped.is_set():
            await anyio.sleep_forever()  # one-way: nothing to poll for
        if skipped and not skipped <= inflight:
            draining = True
        try:
            if draining:
                entries = await source.pending()
                skipped = {e.entry_id for e in entries if e.entry_id in inflight}
                fresh = [e for e in entries if e.entry_id not in inflight]
                if not fresh:
                    draining = False
                    continue
            else:
                entries = await source.new()
                fresh = [e for e in entries if e.entry_id not in inflight]
                now = anyio.current_time()
                if not entries or now - last_reclaim >= reclaim_every_s:
                    last_reclaim = now
                    claimed, deleted = await source.reclaim()
                    _metrics.entries_reclaimed(len(claimed))
                    fresh += [e for e in claimed if e.entry_id not in inflight]
                    if on_deleted is not None:
                        await on_deleted(deleted)
            if failures:
                log.info("relay for %s: substrate back after %d failures", source.user_id, failures)
            failures = 0
        except SubstrateUnavailable as exc:
            delay = READ_ERROR_BACKOFF_S[min(failures, len(READ_ERROR_BACKOFF_S) - 1)]
            failures += 1
            # WARNING for the first failure, then about once a minute; INFO in between.
            level = logging.WARNING if failures % READ_ERROR_WARN_EVERY == 1 else logging.INFO
            log.log(
                level,
                "relay for %s: %s; retrying in %.2f s (failure %d)",
                source.user_id,
                exc,
                delay,
                failures,
            )
            await anyio.sleep(delay)
            draining = True
            continue
        seen: set[str] = set()
        for entry in fresh:
            if entry.entry_id in seen or entry.entry_id in inflight:
                continue
            seen.add(entry.entry_id)
            inflight.add(entry.entry_id)
            try:
                await dispatch(entry)
            except BaseException:
                # Never started (cancelled while waiting for an in-flight slot: the
                # socket went away): a stale in-flight mark would hide the entry from
                # every drain and reclaim in this process for good.
                inflight.discard(entry.entry_id)
                raise
