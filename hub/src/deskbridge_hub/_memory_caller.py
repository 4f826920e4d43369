"""The caller's path of ``MemorySubstrate`` (mixed in): the enqueue step, results,
notification mailboxes and job owner records, with the semantics of ``_redis_caller``'s
scripts (checked by the same contract suite)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import attrs

from ._jobstate import JobState, Stage
from ._substrate import (
    Entry,
    JobOwner,
    Marked,
    Pushed,
    Submission,
    Submitted,
    WakeItem,
    idem_key,
    owner_key,
    presence_key,
    proc_key,
    result_key,
    state_key,
    tools_key,
)


@attrs.define(eq=False)
class _ResultList:
    items: deque[str]
    expires_at: float


@attrs.define(eq=False)
class _WakeList:
    """A holder process's wake list (``bridge:wake:{holder}``): user ids, pushed
    entries, supersede and revocation notices."""

    items: deque[WakeItem]
    expires_at: float


@attrs.define(eq=False)
class _Waiters:
    """Tasks waiting on one result list; the event fires on the next publish."""

    event: anyio.Event
    count: int = 0


@attrs.define(eq=False)
class _Mailbox:
    """A process's notification list (``bridge:notify:{...}``) and its wake-up event."""

    items: deque[str] = attrs.Factory(deque)
    expires_at: float = math.inf
    changed: anyio.Event = attrs.Factory(anyio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


def _timeout_deadline(timeout_s: float) -> float:
    if timeout_s < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout_s!r}")
    return math.inf if timeout_s == 0 else anyio.current_time() + timeout_s


