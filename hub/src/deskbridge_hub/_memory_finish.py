"""The holder's finishing step of ``MemorySubstrate`` (mixed in): ``finish`` and
``publish_result``, with the semantics and the order of ``_redis_finish``'s script
(checked by the same contract suite): fence, result, state, XACK, notifications.

A failing write stops the step where it fails, keeping the writes before it, as a Redis
script does: the one failure this substrate can have there is a result key holding a
value of another type (a string set by a test: Redis answers WRONGTYPE).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import attrs

from ._idempotency import IndexRecord
from ._jobstate import FORWARDED, JobState
from ._memory_caller import _Mailbox, _ResultList, _Waiters
from ._substrate import (
    MAILBOX_TTL_S,
    Finished,
    JobOwner,
    fence_key,
    idem_key,
    outcome_event,
    owner_key,
    result_key,
    state_key,
)


def _terminal(stored: str) -> bool:
    """Whether a stored job state is terminal (text that is not a state is not)."""
    try:
        return JobState.decode(stored).stage.terminal
    except ValueError:
        return False


def _deadline_of(record: str) -> float | None:
    """The job's deadline in an idempotency record (``IndexRecord``), if it has one."""
    try:
        return IndexRecord.decode(record).deadline
    except ValueError:
        return None


def _keep_desk(stored: str | None, state: JobState) -> JobState:
    """A stage of the delivery written without ``daemon_id`` keeps the stored one, and
    every stage of the delivery keeps a stored ``running`` (as ``_redis_finish.FINISH``:
    only the mark knows which desktops the job went to; a desktop's ``running`` report
    is never forgotten while the job is unanswered)."""
    if stored is None or state.stage not in FORWARDED:
        return state
    try:
        before = JobState.decode(stored)
    except ValueError:
        return state
    if state.daemon_id is None and before.daemon_id is not None:
        state = attrs.evolve(state, daemon_id=before.daemon_id)
    if before.running and not state.running:
        state = attrs.evolve(state, running=True)
    return state


class WrongType(Exception):
    """A write met a key holding a value of another type (Redis: WRONGTYPE)."""


