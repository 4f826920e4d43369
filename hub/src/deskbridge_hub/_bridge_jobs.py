"""The dispatch API's job look-ups and control: ``Bridge.job_state`` and ``Bridge.cancel``
(a mixin of ``Bridge``), and how a job id leads to its user (hub-minted ids end in
``~<user_id>``; caller-chosen ids have an owner record)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import anyio
from deskbridge_common import Timings

from ._cancel_notice import finish_cancelled_before_start
from ._errors import (
    BadRequest,
    QueueFull,
    UnknownJob,
)
from ._jobstate import LONGEST_TIMEOUT_S, JobState, MalformedState, Stage
from ._keys import holder_of
from ._outcome import _TIMEOUT_MESSAGES
from ._own_liveness import PresenceInDoubt
from ._retry import LIVENESS_RECHECK_S, PROCESS_LIVENESS_TTL_S
from ._substrate import Substrate
from ._validate import validate_key, validate_user_id

#: Longest accepted ``timeout_s``: one day. Keeps the deadline and the BLPOP timeout in
#: range (Redis 7 answers "ERR timeout is negative" to a timeout near 1e16 s).
MAX_TIMEOUT_S = LONGEST_TIMEOUT_S

#: How a job's args are written on its stream entry and measured against
#: ``max_args_bytes``: compact, non-ASCII escaped, NaN and infinities refused (JSON has
#: none). One encoder for the hub and ``deskbridge-hub call``, so both measure alike.
ARGS_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

#: Separates the random part of a hub-minted job id from its user id (``~`` is never
#: part of a user id).
USER_SEPARATOR = "~"
#: The form of a hub-minted job id: ``uuid4().hex``, ``~``, the user id.
_MINTED = re.compile(r"[0-9a-f]{32}~(.+)")


#: ``Retry-After`` of a ``queue_full`` refusal, seconds (``QueueFull.retry_after_s``):
#: the desktop works its queue off at its own pace, which no replica knows; the hub's
#: other 429s say 5 s too.
QUEUE_FULL_RETRY_AFTER_S = 5
#: A cancel's control entry trims the stream at this many times ``jobs_maxlen``, not at
#: ``jobs_maxlen``: a cancel is never refused for want of room (it makes room), and at a
#: full queue its entry trimmed at the bound would take the oldest accepted job's body
#: (the memory substrate trims exactly; Redis' ``~`` once 100 such entries waited
#: unread). Room for one cancel per accepted job (docs/architecture.md, "A full queue
#: refuses new work").
CANCEL_TRIM_FACTOR = 2
#: How long a cancel that left a ``queued`` job to its live holder waits for that
#: holder's answer, seconds, before a last look at the holder's liveness key: a holder
#: that died as the cancel came has lost its key by then (a killed holder left the job
#: ``queued``, and its caller was answered at its timeout). A live holder answers in
#: milliseconds; the cancel's 202 waits this long only for a dying or stalled one.
HOLDER_ANSWER_WAIT_S = PROCESS_LIVENESS_TTL_S
#: Looks at the job's state while waiting for the holder's answer, seconds apart (a
#: live holder answers within milliseconds: the first looks are close).
HOLDER_ANSWER_LOOKS_S: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25)


def queue_full(user_id: str, limit: int, job_id: str | None) -> QueueFull:
    """The refusal of a call to a user whose queue holds ``limit`` jobs not yet
    acknowledged (the submit's ``queue_full``), naming the limit and its variable."""
    return QueueFull(
        f"the desktop of {user_id} already has {limit} jobs queued or running, the most "
        f"DESKBRIDGE_JOBS_MAXLEN allows; nothing was enqueued (accepted jobs are never "
        f"dropped to make room): retry in {QUEUE_FULL_RETRY_AFTER_S} s or later, with the "
        "same idempotency_key",
        user_id=user_id,
        limit=limit,
        retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
        job_id=job_id,
    )


def minted_user(job_id: str) -> str | None:
    """The user a job id names if it has the form of a hub-minted id, else None.

    Minted ids have no owner record (``_find`` reads the user from the id), so a caller
    may not choose one naming another user: two live jobs would share the id (its result
    waiter, progress stream, events, look-ups and cancels)."""
    match = _MINTED.fullmatch(job_id)
    return match.group(1) if match else None


class JobControl:
    """``Bridge.job_state`` and ``Bridge.cancel`` (uses the Bridge's substrate and timings)."""

    substrate: Substrate
    timings: Timings
    wall_clock: Callable[[], float]

    async def _notify_cancel(
        self, session_id: str, user_id: str, job_id: str
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    async def _holder_alive(
        self, user_id: str, holder: str, *, within_s: float = math.inf
    ) -> bool:  # pragma: no cover
        raise NotImplementedError

    async def live_session(
        self, user_id: str, read: str | None = None, *, look_again: bool = True
    ) -> str | None:  # pragma: no cover
        raise NotImplementedError

    async def _alive_after_all(
        self, holder: str, *, within_s: float = math.inf
    ) -> bool:  # pragma: no cover
        raise NotImplementedError

    async def _holder_answered(self, user_id: str, job_id: str, holder: str) -> Stage | None:
        """Wait for the live ``holder`` to answer the cancel of ``job_id`` (its stage
        leaves ``queued``), looking at its liveness key every ``LIVENESS_RECHECK_S`` and
        a last time once ``HOLDER_ANSWER_WAIT_S`` passed (a holder that died as the
        cancel came has lost its key by then). Returns the stage then (``QUEUED``: the
        holder lives and has not answered yet, or the state is gone), or None when the
        holder was found dead (gone on a second look) without answering: the cancel
        answers instead.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        began = checked_at = anyio.current_time()
        looks = iter(HOLDER_ANSWER_LOOKS_S)
        while True:
            stage = await self._stage_now(user_id, job_id)
            if stage is not Stage.QUEUED:
                return Stage.QUEUED if stage is None else stage
            now = anyio.current_time()
            last = now - began >= HOLDER_ANSWER_WAIT_S
            if last or now - checked_at >= LIVENESS_RECHECK_S:
                if not await self._alive_after_all(holder):
                    return None
                if last:
                    return await self._stage_now(user_id, job_id) or Stage.QUEUED
                checked_at = anyio.current_time()
            await anyio.sleep(next(looks, HOLDER_ANSWER_LOOKS_S[-1]))

    async def job_state(self, job_id: str) -> JobState | None:
        """What is known about ``job_id`` (any user's), or None if nothing (unknown, or
        its state expired). A ``queued`` job whose cancel was requested and whose desktop
        no live hub process holds is answered ``cancelled`` first (``_cancelled_unheld``).

        Raises:
            MalformedState: the stored state is not one. SubstrateUnavailable: Redis
                unreachable.
        """
        found = await self._find(job_id)
        if found is None:
            return None
        user_id, state = found
        return await self._cancelled_unheld(user_id, job_id, state)

    async def _cancelled_unheld(self, user_id: str, job_id: str, state: JobState) -> JobState:
        """``state`` (read ``queued``) answered ``cancelled`` when the job's cancel flag is
        set and no live hub process holds the desktop (``live_session``, as the cancel
        decides): a cancel that left the job to a holder which neither answered nor died
        within its wait (stalled, then dead) left it ``queued`` for good, and its caller
        waiting until its timeout. The finish with claim epoch 0 is refused once a
        delivery was marked (that delivery answers). In doubt (``PresenceInDoubt``: the
        store changed under this process) nothing is written.

        Returns:
            The job's state now (``state`` when nothing was answered).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        if state.stage is not Stage.QUEUED:
            return state
        if not await self.substrate.cancel_requested(user_id, job_id):
            return state
        try:
            if await self.live_session(user_id) is not None:
                return state  # its holder answers (``_cancel_notice``)
        except PresenceInDoubt:
            return state
        await finish_cancelled_before_start(
            self.substrate, user_id, job_id, state, at=self.wall_clock(),
            ttl_s=self.timings.result_ttl_s,
        )  # fmt: skip
        try:
            now = await self.substrate.get_job_state(user_id, job_id)
        except MalformedState:
            now = None
        return state if now is None else now

    async def answer_of(self, job_id: str) -> str | None:
        """The answer published for ``job_id`` (its result payload, JSON text, as the
        caller got it), or None: not answered (yet), unknown, or expired.

        Raises:
            MalformedState: the stored state is not one. SubstrateUnavailable: Redis
                unreachable.
        """
        found = await self._find(job_id)
        if found is None:
            return None
        return await self.substrate.get_result(found[0], job_id)

    async def _find(self, job_id: str) -> tuple[str, JobState] | None:
        """The user and state of ``job_id``: the user from the id itself (hub-minted ids
        end in ``~<user_id>``), else from its owner record (caller-chosen ids)."""
        _, sep, user_id = job_id.rpartition(USER_SEPARATOR)
        if sep and _valid_user(user_id):
            state = await self.substrate.get_job_state(user_id, job_id)
            if state is not None:
                return user_id, state
        owner = await self.substrate.job_owner(job_id)
        if owner is None:
            return None
        state = await self.substrate.get_job_state(owner.user_id, job_id)
        return None if state is None else (owner.user_id, state)

    async def _last_look(self, user_id: str, job_id: str) -> tuple[str, str | None, bool]:
        """A call's look at its job once its wait ended without an answer: the stage
        for its ``timeout`` (a key of ``_TIMEOUT_MESSAGES``), and the job's result payload
        if the stage says it was answered meanwhile (a holder's answer, e.g. ``expired``
        at the deadline, which is the end of the wait, written after the wait's last
        look at the result list: the result is written before the state, in one step),
        else None, and whether the desktop reported it running (``JobState.running``).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        try:
            state = await self.substrate.get_job_state(user_id, job_id)
        except MalformedState:
            state = None
        if state is not None and state.stage.terminal:
            payload = await self.substrate.get_result(user_id, job_id)
            if payload is not None:
                return state.stage.value, payload, state.running
        stage = "unknown" if state is None else state.stage.value
        running = state is not None and state.running
        return (stage if stage in _TIMEOUT_MESSAGES else "unknown"), None, running

    async def cancel(self, job_id: str) -> str:
        """Cancel a job: a queued job is never started; a running one gets a ``cancel``
        frame at once (its async tool task is cancelled; a sync tool cannot be
        interrupted and finishes, and its caller gets the tool's real outcome). Its caller
        is answered "cancelled" when the job never reached a desktop or when the desktop
        cancelled its async tool; a job delivered before and cancelled before its
        redelivery is asked of the desktop by the hub that reads it, when every earlier
        delivery went to that desktop (it may have run: its ledger answers, and "never
        started" there is ``cancelled``), else answered ``in_doubt``.
        A job found ``queued`` is answered here only when no live hub process holds the
        desktop's socket; otherwise that holder answers (it alone knows whether the job
        runs: a store that lost its last writes shows a running job ``queued``). Cancels
        at once of one job write one control entry between them (``send_cancel``).

        Returns:
            The stage the job was in: ``queued``, ``delivered``, ``awaiting_approval`` or
            ``interrupted``; or
            ``finished`` when it already has its answer (nothing is cancelled then),
            also one written between the state read and the cancel flag (a job that
            finished meanwhile was answered ``delivered``: a stale read);
            ``delivered`` also when it read ``queued`` but a hub marked it delivered
            before the cancel flag was set (that delivery answers); ``finished`` also
            when it read ``queued`` but the job was answered otherwise (``expired``,
            ``lost``) before the cancel's answer was written (a terminal answer is
            final: the cancel changed nothing).

        Raises:
            BadRequest: malformed job id.
            UnknownJob: no such job (never dispatched, or its state expired after
                ``result_ttl_s``).
            SubstrateUnavailable: Redis unreachable.
        """
        _check(validate_key, job_id, "job_id")
        found = await self._find(job_id)
        if found is None:
            raise UnknownJob(f"no job {job_id!r} (unknown, or finished long ago)", job_id=job_id)
        user_id, state = found
        if state.stage.terminal:
            return "finished"
        ttl_s = self.timings.result_ttl_s
        # The flag outlives any deadline the job can have (its entry may be read much
        # later than the result TTL: a desktop back after 10 minutes, for a job with an
        # hour to start); with the result TTL only, the cancelled job then ran.
        # The flag and the job's one control entry are one step (``send_cancel``): each
        # repeated cancel of a running job added an indexed entry, and past the trim's
        # room (below) they took accepted jobs nobody had read; two cancels at once each
        # found the flag unmarked when the mark was a later write. A step that failed
        # (503) wrote neither, so its retry sends the entry.
        sent = await self.substrate.send_cancel(
            user_id, job_id, ttl_s=MAX_TIMEOUT_S + ttl_s,
            maxlen=CANCEL_TRIM_FACTOR * self.timings.jobs_maxlen,  # never an accepted job
        )  # fmt: skip
        if state.stage is not Stage.QUEUED and await self._answered(user_id, job_id):
            # answered between the read above and the flag (a stale read): the answer
            # stands and nothing is left to cancel; "delivered" (202) was untrue
            return "finished"
        presence = await self.substrate.get_presence(user_id)
        if sent is not None and presence is not None:
            # the holder handles the notice whatever room its session has (the control
            # entry waits behind the jobs queued before it: ``_cancel_notice``)
            await self._notify_cancel(presence, user_id, job_id)
        if state.stage is Stage.QUEUED:
            try:
                # the decision a call makes (``live_session``): an absent presence, or a
                # holder's liveness key gone, proves nothing while this process saw the
                # store change (a failover may have lost them with the job's delivery)
                session = await self.live_session(user_id, presence)
            except PresenceInDoubt:
                # The store may have rewound a job running on a desktop to "queued" and
                # lost the presence with it: "cancelled" may be untrue. The flag refuses
                # the entry; its holder (or the entry's next reader) answers.
                return Stage.QUEUED.value
            holder = None if session is None else holder_of(session)
            # A live hub process holds the desktop's socket: it answers, and only it can
            # tell whether the job runs (a store that lost its last writes rewinds a
            # running job to "queued" and drops its claim epoch; answered here, its
            # caller was told "cancelled" while the tool ran on). The holder reads the
            # entry with the flag (never forwarded: "cancelled"), or has it in flight and
            # sends the cancel frame (the desktop's answer, cancelled or the real one).
            # Answered otherwise meanwhile (e.g. ``expired`` by that holder, after this
            # cancel's stale read): a terminal answer is final, the cancel changed nothing.
            # A holder that dies before it answers leaves the answer to this cancel.
            answer = None if holder is None else await self._holder_answered(
                user_id, job_id, holder
            )  # fmt: skip
            if answer is not None and answer.terminal and answer is not Stage.CANCELLED:
                return "finished"
            if answer is not None:
                return Stage.QUEUED.value
        if state.stage is Stage.QUEUED:
            # The relay will drop the entry when it reads it; answer the caller now, but
            # only if no delivery was ever marked (epoch 0: refused once the job's claim
            # epoch exists). A hub may have marked it delivered between the state read
            # above and the cancel flag: it is on the desktop then, and the cancel frame
            # and that delivery's answer tell the truth, never "cancelled before it
            # started" about a job that runs.
            finished = await finish_cancelled_before_start(
                self.substrate, user_id, job_id, state, at=self.wall_clock(), ttl_s=ttl_s
            )
            if finished.verdict == "stale":  # delivered meanwhile, maybe answered too
                answered = await self._answered(user_id, job_id)
                return "finished" if answered else Stage.DELIVERED.value
            if finished.verdict == "settled":
                # answered meanwhile (a terminal answer is final): by this cancel's flag
                # (the holder read it: ``cancelled``), or otherwise (e.g. ``expired``)
                now = await self.substrate.get_job_state(user_id, job_id)
                if now is None or now.stage is not Stage.CANCELLED:
                    return "finished"
        return state.stage.value

    async def withdraw(self, user_id: str, job_id: str) -> str:
        """Cancel a job its caller dispatched and gave up on, also while that call's
        enqueue step may still land (it was cut short after the step was sent): when no
        job ``job_id`` is known yet, its cancel flag is set anyway, so an entry that lands
        later is answered ``cancelled`` and never starts.

        Only for a job no other caller may be attached to (one the withdrawing call
        enqueued itself, under no idempotency key a retry could share): a cancel ends the
        job for every caller waiting on it.

        Returns:
            :meth:`cancel`'s stage, or ``unknown`` when the job was not (yet) enqueued.

        Raises:
            BadRequest: malformed user id or job id. SubstrateUnavailable: Redis
                unreachable.
        """
        _check(validate_user_id, user_id, "user_id")
        try:
            return await self.cancel(job_id)
        except UnknownJob:
            ttl_s = MAX_TIMEOUT_S + self.timings.result_ttl_s  # as cancel's flag
            await self.substrate.request_cancel(user_id, job_id, ttl_s=ttl_s)
            return "unknown"

    async def _answered(self, user_id: str, job_id: str) -> bool:
        """Whether ``job_id`` has a terminal answer now (a fresh read; a state that is
        gone or malformed counts as not answered)."""
        now = await self._stage_now(user_id, job_id)
        return now is not None and now.terminal

    async def _stage_now(self, user_id: str, job_id: str) -> Stage | None:
        """``job_id``'s stage now (a fresh read), None when its state is gone or
        malformed."""
        try:
            now = await self.substrate.get_job_state(user_id, job_id)
        except MalformedState:
            return None
        return None if now is None else now.stage


def _valid_user(user_id: str) -> bool:
    try:
        validate_user_id(user_id)
    except ValueError:
        return False
    return True


def _check(validator: Callable[..., Any], value: Any, field: str) -> None:
    try:
        validator(value, field)  # the message names the field that was wrong
    except ValueError as exc:
        raise BadRequest(str(exc), field=field) from None
