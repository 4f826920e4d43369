"""The dispatch API: ``Bridge.call``, ``Bridge.presence``, ``Bridge.status``.

Any replica can dispatch: a call checks presence, puts the job on the user's stream and
waits (BLPOP) on the job's result list. Uses only anyio-compatible substrate calls, so it
runs under trio and asyncio alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs
from deskbridge_common import Timings

from . import _metrics
from ._admission import CallAdmission
from ._bridge_jobs import (
    ARGS_ENCODER,
    MAX_TIMEOUT_S,
    USER_SEPARATOR,
    JobControl,
    _check,
    minted_user,
    queue_full,
)
from ._catalogue import CatalogueCache
from ._errors import (
    BadRequest,
    IdempotencyKeyReused,
    JobIdInUse,
    SubstrateUnavailable,
)
from ._idempotency import IndexRecord, args_digest, request_digest
from ._jobs import job_fields, parse_result
from ._jobstate import JobState, Stage, forwarded_keep_s
from ._outcome import Outcome, Presence, offline_outcome, plain_offline, timeout_outcome
from ._own_liveness import in_doubt_error, own_liveness
from ._progress import ProgressReport, parse_progress
from ._retry import (
    ANSWER_GRACE_S,
    HOLDER_ALIVE_CACHE_S,
    HOLDER_DEAD_CACHE_S,
    LIVENESS_RECHECK_S,
)
from ._substrate import JobOwner, Submission, Submitted, Substrate, holder_of
from ._tracing import current_traceparent
from ._validate import validate_job_id, validate_key, validate_tool_name, validate_user_id
from ._waiting import ResultWaiters, Waiter

log = logging.getLogger("deskbridge.hub.bridge")

#: Most holder processes whose liveness a Bridge remembers (then it starts over).
_ALIVE_CACHE_MAX = 10_000
#: Default wait for ``Bridge.status``: a status round trip that takes longer than this
#: means the desktop is not answering (the field figure is 20 ms).
STATUS_TIMEOUT_S = 5.0
#: Times one call submits again (a catalogue that changed under it, a holder process to
#: check) before giving up.
MAX_SUBMIT_RETRIES = 4
#: A request whose caller-chosen job id another call of its user holds, and whose
#: idempotency key names no job yet (that call is between its claim and its enqueue, one
#: round trip or two): how often, and how many times, it looks at the key again.
JOB_ID_RELOOK_S = 0.05
JOB_ID_RELOOKS = 10
#: Users whose holder process one Bridge remembers (for the wake-up sent with the enqueue).
MAX_CACHED_HOLDERS = 10_000
#: Default bound on one job's ``args`` (``Bridge.max_args_bytes``), bytes.
MAX_ARGS_BYTES = 256 * 1024


def _start_within_s(deadline: object, now: float) -> float:
    """Seconds from ``now`` until ``deadline`` (Unix seconds), 0 when it has passed.

    Raises:
        BadRequest: not a finite number, or more than ``MAX_TIMEOUT_S`` after ``now``
            (``field`` ``deadline``): the bound HTTP and MCP put on ``timeout_s``.
    """
    if (
        isinstance(deadline, bool)
        or not isinstance(deadline, int | float)
        or not math.isfinite(deadline)
        or deadline - now > MAX_TIMEOUT_S
    ):
        raise BadRequest(
            f"deadline must be a finite Unix time at most {MAX_TIMEOUT_S:g} s from now",
            field="deadline",
        )
    return max(0.0, deadline - now)


class _Unread:
    """The type of :data:`_UNREAD`: no presence value read yet."""


_UNREAD = _Unread()


def _may_be_ours(owner: JobOwner | None, user_id: str, key: str | None) -> bool:
    """Whether a caller-chosen job id another call has claimed (``owner``: its record,
    None when gone meanwhile) may be this request's own job: the request has an
    idempotency key and the id's owner is this user. Then the key decides
    (``Bridge._attach_by_key``), never another user's job."""
    return key is not None and (owner is None or owner.user_id == user_id)


@attrs.define
class _Step:
    """What one dispatch's submit step has done so far.

    Attributes:
        claimed: the caller-chosen job id is claimed (its owner record is ours).
        adopted: claimed by another copy of this very request (the record carries its
            digest), whose own submit may still enqueue the job under it: never dropped
            by this call (``_unclaim``), its TTL ends it.
        in_doubt: a submit was sent and has not answered: it may have enqueued the job.
        submitted: the last submit's answer, once one answered.
    """

    claimed: bool = False
    adopted: bool = False
    in_doubt: bool = False
    submitted: Submitted | None = None


def _last_look_s(give_up: float) -> float:
    """Seconds the call's last look at its job (result list, stage) may take: what is
    left of ``ANSWER_GRACE_S`` past ``give_up``; ``ANSWER_GRACE_S`` again when this
    process ran past that already (stopped: SIGSTOP, a paused VM), so a call late
    anyway answers the outcome another holder stored meanwhile, not ``timeout`` with
    no look at all (every deadline had passed at the resume)."""
    left = give_up + ANSWER_GRACE_S - anyio.current_time()
    return left if left > 0 else ANSWER_GRACE_S


