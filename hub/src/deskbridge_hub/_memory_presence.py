"""Presence, process liveness, the tool catalogue, wake-ups and the pipelined heartbeat
of ``MemorySubstrate`` (mixed in), with the semantics of the Redis substrate's
commands and scripts (checked by the same contract suite)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from ._memory_caller import _WakeList
from ._memory_streams import StreamID, _deadline, _Stream
from ._substrate import (
    Beat,
    BeatReply,
    CancelAsked,
    Pushed,
    Superseded,
    WakeItem,
    presence_key,
    proc_key,
    tools_key,
)


def _received(item: WakeItem) -> WakeItem:
    """A popped wake list item; a pushed entry dated with the local clock now (as the
    Redis substrate's ``wait_wakes``)."""
    if not isinstance(item, Pushed):
        return item
    entry = attrs.evolve(item.entry, received_at=anyio.current_time())
    return Pushed(item.user_id, entry)


class MemoryPresenceCommands:
    """Presence, liveness, catalogue and wake-up methods of ``MemorySubstrate``."""

    _kv: dict[str, tuple[str, float]]
    _streams: dict[str, _Stream]
    _index: dict[str, dict[StreamID, str]]
    _wakes: dict[str, _WakeList]
    _wake_changed: anyio.Event | None
    _daemon_records: dict[str, tuple[dict[str, str], float]]
    _enter: Callable[[], Any]
    _enter_ttl: Callable[[float], Any]
    _check: Callable[[], None]
    _get: Callable[[str, float], str | None]
    _set: Callable[[str, str, float, float | None], None]

    # -- presence ----------------------------------------------------------------------

    async def set_presence(self, user_id: str, session_id: str, ttl_s: float) -> str | None:
        """SET presence = session_id with a TTL of ``ttl_s`` seconds (> 0).

        Returns:
            The session id it replaced (live), or None.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        old = self._get(presence_key(user_id), now)
        self._set(presence_key(user_id), session_id, now, ttl_s)
        return old

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

    async def set_liveness(
        self,
        holder_id: str,
        ttl_s: float,
        *,
        consumer: str | None = None,
        max_pending: int = 32,
    ) -> bool:
        """Mark the hub process ``holder_id`` alive for ``ttl_s`` seconds (the value:
        ``"<consumer> <max_pending>"``, consumer None: ``1``).

        Returns:
            True if it was still marked alive (False: expired, or never set).

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        was = self._get(proc_key(holder_id), now) is not None
        value = "1" if consumer is None else f"{consumer} {max_pending}"
        self._set(proc_key(holder_id), value, now, ttl_s)
        return was

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

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """Store the user's tool catalogue (no TTL). Raises SubstrateUnavailable."""
        self._set(tools_key(user_id), catalogue, await self._enter(), None)

    async def get_catalogue(self, user_id: str) -> str | None:
        """The user's last tool catalogue, or None. Raises SubstrateUnavailable."""
        return self._get(tools_key(user_id), await self._enter())

    # -- reading at scale: wake-ups and the pipelined heartbeat -------------------------

    async def wake(self, holder_id: str, user_id: str, *, ttl_s: float) -> None:
        """Append ``user_id`` to the holder's wake list (expiring ``ttl_s`` seconds after
        the last push) and wake its waiter.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        self._wake_now(holder_id, user_id, now, ttl_s)

    async def notify_superseded(
        self,
        holder_id: str,
        user_id: str,
        session_id: str,
        *,
        ttl_s: float,
        check: bool = False,
    ) -> None:
        """Append a :class:`Superseded` notice to the holder's wake list (as :meth:`wake`).

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        self._wake_now(holder_id, Superseded(user_id, session_id, check), now, ttl_s)

    async def notify_cancel(
        self, holder_id: str, user_id: str, job_id: str, *, ttl_s: float
    ) -> None:
        """Append ``user_id`` and a :class:`CancelAsked` notice to the holder's wake list
        (as :meth:`wake`).

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        self._wake_now(holder_id, user_id, now, ttl_s)
        self._wake_now(holder_id, CancelAsked(user_id, job_id), now, ttl_s)

    def _wake_now(self, holder_id: str, item: WakeItem, now: float, ttl_s: float) -> None:
        wakes = self._wakes.get(holder_id)
        if wakes is None or now >= wakes.expires_at:
            wakes = self._wakes[holder_id] = _WakeList(deque(), now + ttl_s)
        wakes.items.append(item)
        wakes.expires_at = now + ttl_s
        self._notify_wakes()

    async def wait_wakes(self, holder_id: str, *, timeout_s: float, count: int) -> list[WakeItem]:
        """Pop up to ``count`` items from the holder's wake list, waiting up to
        ``timeout_s`` seconds (0 = forever) for the first.

        Returns:
            The user ids, pushed entries (:class:`Pushed`) and supersede notices
            (:class:`Superseded`) in push order, or [] on timeout.

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
                    out = [
                        _received(wakes.items.popleft())
                        for _ in range(min(count, len(wakes.items)))
                    ]
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
        record_ttl_s: float | None = None,
    ) -> list[BeatReply]:
        """Per beat: refresh presence if absent or ours (a newer session's value stays,
        its TTL set to ``ttl_s``), write the beat's catalogue if it has one, probe
        the user's stream (the index only when the group is not quiet or the beat is
        deep), drop idle empty consumers other than ``consumer``; the same rules as the
        Redis script (a deep beat keeps the daemon record ``record_ttl_s`` more).

        Raises:
            ValueError: ``ttl_s`` (or ``record_ttl_s``) not positive. SubstrateUnavailable:
                marked unavailable.
        """
        if record_ttl_s is not None and not record_ttl_s > 0:
            raise ValueError(f"record_ttl_s must be > 0 s, got {record_ttl_s!r}")
        now = await self._enter()
        replies = []
        for beat in beats:
            key = presence_key(beat.user_id)
            holder = self._get(key, now)
            if holder is not None and holder != beat.session_id:
                self._set(key, holder, now, ttl_s)  # put back, as the script does
                replies.append(BeatReply(False))
                continue
            self._set(key, beat.session_id, now, ttl_s)
            # a deep beat without a catalogue looks whether the store lost it
            lost = beat.deep and beat.catalogue is None
            lost = lost and self._get(tools_key(beat.user_id), now) is None
            if beat.catalogue is not None:
                self._set(tools_key(beat.user_id), beat.catalogue, now, None)
            record = self._daemon_records.get(beat.user_id)
            if beat.deep and record_ttl_s is not None and record is not None and now < record[1]:
                self._daemon_records[beat.user_id] = (record[0], now + record_ttl_s)
            stream = self._streams.get(beat.user_id)
            backlog = reclaim = False
            quiet = False
            if stream is not None:
                backlog = any(sid > stream.last_delivered for sid in stream.entries)
                idle_s = reclaim_idle_ms / 1000
                reclaim = any(now >= n.delivery_time + idle_s for n in stream.pel.values())
                busy = {n.consumer for n in stream.pel.values()}
                if prune and len(stream.seen) > 1:
                    for name, seen in list(stream.seen.items()):
                        if name != consumer and name not in busy and now >= seen + idle_s:
                            del stream.seen[name]
                # Redis' view: lag 0 (and computable) and nothing pending
                lag_known = stream.max_deleted <= stream.last_delivered
                quiet = not backlog and not stream.pel and lag_known
            trimmed = False
            if not quiet or beat.deep:
                index = self._index.get(beat.user_id, {})
                floor = min(stream.entries) if stream is not None and stream.entries else None
                trimmed = any(floor is None or sid < floor for sid in index)
                # deleted from the middle (XDEL): a deep beat looks (the script's price)
                entries = stream.entries if stream is not None else {}
                trimmed = trimmed or (beat.deep and any(sid not in entries for sid in index))
            replies.append(BeatReply(True, backlog, reclaim, trimmed, taken=holder is None or lost))
        return replies