def _sha1_hex(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class MemoryCallerCommands:
    """Caller-path methods of ``MemorySubstrate`` (see the module docstring)."""

    _results: dict[str, _ResultList]
    _result_waiters: dict[str, _Waiters]
    _mailboxes: dict[str, _Mailbox]
    _progress: dict[str, Any]
    _kv: dict[str, tuple[str, float]]
    _daemon_records: dict[str, tuple[dict[str, str], float]]
    _index: dict[str, dict[Any, str]]
    _enter: Callable[[], Any]
    _check: Callable[[], None]
    _get: Callable[[str, float], str | None]
    _set: Callable[[str, str, float, float | None], None]
    _result_list: Callable[[str, float], _ResultList | None]
    server_time: Callable[[], float]
    enqueue: Any

    async def submit(self, user_id: str, submission: Submission) -> Submitted:
        """The caller's one step, atomically (no checkpoint between the checks and the
        writes). Raises ValueError / SubstrateUnavailable as ``RedisSubstrate.submit``."""
        now = await self._enter()
        sub = submission
        if not sub.start_within_s >= 0 or sub.maxlen < 1:
            raise ValueError("submit needs start_within_s >= 0 and maxlen >= 1")
        if sub.give_up_s is not None and not sub.give_up_s > 0:
            raise ValueError(f"submit needs give_up_s > 0, got {sub.give_up_s!r}")
        if sub.attach_only and sub.idempotency_key is None:
            raise ValueError("submit with attach_only needs an idempotency_key")
        # atomic at the call's own instant: never ``late``, and the deadline counts from now
        ikey = idem_key(user_id, sub.idempotency_key or sub.job_id)
        skey = state_key(user_id, sub.job_id)

        def again() -> Submitted:
            # the call's own job id (``Submission.own``): its job found here was enqueued
            # by an earlier run of this step, answered as then (as the Redis script)
            presence = self._get(presence_key(user_id), now)
            alive = sub.alive_holder is not None and (
                self._get(proc_key(sub.alive_holder), now) is not None
            )
            return Submitted("queued", entry_id="", presence=presence or "", holder_alive=alive)

        if sub.idempotency_key is not None:
            record = self._get(ikey, now)
            if record is not None and sub.own and record.split(" ", 1)[0] == sub.job_id:
                return again()
            if record is not None:
                return Submitted("indexed", index_value=record, server_time=self.server_time())
        if sub.attach_only:
            return Submitted("job_id_in_use")
        if sub.own and self._get(skey, now) is not None:
            return again()
        presence = self._get(presence_key(user_id), now)
        if presence is None:
            return Submitted("offline")
        holder, dot, _ = presence.rpartition(".")
        if dot and holder and holder != sub.alive_holder:
            return Submitted("holder", presence=presence)
        consumer = None
        if sub.alive_holder is not None:
            consumer = self._get(proc_key(sub.alive_holder), now)
            if consumer is None:  # that process is not alive (as the Redis script)
                return Submitted("holder", presence=presence)
        if sub.catalogue_sha1 is not None:
            catalogue = self._get(tools_key(user_id), now)
            sha = "" if catalogue is None else _sha1_hex(catalogue)
            if sha != sub.catalogue_sha1:
                return Submitted("catalogue", catalogue=catalogue)
        if len(self._index.get(user_id, {})) >= sub.maxlen:  # as the script's HLEN
            return Submitted("queue_full")
        if self._get(skey, now) is not None:
            return Submitted("job_id_in_use")
        self._set(skey, sub.state.encode(), now, sub.state_ttl_s)
        entry_id = self._enqueue_now(user_id, sub)
        if sub.idempotency_key is not None:
            # the entry's own deadline, appended as the Redis script appends the one it
            # stamped (a second clock reading could fall in the next millisecond)
            deadline = self._entry_field(user_id, entry_id, "deadline")
            self._set(ikey, f"{sub.index_value} {deadline}", now, sub.index_ttl_s)
        if sub.write_owner:
            self._set(owner_key(sub.job_id), sub.owner.encode(), now, sub.state_ttl_s)
        pushed = None
        if sub.alive_holder is not None:
            pushed = self._push_read(user_id, sub, entry_id, presence, consumer, now)
            self._wake_now(sub.alive_holder, pushed or user_id, now, sub.wake_ttl_s)
        return Submitted(
            "queued",
            entry_id=entry_id,
            presence=presence,
            pushed=pushed is not None,
            holder_alive=consumer is not None,
        )

    def _push_read(
        self,
        user_id: str,
        sub: Submission,
        entry_id: str,
        presence: str,
        consumer: str | None,
        now: float,
    ) -> Pushed | None:
        """Push delivery (``Submission.delivered_ttl_s``), as the Redis script: read the
        new entry for the holder's registered consumer and mark it delivered, when it is
        the group's only undelivered entry."""
        if sub.delivered_ttl_s is None:
            return None
        reader, _, most = (consumer or "").partition(" ")
        if not most.isdigit() or self._lag(user_id) != 1:
            return None
        if self._pending_count(user_id) >= int(most):  # the session is full
            return None
        (entry,) = self._read_new_nowait(user_id, reader, 1)
        marked = None
        if entry.entry_id == entry_id:
            daemon = self._daemon_of(user_id, reader, now)  # whom that consumer serves
            state = JobState(
                Stage.DELIVERED, user_id, at=self.server_time(), session_id=presence,
                daemon_id=daemon,
            )  # fmt: skip
            deadline = float(self._entry_field(user_id, entry_id, "deadline") or 0)
            marked = self._mark(
                user_id, sub.job_id, state, sub.delivered_ttl_s, deadline, now,
                sub.idempotency_key,
            )  # fmt: skip
        return Pushed(user_id, Entry(entry.entry_id, entry.fields, marked))

    def _daemon_of(self, user_id: str, consumer: str, now: float) -> str | None:
        """The daemon record's entry for ``consumer`` (``HGET bridge:daemons:{user}``)."""
        held = self._daemon_records.get(user_id)
        return held[0].get(consumer) if held is not None and now < held[1] else None

    def _lag(self, user_id: str) -> int | None:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    def _pending_count(self, user_id: str) -> int:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    def _read_new_nowait(self, user_id: str, consumer: str, count: int) -> list[Entry]:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

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
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    def _wake_now(self, holder_id: str, item: WakeItem, now: float, ttl_s: float) -> None:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    def _enqueue_now(self, user_id: str, sub: Submission) -> str:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    def _entry_field(self, user_id: str, entry_id: str, name: str) -> str | None:
        raise NotImplementedError  # pragma: no cover - provided by MemorySubstrate

    async def claim_job_id(
        self, job_id: str, owner: JobOwner, *, ttl_s: float, replace: bool = False
    ) -> bool:
        """Store the owner record unless one is live (``replace``: unless the live one
        is marked answered); True if stored."""
        now = await self._enter()
        held = self._get(owner_key(job_id), now)
        if held is not None and (not replace or JobOwner.decode(held).answered):
            return False
        self._set(owner_key(job_id), owner.encode(), now, ttl_s)
        return True

    async def job_owner(self, job_id: str) -> JobOwner | None:
        """The owner record, or None."""
        raw = self._get(owner_key(job_id), await self._enter())
        return None if raw is None else JobOwner.decode(raw)

    async def forget_job_id(self, job_id: str, owner: JobOwner) -> None:
        """Drop the owner record if it is still ``owner``'s."""
        now = await self._enter()
        if self._get(owner_key(job_id), now) == owner.encode():
            self._kv.pop(owner_key(job_id), None)

    def _mailbox(self, mailbox: str, now: float) -> _Mailbox:
        box = self._mailboxes.get(mailbox)
        if box is None or (now >= box.expires_at and not box.items):
            box = self._mailboxes[mailbox] = _Mailbox()
        elif now >= box.expires_at:
            box.items.clear()
        return box

    async def get_result(self, user_id: str, job_id: str) -> str | None:
        """The first payload of the job's result list (not popped), or None."""
        lst = self._result_list(result_key(user_id, job_id), await self._enter())
        return None if lst is None else lst.items[0]

    async def read_notifications(
        self, mailbox: str, *, count: int, block_ms: int
    ) -> list[tuple[str, str]]:
        """Pop up to ``count`` notifications, waiting up to ``block_ms`` (0: forever).

        Raises:
            ValueError: ``block_ms`` < 0 or ``count`` < 1.
            SubstrateUnavailable: marked unavailable (also while waiting).

        Cancellation: nothing is popped for a cancelled read.
        """
        if block_ms < 0 or count < 1:
            raise ValueError("read_notifications needs block_ms >= 0 and count >= 1")
        await self._enter()
        with anyio.CancelScope(deadline=_timeout_deadline(block_ms / 1000)):
            while True:
                self._check()
                box = self._mailbox(mailbox, anyio.current_time())
                if box.items:
                    out: list[tuple[str, str]] = []
                    while box.items and len(out) < count:
                        job_id, _, payload = box.items.popleft().partition(" ")
                        out.append((job_id, payload))
                    return out
                await box.changed.wait()
        return []

    async def wait_result(self, user_id: str, job_id: str, *, timeout_s: float) -> str | None:
        """BLPOP: pop the first payload, waiting up to ``timeout_s`` seconds for one
        (0 = forever, as in Redis). An expired list is gone.

        Returns:
            The payload, or None on timeout.

        Raises:
            ValueError: negative ``timeout_s``.
            SubstrateUnavailable: marked unavailable (also while waiting).

        Cancellation: a cancelled wait takes nothing from the list.
        """
        await self._enter()
        key = result_key(user_id, job_id)
        with anyio.CancelScope(deadline=_timeout_deadline(timeout_s)):
            while True:
                self._check()
                lst = self._result_list(key, anyio.current_time())
                if lst is not None:
                    payload = lst.items.popleft()
                    if not lst.items:
                        del self._results[key]
                    return payload
                waiters = self._result_waiters.get(key)
                if waiters is None:
                    waiters = self._result_waiters[key] = _Waiters(anyio.Event())
                waiters.count += 1
                try:
                    await waiters.event.wait()
                finally:
                    waiters.count -= 1
                    if not waiters.count and self._result_waiters.get(key) is waiters:
                        del self._result_waiters[key]
        return None
