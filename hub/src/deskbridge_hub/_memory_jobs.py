"""Job records of ``MemorySubstrate`` (mixed in): the progress log
(``publish_progress`` / ``read_progress``) and the job state (``set_job_state``,
``claim_job``, ``get_job_state``, ``mark_delivered``, ``restore_delivery``,
``request_cancel``, ``cancel_requested``), with the
semantics of the Redis substrate (checked by the same contract suite)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from ._jobstate import FORWARDED, JobState, MalformedState, Stage, delivered_again
from ._substrate import (
    CANCEL_SENT,
    Entry,
    JobOwner,
    Marked,
    cancel_key,
    fence_key,
    idem_key,
    job_keys,
    owner_key,
    presence_key,
    state_key,
)


def _number(text: str | None) -> float | None:
    """A stream field as Lua's ``tonumber`` reads it, or None."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


@attrs.define(eq=False)
class _ProgressLog:
    """One job's progress stream: (sequence, payload) pairs, newest last."""

    entries: deque[tuple[int, str]]
    expires_at: float
    next_seq: int = 1
    changed: anyio.Event = attrs.field(factory=anyio.Event)


class MemoryJobCommands:
    """Progress and job-state methods of ``MemorySubstrate``."""

    _progress: dict[str, _ProgressLog]
    _kv: dict[str, tuple[str, float]]
    _enter: Callable[[], Any]
    _enter_ttl: Callable[[float], Any]
    _check: Callable[[], None]
    _get: Callable[[str, float], str | None]
    _set: Callable[[str, str, float, float | None], None]
    _extend: Callable[[str, float, float], None]
    server_time: Callable[[], float]
    _read_new_nowait: Callable[[str, str, int], list[Entry]]
    _xadd: Callable[..., str]

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
        now = await self._enter_ttl(ttl_s)
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

    # -- job state ----------------------------------------------------------------------

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
        idempotency_key: str | None = None,
    ) -> Marked:
        """Expired (``deadline`` passed on :meth:`server_time`, and the stored state
        does not say the job was forwarded before), else, with the cancel flag set,
        cancelled (never forwarded) or in doubt (forwarded before: the epoch is raised,
        the state untouched), else set
        the state, raise the job's claim epoch (kept until the deadline + ``ttl_s``, at
        least ``ttl_s``), keep ``idempotency_key``'s record (if it names the job) at
        least ``ttl_s`` and answer delivered with the epoch.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        return self._mark(user_id, job_id, state, ttl_s, deadline, now, idempotency_key)

    async def read_new_delivered(
        self,
        user_id: str,
        consumer: str,
        *,
        count: int,
        state: JobState,
        ttl_s: float,
        session_id: str | None = None,
    ) -> list[Entry]:
        """``read_new`` (no block) and the mark of every job read, with no checkpoint in
        between (see ``RedisSubstrate.read_new_delivered``); nothing when presence names
        another session than ``session_id``.

        Raises:
            ValueError: ``ttl_s`` not positive. SubstrateUnavailable: marked unavailable.
        """
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        now = await self._enter()
        if session_id:
            holder = self._get(presence_key(user_id), now)
            if holder is not None and holder != session_id:
                return []
        entries = self._read_new_nowait(user_id, consumer, count)
        out = []
        for entry in entries:
            fields = entry.fields or {}
            job_id, deadline = fields.get("job_id"), _number(fields.get("deadline"))
            if job_id and deadline is not None and "control" not in fields:
                key = fields.get("idempotency_key")
                marked = self._mark(user_id, job_id, state, ttl_s, deadline, now, key)
                entry = Entry(entry.entry_id, entry.fields, marked)
            out.append(entry)
        return out

    def _mark(
        self,
        user_id: str,
        job_id: str,
        state: JobState,
        ttl_s: float,
        deadline: float | None,
        now: float,
        idempotency_key: str | None = None,
    ) -> Marked:
        at = self.server_time()
        before = self._forwarded(user_id, job_id, now)
        if deadline is not None and at >= deadline and before is None:
            return Marked("expired", at)
        if self._get(cancel_key(user_id, job_id), now) is not None:
            if before is None:
                return Marked("cancelled", at)
            other = delivered_again(before, state)[1]
            epoch = self._raise(user_id, job_id, ttl_s, deadline, now)
            return Marked("in_doubt", at, epoch, other)
        state, elsewhere = delivered_again(before, state)
        self._set(state_key(user_id, job_id), state.encode(), now, ttl_s)
        if idempotency_key is not None:  # the key's record, if it names this job
            ikey = idem_key(user_id, idempotency_key)
            if (self._get(ikey, now) or "").startswith(job_id + " "):
                self._extend(ikey, now, ttl_s)
        epoch = self._raise(user_id, job_id, ttl_s, deadline, now)
        return Marked("delivered", at, epoch, elsewhere)

    def _raise(
        self, user_id: str, job_id: str, ttl_s: float, deadline: float | None, now: float
    ) -> int:
        """Raise the job's claim epoch, kept until the deadline + ``ttl_s``."""
        at = self.server_time()
        fence = fence_key(user_id, job_id)
        epoch = int(self._get(fence, now) or 0) + 1
        keep_s = ttl_s + (max(deadline - at, 0.0) if deadline is not None else 0.0)
        self._set(fence, str(epoch), now, keep_s)
        return epoch

    def _forwarded(self, user_id: str, job_id: str, now: float) -> JobState | None:
        """The stored state if it says the job was forwarded to a desktop, else None."""
        raw = self._get(state_key(user_id, job_id), now)
        try:
            state = None if raw is None else JobState.decode(raw)
        except MalformedState:
            return None
        return state if state is not None and state.stage in FORWARDED else None

    async def unmark_delivered(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """See ``Substrate.unmark_delivered``.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        fence = fence_key(user_id, job_id)
        stored = self._forwarded(user_id, job_id, now)
        if self._get(fence, now) != str(epoch) or stored is None:
            return False
        if stored.stage is not Stage.DELIVERED:
            return False
        self._set(state_key(user_id, job_id), state.encode(), now, ttl_s)
        self._kv.pop(fence, None)
        return True

    async def restore_delivery(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """See ``Substrate.restore_delivery``.

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        skey, fence = state_key(user_id, job_id), fence_key(user_id, job_id)
        raw = self._get(skey, now)
        try:
            stored = None if raw is None else JobState.decode(raw)
        except MalformedState:
            return False
        if stored is None or stored.stage is not Stage.QUEUED:
            return False
        if int(self._get(fence, now) or 0) > epoch:
            return False
        self._set(skey, state.encode(), now, ttl_s)
        held = self._kv.get(fence)
        keep_s = ttl_s if held is None else max(ttl_s, held[1] - now)
        self._set(fence, str(epoch), now, keep_s)
        return True

    async def cancel_requested(self, user_id: str, job_id: str) -> bool:
        """Whether ``job_id`` has its cancel flag (``request_cancel``, ``send_cancel``).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        return self._get(cancel_key(user_id, job_id), now) is not None

    async def keep_job(
        self, user_id: str, job_id: str, *, ttl_s: float, idempotency_key: str | None = None
    ) -> None:
        """Extend each of the job's records that exists to live at least ``ttl_s`` more
        (state, claim epoch, cancel flag, idempotency record, owner record), as
        ``RedisSubstrate.keep_job``.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        for key in job_keys(user_id, job_id, idempotency_key):
            self._extend(key, now, ttl_s)

    async def keep_job_ids(self, job_ids: Sequence[str], *, ttl_s: float) -> None:
        """Extend each chosen job id's owner record that exists, unless it says its job
        is answered, to live at least ``ttl_s`` more, as ``RedisSubstrate.keep_job_ids``.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter_ttl(ttl_s)
        for job_id in job_ids:
            raw = self._get(owner_key(job_id), now)
            if raw is not None and not JobOwner.decode(raw).answered:
                self._extend(owner_key(job_id), now, ttl_s)

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """Flag ``job_id`` as cancelled for ``ttl_s`` seconds unless it is flagged
        already (that flag stays as it is).

        Raises:
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        self._flag_cancel(cancel_key(user_id, job_id), now, ttl_s)

    async def send_cancel(
        self, user_id: str, job_id: str, *, ttl_s: float, maxlen: int
    ) -> str | None:
        """Flag ``job_id`` as :meth:`request_cancel` does and, unless the flag says its
        control entry was sent, add the indexed ``control: cancel`` entry (trimmed to
        ``maxlen``) and mark the flag ``sent`` (its TTL kept), in one step (no
        checkpoint between), as ``RedisSubstrate.send_cancel``.

        Returns:
            The control entry's ID, or None when one was sent before.

        Raises:
            ValueError: ``maxlen`` < 1 or ``ttl_s`` not positive.
            SubstrateUnavailable: marked unavailable.
        """
        if maxlen < 1 or not ttl_s > 0:
            raise ValueError(f"send_cancel needs maxlen >= 1 and ttl_s > 0, got {maxlen}, {ttl_s}")
        now = await self._enter()
        key = cancel_key(user_id, job_id)
        if self._flag_cancel(key, now, ttl_s) == CANCEL_SENT:
            return None
        control = {"control": "cancel", "job_id": job_id}
        entry_id = self._xadd(user_id, control, now, maxlen=maxlen, start_within_s=None)
        self._kv[key] = (CANCEL_SENT, self._kv[key][1])
        return entry_id

    def _flag_cancel(self, key: str, now: float, ttl_s: float) -> str:
        """SET ``key`` 1 NX PX ttl (no checkpoint); its value now."""
        flag = self._get(key, now)
        if flag is None:
            self._set(key, "1", now, ttl_s)
        return flag or "1"