class MemoryFinishCommands:
    """``finish`` and ``publish_result`` of ``MemorySubstrate``."""

    _results: dict[str, _ResultList]
    _result_waiters: dict[str, _Waiters]
    _progress: dict[str, Any]
    _kv: dict[str, tuple[str, float]]
    _enter: Callable[[], Any]
    _enter_ttl: Callable[[float], Any]
    _get: Callable[[str, float], str | None]
    _set: Callable[[str, str, float, float | None], None]
    _extend: Callable[[str, float, float], None]
    _shorten: Callable[[str, float, float], None]
    server_time: Callable[[], float]
    _result_list: Callable[[str, float], _ResultList | None]
    _mailbox: Callable[[str, float], _Mailbox]
    _xack: Callable[[str, str], int]

    async def finish(
        self,
        user_id: str,
        job_id: str,
        payload: str | None,
        state: JobState,
        *,
        ttl_s: float,
        entry_id: str | None = None,
        epoch: int | None = None,
        notify: str | None = None,
        idempotency_key: str | None = None,
        provisional: bool = False,
    ) -> Finished:
        """Fence, publish, record the state, XACK, notify, atomically (no checkpoint
        inside), in the order of ``RedisSubstrate.finish``.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
            WrongType: the result key holds a string; nothing after the result write
                happened.
        """
        now = await self._enter_ttl(ttl_s)
        if epoch is not None:
            newest = self._get(fence_key(user_id, job_id), now)
            if newest is not None and newest != str(epoch):
                return Finished("stale", newest=int(newest))
        current = self._get(state_key(user_id, job_id), now)
        if current is not None and _terminal(current):  # a terminal answer is final
            acked = self._xack(user_id, entry_id) if entry_id is not None else 0
            verdict = "done" if current == state.encode() else "settled"  # done: a retry
            return Finished(verdict, acked=bool(acked))
        if payload is not None and not provisional:
            self._push_result(user_id, job_id, payload, now, ttl_s, idempotency_key)
        state = _keep_desk(current, state)
        self._set(state_key(user_id, job_id), state.encode(), now, ttl_s)
        self._extend(owner_key(job_id), now, ttl_s)  # a caller-chosen id's, as long
        if state.stage.terminal:  # the epoch no longer needs a forwarded job's day
            self._shorten(fence_key(user_id, job_id), now, ttl_s)
            self._answer_owner(job_id, now, ttl_s)  # nor the chosen id (the keep's)
        elif idempotency_key is not None:  # a stage of the delivery: the key's record
            ikey = idem_key(user_id, idempotency_key)  # as long as the state
            record = self._get(ikey, now)
            if record is not None and record.startswith(job_id + " "):
                self._extend(ikey, now, ttl_s)
        acked = self._xack(user_id, entry_id) if entry_id is not None else 0
        if payload is not None:
            self._notify(job_id, payload, now, notify)
        return Finished("done", acked=bool(acked))

    async def publish_result(
        self,
        user_id: str,
        job_id: str,
        payload: str,
        *,
        ttl_s: float,
        notify: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Append ``payload``; the list and its job's idempotency record expire at the
        later of now + ``ttl_s`` and the record's own expiry (no later than its job's
        deadline + ``ttl_s``: not a forwarded job's day); end the job's progress log
        with the outcome (if it has one); then notify the mailbox. Wakes
        ``wait_result`` waiters.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
            WrongType: the result key holds a string.
        """
        now = await self._enter_ttl(ttl_s)
        self._push_result(user_id, job_id, payload, now, ttl_s, idempotency_key)
        self._notify(job_id, payload, now, notify)

    def _answer_owner(self, job_id: str, now: float, ttl_s: float) -> None:
        """The owner record (if any) lives ``ttl_s`` more, marked answered: a keep of
        the id that comes later keeps nothing (``keep_job_ids``)."""
        raw = self._get(owner_key(job_id), now)
        if raw is not None:
            answered = attrs.evolve(JobOwner.decode(raw), answered=True)
            self._set(owner_key(job_id), answered.encode(), now, ttl_s)

    def spoil_key(self, key: str) -> None:
        """Test helper: make ``key`` hold a string, so a list write to it fails as
        Redis' WRONGTYPE does."""
        self._kv[key] = ("spoiled", float("inf"))

    def _push_result(
        self,
        user_id: str,
        job_id: str,
        payload: str,
        now: float,
        ttl_s: float,
        idempotency_key: str | None,
    ) -> None:
        key = result_key(user_id, job_id)
        if self._get(key, now) is not None:
            raise WrongType(f"WRONGTYPE {key} holds a string, not a list")
        expires_at = now + ttl_s
        ikey = idem_key(user_id, idempotency_key or job_id)
        record = self._get(ikey, now) if idempotency_key is not None else None
        if record is not None and record.startswith(job_id + " "):
            left_until = self._kv[ikey][1]
            deadline = _deadline_of(record)
            if deadline is not None:  # its own lifetime: no longer a forwarded job's day
                own = now + ttl_s + max(0.0, deadline - self.server_time())
                left_until = min(left_until, own)
            expires_at = max(expires_at, left_until)
            self._kv[ikey] = (record, expires_at)
        lst = self._result_list(key, now)
        if lst is None:
            lst = self._results[key] = _ResultList(deque(), expires_at)
        lst.items.append(payload)
        lst.expires_at = expires_at
        waiters = self._result_waiters.pop(key, None)
        if waiters is not None:
            waiters.event.set()

    def _notify(self, job_id: str, payload: str, now: float, notify: str | None) -> None:
        progress = self._progress.get(job_id)
        if progress is not None and progress.expires_at > now:  # as XADD NOMKSTREAM
            progress.entries.append((progress.next_seq, outcome_event(payload)))
            progress.next_seq += 1
            progress.changed.set()
            progress.changed = anyio.Event()
        if notify:
            box = self._mailbox(notify, now)
            box.items.append(f"{job_id} {payload}")
            box.expires_at = now + MAILBOX_TTL_S
            box.notify()