@attrs.define(eq=False)
class Bridge(JobControl):
    """Dispatch jobs to users' desktops through a substrate.

    Args:
        substrate: the shared substrate (Redis, or in-memory for one process).
        timings: timing knobs; ``call_timeout_s`` (90 s, the seed's BLPOP) is the default
            wait, ``result_ttl_s`` bounds how long a result is kept.
        wall_clock: Unix time source, only to turn ``dispatch(deadline=...)`` into a
            duration and to stamp states (injectable for tests).
        max_args_bytes: the largest ``args`` :meth:`dispatch` accepts, bytes of its
            compact JSON with non-ASCII escaped (what goes on the stream); 256 KiB,
            ``DESKBRIDGE_MAX_ARGS_BYTES`` for the hub. Every way in (HTTP, MCP, Python)
            is bounded here.
        admission: the admission gates every :meth:`dispatch` (and so :meth:`call` and
            :meth:`status`) passes first (``_admission``); default None: no bound. The
            hub's own Bridge has the process's (``DESKBRIDGE_MAX_CALLS``,
            ``DESKBRIDGE_SHED_LAG_S``), so its HTTP, MCP and status calls share it. A
            Bridge an application makes for itself runs in that application's process,
            whose own code bounds its concurrency (every call is an ``await`` it sees):
            unbounded unless it passes one.
    """

    substrate: Substrate
    timings: Timings = attrs.field(factory=Timings)
    wall_clock: Callable[[], float] = time.time
    max_args_bytes: int = attrs.field(default=MAX_ARGS_BYTES, kw_only=True)
    admission: CallAdmission | None = attrs.field(default=None, kw_only=True)
    waiters: ResultWaiters = attrs.field(init=False)
    catalogues: CatalogueCache = attrs.field(init=False, factory=CatalogueCache)
    _holders: dict[str, str] = attrs.field(init=False, factory=dict)

    @waiters.default
    def _waiters(self) -> ResultWaiters:
        return ResultWaiters(self.substrate)

    _alive: dict[str, float] = attrs.field(factory=dict, init=False)  # holder -> until
    _dead: dict[str, float] = attrs.field(factory=dict, init=False)  # holder -> until

    async def presence(self, user_id: str) -> Presence:
        """Is the user's desktop connected, as every replica sees it?

        Raises:
            BadRequest: invalid user id.
            SubstrateUnavailable: Redis unreachable (never reported as offline).
        """
        _check(validate_user_id, user_id, "user_id")
        holder = await self.live_session(user_id)
        if holder is not None:
            return Presence(user_id=user_id, online=True, session_id=holder)
        asleep = await self.substrate.get_asleep(user_id)
        since = None if asleep is None else asleep.since
        return Presence(user_id=user_id, online=False, asleep_since=since)

    async def live_session(
        self, user_id: str, read: str | None | _Unread = _UNREAD, *, look_again: bool = True
    ) -> str | None:
        """The session holding ``user_id``'s desktop as a call sees it: the presence
        value, counted only while the process it names is alive, and no presence while
        this process's own writes are in doubt (``_own_liveness``) looked at once more.
        The one decision behind :meth:`presence`, a call's presence check and the admin
        API's ``online`` (they disagreed when the admin API read the raw key).

        Args:
            read: the presence value already read (the admin listing reads a page of
                them in one round trip); default: read it here.
            look_again: in doubt, look once more ``LIVENESS_RECHECK_S`` later (as a
                call does); False: raise at once.

        Returns:
            The holder session id, or None: offline.

        Raises:
            PresenceInDoubt: no presence while in doubt (a call is answered
                ``unavailable``; a ``SubstrateUnavailable``).
            SubstrateUnavailable: Redis unreachable.
        """
        if isinstance(read, _Unread):
            read = await self.substrate.get_presence(user_id)
        holder = await self._live_holder(read)
        if holder is None and own_liveness().in_doubt(user_id):
            if not look_again:
                raise in_doubt_error()
            # this process's own writes were held or refused past their TTL: the
            # presence may be one it is rewriting (``_own_liveness``); look once more
            await anyio.sleep(LIVENESS_RECHECK_S)
            holder = await self._live_holder(await self.substrate.get_presence(user_id))
            if holder is None and own_liveness().in_doubt(user_id):
                raise in_doubt_error()
        return holder

    async def _live_holder(self, session_id: str | None) -> str | None:
        """The presence value (holder session id) if the process it names is alive
        (issue 16.2: a killed hub's presences stop counting within its liveness TTL,
        not the 30 s presence TTL), else None. A session id that names no process
        (older hubs) counts as long as its presence lives."""
        holder = None if session_id is None else holder_of(session_id)
        if holder is None:
            return session_id
        if self._alive.get(holder, -math.inf) > anyio.current_time():
            return session_id
        if not await self._alive_after_all(holder):
            return None
        if len(self._alive) > _ALIVE_CACHE_MAX:
            self._alive.clear()
        self._alive[holder] = anyio.current_time() + HOLDER_ALIVE_CACHE_S
        return session_id

    @_metrics.timed_dispatch
    async def dispatch(
        self,
        user_id: str,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        deadline: float | None = None,
        job_id: str | None = None,
        on_progress: Callable[[ProgressReport], Awaitable[None]] | None = None,
        started_at: float | None = None,
    ) -> Outcome:
        """Run tool ``name`` on the user's desktop and wait for its terminal answer.

        Args:
            user_id: whose desktop.
            name: tool name.
            args: keyword arguments for the tool (a JSON object; default ``{}``).
            idempotency_key: stable key for deduplication across redeliveries; default is
                the fresh job id (a retry by the caller with the same key runs once).
            timeout_s: how long the call may take, seconds (default
                ``timings.call_timeout_s`` = 90 s): the enqueue step and the wait for the
                answer; it answers by then, plus at most ``ANSWER_GRACE_S`` (0.25 s) for
                its last looks, also while Redis stalls.
            deadline: absolute Unix time, by this process's ``wall_clock``, after which the
                job must not start (default now + timeout_s), at most ``MAX_TIMEOUT_S``
                (one day, the longest ``timeout_s`` HTTP and MCP accept) from now; one
                already past lets the job expire unstarted. It is turned into a
                duration here and the job's deadline is set on the substrate's clock, so
                other machines' clocks never decide it (docs/operations.md, "Clocks").
            job_id: the job's id, if the caller wants to choose it (to cancel it from
                elsewhere while this call waits); default a fresh UUID.
            on_progress: awaited with each :class:`ProgressReport` the tool sends while
                this call waits (rate-limited at the sidecar, latest value only, best
                effort: a Redis hiccup stops the reports, never the call).
            started_at: when the caller's ``timeout_s`` began, on ``anyio.current_time()``
                (default: now; a later time counts as now). The HTTP route passes when
                its handler began, so the time the request's body took to arrive counts
                in ``timeout_s`` too.

        Returns:
            An :class:`Outcome` whose status is completed, failed, expired, lost,
            cancelled, declined (the person at the desktop refused a tool that needs
            approval), in_doubt (it started and its outcome is unknown: it may have
            acted), timeout or offline (docs/outcomes.md). It never returns
            "unavailable": that raises.
            ``timeout`` with ``detail == {"stage": "unknown"}`` and the ``job_id`` when
            the time ran out before the enqueue step answered (enqueued or not: it will
            not start later, docs/outcomes.md). ``offline`` (nothing enqueued) has the
            ``job_id`` the caller chose, echoed, or None when it chose none.

        Raises:
            BadRequest: malformed user id, name, args, key, timeout or deadline (``field``
                says which).
            JobIdInUse: the caller-chosen ``job_id`` already names another job (the
                same request sent again with its ``idempotency_key`` attaches instead).
            QueueFull: the user already has ``timings.jobs_maxlen`` jobs not yet
                acknowledged (queued or running); nothing was enqueued or recorded.
            IdempotencyKeyReused: ``idempotency_key`` already started a job with another
                tool or other args (``job_id`` names that job); nothing is enqueued.
            SubstrateUnavailable: Redis unreachable or refusing writes. With ``job_id``
                set the job may be enqueued (the enqueue step failed after it may have
                written, or the wait for an enqueued job's answer failed): look it up;
                without, nothing was enqueued. Also when the desktop's catalogue or
                session kept changing over the submit's retries (nothing enqueued; retry).
            Overloaded: ``admission`` refused the call (this process has its bound of
                calls in flight, or its loop lags past its bound); checked first, before
                anything else: nothing was looked at or enqueued.

        A refused call (any of these but a ``job_id`` one) leaves its caller-chosen
        ``job_id`` free again, unless another copy of the same request claimed it (that
        copy may still enqueue under it: the claim's TTL ends it).

        Cancellation: stops waiting; the job stays queued and runs unless its deadline
        passes first.
        """
        # O(1), before anything else: a count and the loop's lag (``_admission``)
        admission = self.admission
        admitted = contextlib.nullcontext() if admission is None else admission.admitted(user_id)
        with admitted:
            return await self._dispatch(
                user_id,
                name,
                args,
                idempotency_key=idempotency_key,
                timeout_s=timeout_s,
                deadline=deadline,
                job_id=job_id,
                on_progress=on_progress,
                started_at=started_at,
            )

    async def _dispatch(
        self,
        user_id: str,
        name: str,
        args: dict[str, Any] | None,
        *,
        idempotency_key: str | None,
        timeout_s: float | None,
        deadline: float | None,
        job_id: str | None,
        on_progress: Callable[[ProgressReport], Awaitable[None]] | None,
        started_at: float | None,
    ) -> Outcome:
        """:meth:`dispatch`, admitted."""
        started = anyio.current_time()
        if started_at is not None:
            started = min(started, started_at)
        job_id_given = job_id
        _check(validate_user_id, user_id, "user_id")
        _check(validate_tool_name, name, "name")
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise BadRequest("args must be a JSON object", field="args")
        try:
            args_json = ARGS_ENCODER.encode(args)  # once: checked here, sent below
        except (TypeError, ValueError, RecursionError):
            raise BadRequest(
                "args must be JSON-serialisable (finite numbers, bounded nesting)", field="args"
            ) from None
        if len(args_json) > self.max_args_bytes:
            raise BadRequest(f"args larger than {self.max_args_bytes} bytes", field="args")
        try:
            digest = args_digest(args)
        except UnicodeEncodeError:  # JSON's "\ud800" parses to a str UTF-8 cannot hold
            raise BadRequest(
                "args must be valid Unicode text (a lone surrogate \\ud800-\\udfff is not)",
                field="args",
            ) from None
        timeout_s = self.timings.call_timeout_s if timeout_s is None else timeout_s
        if isinstance(timeout_s, bool) or not (
            isinstance(timeout_s, int | float) and 0 < timeout_s <= MAX_TIMEOUT_S
        ):
            raise BadRequest(
                f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
                field="timeout_s",
            )
        if job_id is None:
            # A hub-minted id names its user, so a cancel by id needs no lookup record.
            job_id = f"{uuid.uuid4().hex}{USER_SEPARATOR}{user_id}"
        else:
            _check(validate_job_id, job_id, "job_id")
            named = minted_user(job_id)
            if named is not None and named != user_id:
                raise BadRequest(
                    f"job_id {job_id!r} has the form of the hub's own ids (32 hex digits, ~, "
                    f"a user id) and names another user: choose another id",
                    field="job_id",
                )
        _metrics.call_names_job(job_id)
        indexed_key = idempotency_key
        if idempotency_key is None:
            idempotency_key = job_id
        _check(validate_key, idempotency_key, "idempotency_key")
        # The deadline is set and compared on one clock, the substrate's (Redis TIME):
        # this process sends only a duration (docs/operations.md, "Clocks").
        now = self.wall_clock()
        start_within_s = timeout_s if deadline is None else _start_within_s(deadline, now)
        state_ttl_s = timeout_s + self.timings.result_ttl_s
        owner = JobOwner(
            user_id, self.waiters.mailbox, request=request_digest(name, digest, indexed_key),
            # a caller-chosen id's claim is this call's own: it drops no other copy's
            # (a minted id is never claimed by another copy: none needed, none written)
            claim=None if job_id_given is None else secrets.token_hex(8),
        )  # fmt: skip
        # Every step is bounded by the caller's time: a Redis that stalls (it answers
        # within the 5 s command timeout, but later than the caller wanted) does not make
        # the call outlast its timeout_s (plus ANSWER_GRACE_S for the looks once it is up).
        give_up = started + timeout_s
        step = _Step()
        waiter = self.waiters.register(user_id, job_id)
        try:
            # (the looks of the submit step, e.g. a holder's second look at the end of
            # the caller's time, may take the grace too; no submit is sent after give_up)
            with anyio.move_on_after(give_up + ANSWER_GRACE_S - anyio.current_time()):
                if job_id_given is not None:
                    # (a claim cut short by the caller's time is not undone: it may have
                    # failed, the id another call's; its TTL ends it)
                    step.claimed = await self.substrate.claim_job_id(
                        job_id, owner, ttl_s=state_ttl_s
                    )
                    if not step.claimed:
                        held = await self.substrate.job_owner(job_id)
                        # this very request's claim (its reply was lost, the call answered
                        # unavailable; or a copy's on another replica): go on as its
                        # claimer, whose submit finds a job enqueued under the id
                        step.claimed = (
                            held is not None
                            and held.request == owner.request
                            and (held.user_id == user_id)
                        )
                        step.adopted = step.claimed
                        if not step.claimed and not _may_be_ours(held, user_id, indexed_key):
                            raise JobIdInUse(
                                f"job_id {job_id!r} already names another job", job_id=job_id
                            )
                submission = Submission(
                    job_id=job_id,
                    # the caller's trace context goes on to the tool
                    fields=job_fields(
                        job_id,
                        name,
                        args,
                        idempotency_key,
                        current_traceparent(),
                        reply_to=self.waiters.mailbox,
                        args_json=args_json,
                    ),
                    start_within_s=start_within_s,
                    state=JobState(
                        Stage.QUEUED,
                        user_id,
                        at=now,
                        reply_to=self.waiters.mailbox,
                        idempotency_key=indexed_key,
                    ),  # fmt: skip
                    state_ttl_s=state_ttl_s,
                    maxlen=self.timings.jobs_maxlen,
                    catalogue_sha1=await self._validated(user_id, name, args),
                    idempotency_key=indexed_key,
                    index_value=IndexRecord(job_id, name, digest).encode(),
                    index_ttl_s=state_ttl_s,
                    owner=owner,
                    # the holder process we know alive; the same write wakes it
                    alive_holder=self._known_alive(user_id),
                    wake_ttl_s=self.timings.presence_ttl_s,
                    # push delivery: the holder forwards without a read of its own
                    delivered_ttl_s=forwarded_keep_s(self.timings.result_ttl_s),
                    # minted for this call, or claimed by it: a job found under the id is
                    # this call's (a submit that ran and lost its reply is sent again)
                    own=job_id_given is None or step.claimed,
                )
                if job_id_given is not None and not step.claimed:
                    step.submitted = await self._attach_by_key(
                        user_id, submission, name, args, step, started=started, give_up=give_up
                    )
                else:
                    step.submitted = await self._submit(
                        user_id, submission, name, args, step, started=started, give_up=give_up
                    )
            submitted = step.submitted
            if submitted is None or submitted.verdict == "late":
                # The caller's time ran out before the submit step answered. With a
                # submit sent and unanswered (step.in_doubt) the job may be enqueued; the
                # step carried the caller's instant (give_up_s), so it was refused if it
                # ran later, and a job it enqueued has its deadline at the caller's, not
                # later: it will not start after this answer.
                if not step.in_doubt:
                    await self._unclaim(job_id, owner, step, until=give_up + ANSWER_GRACE_S)
                return timeout_outcome(
                    job_id,
                    "unknown",
                    timeout_s=timeout_s,
                    elapsed_s=anyio.current_time() - started,
                )
            attached, start_until = False, None
            if submitted.verdict == "indexed":
                record = IndexRecord.decode(submitted.index_value or "")
                if not record.same_request(name, digest):
                    raise IdempotencyKeyReused(
                        f"idempotency_key {idempotency_key!r} was used for another request "
                        f"(job {record.job_id}, tool {record.tool!r}) with other arguments or "
                        "another tool; use a new key for a new request",
                        job_id=record.job_id,
                    )
                # A retry: attach to the job the key started, wherever it was enqueued
                # (this call's claim names no job).
                await self._unclaim(job_id, owner, step, until=give_up + ANSWER_GRACE_S)
                self.waiters.unregister(waiter)
                job_id, attached = record.job_id, True
                _metrics.call_names_job(job_id)  # a retry attached: the earlier call's job
                waiter = self.waiters.register(user_id, job_id)
                if record.deadline is not None and submitted.server_time is not None:
                    # that job's own deadline: the time left on the substrate's clock
                    start_until = anyio.current_time() + record.deadline - submitted.server_time
            elif submitted.verdict == "queued" and job_id_given is not None:
                # found under the id, not enqueued by this step: another copy of this
                # request may have enqueued it (its mailbox is notified, its deadline holds)
                attached = not submitted.entry_id
                if step.adopted and submitted.entry_id:
                    await self._reclaim_adopted(job_id, owner, state_ttl_s, give_up)
            elif submitted.verdict != "queued":
                if submitted.verdict == "offline":
                    await self._unclaim(job_id, owner, step, until=give_up + ANSWER_GRACE_S)
                    with anyio.move_on_after(give_up + ANSWER_GRACE_S - anyio.current_time()):
                        return await offline_outcome(self.substrate, user_id, started, job_id_given)
                    return plain_offline(user_id, started, job_id=job_id_given)
                if submitted.verdict == "job_id_in_use":
                    raise JobIdInUse(f"job_id {job_id!r} already names another job", job_id=job_id)
                if submitted.verdict == "queue_full":  # nothing written; the id is freed below
                    raise queue_full(user_id, submission.maxlen, job_id_given)
                # The catalogue (or the holder) kept changing under us, the request is
                # not at fault: a 503 to retry, not a 400 (seen while Redis refused writes:
                # the desktop's session and catalogue came and went).
                log.warning(  # a check that can never pass would show here, not vanish
                    "submit for %s gave up after %d tries: its verdict kept changing "
                    "(last: %s); answered unavailable",
                    user_id, MAX_SUBMIT_RETRIES + 1, submitted.verdict,
                )  # fmt: skip
                raise SubstrateUnavailable(
                    f"the desktop's session or tool catalogue kept changing during the call "
                    f"(last: {submitted.verdict}); retry"
                )
            payload = None
            try:
                with anyio.move_on_after(give_up + ANSWER_GRACE_S - anyio.current_time()):
                    left_s = give_up - anyio.current_time()
                    if left_s <= 0:
                        pass  # the submit took the caller's time: the stage says the rest
                    elif on_progress is None:
                        payload = await self.waiters.wait(
                            waiter, timeout_s=left_s, attached=attached
                        )
                    else:
                        payload = await self._wait_reporting(waiter, left_s, attached, on_progress)
            except SubstrateUnavailable as exc:
                # enqueued: the caller gets its id (to look it up, cancel it, or retry with
                # the same key), not the short answer of a call that enqueued nothing
                exc.job_id = exc.job_id or job_id
                raise
        except BaseException as exc:
            if step.in_doubt:
                if isinstance(exc, SubstrateUnavailable):
                    # raised by a submit that may have enqueued the job: not the short
                    # answer of a call that enqueued nothing, but the job's id to look up
                    exc.job_id = exc.job_id or job_id
            elif step.submitted is None or step.submitted.verdict != "queued":
                # refused, or failed before anything was enqueued: the id is free again
                await self._unclaim(job_id, owner, step, until=give_up + ANSWER_GRACE_S)
            raise
        finally:
            self.waiters.unregister(waiter)
        elapsed = anyio.current_time() - started
        if payload is None:
            may_start_s = None if start_until is None else start_until - anyio.current_time()
            stage, running = "unknown", False
            with anyio.move_on_after(_last_look_s(give_up)):
                # answered just now (after the wait's last look): that answer is the call's
                stage, payload, running = await self._last_look(user_id, job_id)
            if payload is None:
                return timeout_outcome(
                    job_id,
                    stage,
                    timeout_s=timeout_s,
                    elapsed_s=elapsed,
                    attached=attached,
                    may_start_within_s=may_start_s,
                    running=running,
                )
        body = parse_result(payload)
        return Outcome(
            job_id=job_id,
            status=body["status"],
            result=body.get("result"),
            error=body.get("error"),
            detail=body.get("detail") or {},
            elapsed_s=elapsed,
        )

    async def _submit(
        self,
        user_id: str,
        submission: Submission,
        name: str,
        args: dict[str, Any],
        step: _Step,
        *,
        started: float,
        give_up: float,
    ) -> Submitted:
        """The submit step with its retries (a catalogue that changed, a holder process
        to check); ``step.in_doubt`` is True while a submit is out unanswered. Each
        submit carries the caller's time left (``give_up_s``) and the job's start window
        counted from the call's start (``started``; ``give_up`` is when the caller stops
        waiting, both on ``anyio.current_time()``), so a step that runs late (Redis
        stalled) is refused and a job's deadline is the caller's, not that much later."""
        original_within_s = submission.start_within_s

        async def once(sub: Submission) -> Submitted:
            now = anyio.current_time()
            left_s = give_up - now
            if left_s <= 0:
                return Submitted("late")
            sub = attrs.evolve(
                sub,
                start_within_s=max(0.0, original_within_s - (now - started)),
                give_up_s=left_s,
            )
            step.in_doubt = True
            try:
                got = await self.substrate.submit(user_id, sub)
            except SubstrateUnavailable as exc:
                # no connection could be made (nothing was sent), or Redis refused the
                # step before its first write (out of memory, a replica, ...): nothing
                # enqueued (the short answer, and a caller-chosen id is free again; the
                # caller was told to look up a job that could not exist, and GET said 404)
                step.in_doubt = not (exc.unsent or exc.refused)
                raise
            step.in_doubt = False
            return got

        submitted = await once(submission)
        rechecked = False
        for _ in range(MAX_SUBMIT_RETRIES):
            if (
                submitted.verdict == "offline"
                and not rechecked
                and own_liveness().in_doubt(user_id)
            ):
                # No presence, but this process's own writes were held or refused past
                # their TTL (``_own_liveness``): it may be rewriting that very presence.
                # Look once more; still absent while in doubt is not "offline".
                rechecked = True
                await anyio.sleep(max(0.0, min(LIVENESS_RECHECK_S, give_up - anyio.current_time())))
            elif submitted.verdict == "offline" and rechecked and own_liveness().in_doubt(user_id):
                raise in_doubt_error()
            elif submitted.verdict == "catalogue":
                # The desktop's catalogue changed since we cached it: validate again.
                known = self.catalogues.put(user_id, submitted.catalogue)
                problem = known.problem(name, args)
                if problem is not None:
                    raise problem
                submission = attrs.evolve(submission, catalogue_sha1=known.sha1)
            elif submitted.verdict == "holder":
                # Presence names a hub process we have not seen alive lately: check it
                # (issue 16.2: a dead process's presences do not count).
                holder = holder_of(submitted.presence or "")
                if holder is None:
                    return attrs.evolve(submitted, verdict="offline")
                time_left_s = give_up - anyio.current_time()
                alive = await self._holder_alive(user_id, holder, within_s=time_left_s)
                if not alive:
                    return attrs.evolve(submitted, verdict="offline")
                submission = attrs.evolve(submission, alive_holder=holder)
            elif submitted.verdict == "offline":
                return submitted
            else:
                if submitted.holder_alive and submission.alive_holder is not None:
                    # the step found the holder's liveness key: trust it anew
                    self._alive[submission.alive_holder] = (
                        anyio.current_time() + HOLDER_ALIVE_CACHE_S
                    )
                return submitted
            submitted = await once(submission)
        return submitted

    async def _attach_by_key(
        self,
        user_id: str,
        submission: Submission,
        name: str,
        args: dict[str, Any],
        step: _Step,
        *,
        started: float,
        give_up: float,
    ) -> Submitted:
        """The caller-chosen job id is claimed by another call of this user: the same
        request sent again (a retry after a dropped connection) or at once on another
        replica. Attach to the job the idempotency key names (``indexed``); while it
        names none (the other call has claimed the id but not enqueued yet, or was
        refused and let the id go) look again every ``JOB_ID_RELOOK_S``, claiming the
        id if it became free, at most ``JOB_ID_RELOOKS`` times and never past the
        caller's time; then ``job_id_in_use``."""
        job_id = submission.job_id
        only = attrs.evolve(submission, attach_only=True)
        kw: dict[str, Any] = {"started": started, "give_up": give_up}
        got = await self._submit(user_id, only, name, args, step, **kw)
        for _ in range(JOB_ID_RELOOKS):
            if got.verdict != "job_id_in_use" or anyio.current_time() + JOB_ID_RELOOK_S > give_up:
                break
            await anyio.sleep(JOB_ID_RELOOK_S)
            step.claimed = await self.substrate.claim_job_id(
                job_id, submission.owner, ttl_s=submission.state_ttl_s
            )
            if step.claimed:
                mine = attrs.evolve(submission, own=True)
                return await self._submit(user_id, mine, name, args, step, **kw)
            got = await self._submit(user_id, only, name, args, step, **kw)
        return got

    async def _unclaim(self, job_id: str, owner: JobOwner, step: _Step, *, until: float) -> None:
        """Drop a caller-chosen job id's owner record (``claim_job_id``) that names no
        enqueued job, so the id is free again at once (a refused call, an unknown tool,
        a reused key, a call answered offline), best effort, by ``until`` (the caller's
        clock) at most; its TTL ends it otherwise."""
        if not step.claimed:
            return
        step.claimed = False
        if step.adopted:  # another copy's claim: that copy may yet enqueue under it
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(until - anyio.current_time()):
            try:
                await self.substrate.forget_job_id(job_id, owner)  # if still its own
            except SubstrateUnavailable:
                pass

    async def _reclaim_adopted(
        self, job_id: str, owner: JobOwner, ttl_s: float, give_up: float
    ) -> None:
        """This call enqueued its job under a claim another copy of the request made,
        which that copy drops if it was refused before (``offline``, ``queue_full``):
        claim the id again as this call's own (``replace``: a record marked answered is
        left as it is), so it names the job. The copy's drop removes only its own record
        (``forget_job_id``), so one that lands after this claim leaves it (it took the
        id of the running job away when this was a SET NX, refused while that copy's
        record was still there). Best effort, within the caller's time."""
        with anyio.move_on_after(give_up + ANSWER_GRACE_S - anyio.current_time()):
            try:
                await self.substrate.claim_job_id(job_id, owner, ttl_s=ttl_s, replace=True)
            except SubstrateUnavailable:
                pass

    def _known_alive(self, user_id: str) -> str | None:
        """The hub process holding ``user_id``'s socket as of this Bridge's last call,
        if its liveness was confirmed within ``HOLDER_ALIVE_CACHE_S``."""
        holder = self._holders.get(user_id)
        if holder is not None and self._alive.get(holder, -math.inf) > anyio.current_time():
            return holder
        return None

    async def _holder_alive(self, user_id: str, holder: str, *, within_s: float = math.inf) -> bool:
        """EXISTS the process's liveness key (cached ``HOLDER_ALIVE_CACHE_S``; a second
        look within ``within_s``, :meth:`_alive_after_all`); remember it as the user's
        holder."""
        if self._alive.get(holder, -math.inf) <= anyio.current_time():
            if not await self._alive_after_all(holder, within_s=within_s):
                return False
            if len(self._alive) > MAX_CACHED_HOLDERS:
                self._alive.clear()
            self._alive[holder] = anyio.current_time() + HOLDER_ALIVE_CACHE_S
        self._holders[user_id] = holder
        while len(self._holders) > MAX_CACHED_HOLDERS:
            self._holders.pop(next(iter(self._holders)))
        return True

    async def _alive_after_all(self, holder: str, *, within_s: float = math.inf) -> bool:
        """Whether ``holder``'s liveness key exists, looked at a second time
        ``LIVENESS_RECHECK_S`` later (at most ``within_s``: the caller's time left) when
        it is gone (a live process rewrites it as soon as Redis takes writes again); a
        holder found dead is believed dead for ``HOLDER_DEAD_CACHE_S``.

        Raises:
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        now = anyio.current_time()
        if self._dead.get(holder, -math.inf) > now:
            return False
        if await self.substrate.holder_alive(holder):
            return True
        await anyio.sleep(max(0.0, min(LIVENESS_RECHECK_S, within_s)))
        if await self.substrate.holder_alive(holder):
            return True
        if len(self._dead) > _ALIVE_CACHE_MAX:
            self._dead.clear()
        self._dead[holder] = anyio.current_time() + HOLDER_DEAD_CACHE_S
        return False

    async def _notify_cancel(self, session_id: str, user_id: str, job_id: str) -> None:
        """Tell the process holding the user's socket that ``job_id`` is cancelled
        (``_cancel_notice``), with a wake-up (its heartbeat would find the control entry
        within ``heartbeat_s`` anyway, so a failure here is not the caller's)."""
        holder = holder_of(session_id)
        if holder is None:
            return
        try:
            await self.substrate.notify_cancel(
                holder, user_id, job_id, ttl_s=self.timings.presence_ttl_s
            )
        except SubstrateUnavailable:
            pass

    async def _wait_reporting(
        self,
        waiter: Waiter,
        timeout_s: float,
        attached: bool,
        on_progress: Callable[[ProgressReport], Awaitable[None]],
    ) -> str | None:
        """Wait for the result while a second task follows the job's progress stream."""
        job_id = waiter.job_id

        async def follow() -> None:
            after = "0"
            try:
                while True:
                    entries = await self.substrate.read_progress(job_id, after, block_ms=1000)
                    for entry_id, payload in entries:
                        after = entry_id
                        report = parse_progress(payload)
                        if report is not None:
                            await on_progress(report)
            except SubstrateUnavailable as exc:
                log.info("progress of %s not followed further: %s", job_id, exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            payload = await self.waiters.wait(waiter, timeout_s=timeout_s, attached=attached)
            tg.cancel_scope.cancel()
        return payload

    async def _validated(self, user_id: str, name: str, args: dict[str, Any]) -> str | None:
        """Refuse, before enqueueing, a tool the desktop did not announce or args that fail
        its JSON Schema, by the cached catalogue (fetched if not cached, or if it refuses:
        it may be stale). Returns the SHA-1 of the catalogue validated against, for the
        enqueue script to compare (None for ``status``: always offered). Without a
        catalogue (an old sidecar) nothing is checked."""
        if name == "status":
            _metrics.call_tool_known()
            return None
        known = self.catalogues.get(user_id)
        if known is None or known.problem(name, args) is not None:
            known = self.catalogues.put(user_id, await self.substrate.get_catalogue(user_id))
            problem = known.problem(name, args)
            if problem is not None:
                raise problem
        if known.checkers is not None:  # a tool of the catalogue: its own metrics label
            _metrics.call_tool_known()
        return known.sha1

    async def tools(self, user_id: str) -> list[dict[str, Any]] | None:
        """The tool catalogue the user's sidecar announced in its last hello: a list of
        ``{"name", "description", "args_schema", "side_effects"}`` (and
        ``"approval_after_wait_s"``, seconds, 0 for always, for a tool that needs the
        person's approval), or None if unknown.

        Raises:
            BadRequest: invalid user id. SubstrateUnavailable: Redis unreachable.
        """
        _check(validate_user_id, user_id, "user_id")
        raw = await self.substrate.get_catalogue(user_id)
        return json.loads(raw) if raw else None

    async def call(
        self,
        user_id: str,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Like :meth:`dispatch`, but return the tool's result or raise.

        Returns:
            The tool's JSON result.

        Raises:
            DesktopOffline: no presence when dispatched (answered at once, nothing queued).
            JobFailed: the tool failed (``code``, ``message`` from the sidecar).
            JobExpired: the deadline passed before the job started.
            JobLost: the entry was trimmed or deleted before it ran.
            JobCancelled: the job was cancelled.
            JobDeclined: the person at the desktop declined a tool that needs approval.
            JobInDoubt: it started and its outcome is unknown (the sidecar stopped
                mid-job); it may have acted and is never run again under this key.
            JobTimeout: no answer within ``timeout_s``; ``details['stage']`` says what is
                known (``unknown`` also when the enqueue step had not answered).
            IdempotencyKeyReused: the key already started a job with another tool or
                other args; nothing is enqueued.
            QueueFull: the user's queue is full (``timings.jobs_maxlen`` jobs queued or
                running); nothing is enqueued.
            Overloaded: this Bridge's ``admission`` refused the call (a Bridge made
                without one never raises it); nothing is enqueued.
            SubstrateUnavailable: Redis unreachable.
            BadRequest: malformed input.
        """
        outcome = await self.dispatch(
            user_id, name, args, idempotency_key=idempotency_key, timeout_s=timeout_s
        )
        return outcome.raise_for_status()

    async def status(self, user_id: str, *, timeout_s: float = STATUS_TIMEOUT_S) -> Outcome:
        """Round trip through the desktop's status worker (never queued behind a tool).

        Returns:
            The status job's :class:`Outcome`; ``result`` holds the sidecar's status
            (its wall time, version, running tool) when completed, ``elapsed_s`` the
            round-trip time.

        Raises:
            BadRequest, SubstrateUnavailable, Overloaded: as :meth:`dispatch`.
        """
        return await self.dispatch(user_id, "status", {}, timeout_s=timeout_s)
