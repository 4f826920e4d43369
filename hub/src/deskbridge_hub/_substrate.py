"""The substrate contract, split by concern: presence, streams, results, the job ledger
and catalogue.

Two implementations honour it, proven by one contract suite (tests/hub/test_substrate_contract.py):
``RedisSubstrate`` (the only module importing the Redis client) and ``MemorySubstrate``
(in-process, on the running clock; the embedded default and the deterministic tests' one).

Key names (DESIGN.md; literal braces make them Redis Cluster hash tags). Every key of a
user and of that user's jobs carries the user's tag, so one script can touch them all:
``bridge:presence:{<user_id>}``, ``bridge:jobs:{<user_id>}`` (consumer group
``bridge-workers``), ``bridge:result:{<user_id>}:<job_id>``. Bookkeeping beside them:
``bridge:index:{<user_id>}`` (hash entry ID -> job id, written with the XADD and removed
with the XACK, so a trimmed or deleted entry's caller can be answered "lost"),
``bridge:state:{<user_id>}:<job_id>`` (what is known about a job: queued, delivered, ...),
``bridge:cancel:{<user_id>}:<job_id>`` (a cancel was requested),
``bridge:fence:{<user_id>}:<job_id>`` (the job's claim epoch: raised by every delivery,
checked by the holder's finishing step), ``bridge:tools:{<user_id>}``
(the sidecar's tool catalogue), ``bridge:idem:{<user_id>}:<idempotency_key>`` (the
idempotency-key index: that key's job, its tool and arguments digest). Outside the user's
slot: ``bridge:job:{<job_id>}`` (which user a job id belongs to, and its caller's mailbox:
cancel by job id) and ``bridge:notify:{<mailbox>}`` (one list per hub process: the holder
pushes ``<job_id> <payload>`` there after publishing, the process's one reader wakes its
waiting callers; docs/architecture.md).

Every method raises :class:`~deskbridge_hub.SubstrateUnavailable` when the backing store
cannot be reached; no other exception escapes for an I/O fault. Methods are cancellable;
a cancelled blocking read leaves no server-side waiter behind.

Durations: ``*_s`` are seconds (floats), ``*_ms`` milliseconds (ints); Redis rounds TTLs
up to whole milliseconds. A block or timeout of 0 waits forever, as in Redis. Both
implementations can also be used as async context managers (``async with substrate:``);
for ``RedisSubstrate`` that keeps its connections open for the block's duration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ._inspection import QueueInfo
from ._jobstate import JobState
from ._keys import (
    CANCEL_SENT as CANCEL_SENT,
)
from ._keys import (
    GROUP as GROUP,
)
from ._keys import (
    cancel_key as cancel_key,
)
from ._keys import (
    fence_key as fence_key,
)
from ._keys import (
    holder_of as holder_of,
)
from ._keys import (
    idem_key as idem_key,
)
from ._keys import (
    index_key as index_key,
)
from ._keys import (
    job_keys as job_keys,
)
from ._keys import (
    jobs_key as jobs_key,
)
from ._keys import (
    mailbox_key as mailbox_key,
)
from ._keys import (
    outcome_event as outcome_event,
)
from ._keys import (
    owner_key as owner_key,
)
from ._keys import (
    presence_key as presence_key,
)
from ._keys import (
    proc_key as proc_key,
)
from ._keys import (
    progress_key as progress_key,
)
from ._keys import (
    result_key as result_key,
)
from ._keys import (
    state_key as state_key,
)
from ._keys import (
    tools_digest_key as tools_digest_key,
)
from ._keys import (
    tools_key as tools_key,
)
from ._keys import (
    wake_key as wake_key,
)
from ._mcp_store import McpSessionSubstrate as McpSessionSubstrate
from ._revocation import RevocationSubstrate as RevocationSubstrate
from ._substrate_desktop import Asleep as Asleep
from ._substrate_desktop import DesktopSubstrate as DesktopSubstrate
from ._substrate_desktop import asleep_key as asleep_key
from ._substrate_desktop import daemons_key as daemons_key
from ._substrate_values import (
    MAILBOX_TTL_S as MAILBOX_TTL_S,
)
from ._substrate_values import (
    Beat as Beat,
)
from ._substrate_values import (
    BeatReply as BeatReply,
)
from ._substrate_values import (
    CancelAsked as CancelAsked,
)
from ._substrate_values import (
    Claimed as Claimed,
)
from ._substrate_values import (
    Entry as Entry,
)
from ._substrate_values import (
    Finished as Finished,
)
from ._substrate_values import (
    JobOwner as JobOwner,
)
from ._substrate_values import (
    Marked as Marked,
)
from ._substrate_values import (
    Pushed as Pushed,
)
from ._substrate_values import (
    Revocation as Revocation,
)
from ._substrate_values import (
    Revoked as Revoked,
)
from ._substrate_values import (
    Submission as Submission,
)
from ._substrate_values import (
    Submitted as Submitted,
)
from ._substrate_values import (
    Superseded as Superseded,
)
from ._substrate_values import (
    WakeItem as WakeItem,
)


class PresenceSubstrate(Protocol):
    """Presence: one key per user naming the holder session, with a TTL (invariant 1)."""

    async def set_presence(self, user_id: str, session_id: str, ttl_s: float) -> str | None:
        """SET presence = session_id with a TTL of ttl_s (> 0) seconds (heartbeat).
        Gone from set time + ttl_s on. Returns the session id it replaced (None if
        absent), read in the same step (``SET ... GET``)."""

    async def get_presence(self, user_id: str) -> str | None:
        """Holder session id, or None when no live presence."""

    async def refresh_presence(self, user_id: str, session_id: str, ttl_s: float) -> bool:
        """Heartbeat: SET presence = session_id PX ttl only if it is absent or already
        ``session_id`` (atomic). False means a newer session holds it (newest wins)."""

    async def clear_presence(self, user_id: str, session_id: str) -> bool:
        """Delete presence only if its value is still ``session_id`` (atomic). True if deleted."""

    async def set_liveness(
        self,
        holder_id: str,
        ttl_s: float,
        *,
        consumer: str | None = None,
        max_pending: int = 32,
    ) -> bool:
        """SET ``bridge:proc:{holder_id}`` PX ttl_s GET: this hub process is alive
        (refreshed well within the TTL by the process itself; presence names the
        process). Its value is ``"<consumer> <max_pending>"`` when ``consumer`` is given
        (callers then push it entries they read for it while the user's group has fewer
        than ``max_pending`` pending: ``Submission.delivered_ttl_s``), else ``1``. Returns
        whether the key was still set: False after the first call means it lapsed (the
        process stalled past the TTL) or the store lost it (Redis restarted empty, a
        failover), so presence may be gone too."""

    async def clear_liveness(self, holder_id: str) -> None:
        """DEL ``bridge:proc:{holder_id}`` (the process is stopping)."""

    async def holder_alive(self, holder_id: str) -> bool:
        """EXISTS ``bridge:proc:{holder_id}``: is the process holding a presence alive?"""


class StreamSubstrate(Protocol):
    """The job streams: one per user, consumer group ``bridge-workers``, read by the
    holder, reclaimed from dead consumers."""

    async def enqueue(
        self,
        user_id: str,
        fields: Mapping[str, str],
        *,
        maxlen: int,
        start_within_s: float | None = None,
    ) -> str:
        """XADD with MAXLEN ~ maxlen; creates group GROUP (from 0, MKSTREAM) if missing.
        With ``start_within_s`` (>= 0) the entry also gets ``deadline`` = server time +
        start_within_s and ``enqueued_at`` = server time (Unix seconds on the substrate's
        clock, Redis ``TIME``, whole milliseconds), written by the same atomic step: a
        job's deadline is set and compared on one clock. Returns the entry ID."""

    async def read_pending(self, user_id: str, consumer: str, *, count: int) -> list[Entry]:
        """This consumer's own pending entries, oldest first (bodies may be None: trimmed
        or deleted). A look (XPENDING + XRANGE, not XREADGROUP 0): delivery counts and
        idle times are left as the entries' last real delivery set them, so a drain never
        pushes back the reclaim of an entry it withholds.
        Recreates a missing group (NOGROUP) from 0 and returns []."""

    async def read_new(
        self, user_id: str, consumer: str, *, count: int, block_ms: int | None
    ) -> list[Entry]:
        """XREADGROUP ... BLOCK block_ms STREAMS key >: new entries, [] on timeout
        (``block_ms`` None: no BLOCK, answer at once).
        Each new entry goes to exactly one consumer and into its pending entries list.
        Recreates a missing group (NOGROUP) from 0 and returns []; also returns [] when
        the stream is deleted while blocked (Redis 7: UNBLOCKED)."""

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
        """``read_new`` without BLOCK that also runs :meth:`LedgerSubstrate.mark_delivered`
        (``state``, ``ttl_s``, the entry's own ``deadline``) for every job it reads, in
        the same atomic step: a job is an entry with a ``job_id`` and a numeric
        ``deadline`` and no ``control`` field; its :class:`Entry` carries the verdict in
        ``marked``, other entries have ``marked`` None. One round trip instead of a read
        plus one per job.

        With ``session_id``: reads nothing (returns []) when the user's presence names
        another session, checked in the same step. A session superseded by a newer one
        (its socket maybe half-open: the desktop reconnected elsewhere) learns it only
        at its next heartbeat; meanwhile an entry it took would go into a dead socket
        after the newer session's takeover had run, and wait there for its ping deadline
        and the reclaim idle (issue 16). Presence absent (expired, or not rewritten yet
        after a Redis restart) does not stop the read."""

    async def ack(self, user_id: str, entry_id: str) -> int:
        """XACK; returns the number acknowledged (0 or 1; 0 when the stream or group is gone)."""

    async def autoclaim(
        self, user_id: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> Claimed:
        """XAUTOCLAIM key GROUP consumer min_idle_ms start COUNT count. Pending entries whose
        body is gone are dropped and reported in ``deleted_ids`` whatever their idle time
        (Redis 7 checks existence first); claimed ones count as delivered again.
        A missing group is recreated from 0 and yields ``Claimed("0-0", (), ())``."""

    async def prune_consumers(self, user_id: str, *, idle_ms: int, keep: str) -> int:
        """XGROUP DELCONSUMER every consumer but ``keep`` with nothing pending and idle for
        at least ``idle_ms``; returns how many. (A deleted consumer that reads again is
        recreated by Redis.)"""

    async def queue_info(self, user_id: str, *, count: int = 0) -> QueueInfo:
        """XLEN + XPENDING of the user's stream, up to ``count`` pending entries
        (read-only: metrics and the admin API)."""


class ReaderSubstrate(Protocol):
    """What a holder process needs to read every connected user's stream with a bounded
    number of connections: wake-ups from the enqueuer, and one pipelined heartbeat that
    also tells which users need a read, a reclaim or a lost-entry sweep."""

    async def wake(self, holder_id: str, user_id: str, *, ttl_s: float) -> None:
        """RPUSH ``user_id`` onto ``bridge:wake:{holder_id}`` and PEXPIRE it ``ttl_s``
        (one round trip): the holder process reads the user's stream now instead of at
        its next heartbeat."""

    async def notify_superseded(
        self,
        holder_id: str,
        user_id: str,
        session_id: str,
        *,
        ttl_s: float,
        check: bool = False,
    ) -> None:
        """RPUSH onto ``bridge:wake:{holder_id}`` a notice that ``session_id`` (of
        ``user_id``) no longer holds presence, and PEXPIRE it ``ttl_s`` (one round
        trip): the holder process hands that session over now instead of at its next
        heartbeat (:class:`Superseded` from ``wait_wakes``). ``check``: the notice asks
        instead whether that process holds ``session_id`` (``Superseded.check``)."""

    async def notify_cancel(
        self, holder_id: str, user_id: str, job_id: str, *, ttl_s: float
    ) -> None:
        """RPUSH onto ``bridge:wake:{holder_id}`` ``user_id`` (a wake-up: a hub of an
        older version reads the stream and finds the control entry) and a notice that
        ``job_id`` (of ``user_id``) is to be cancelled (:class:`CancelAsked` from
        ``wait_wakes``), and PEXPIRE it ``ttl_s`` (one round trip)."""

    async def wait_wakes(self, holder_id: str, *, timeout_s: float, count: int) -> list[WakeItem]:
        """BLMPOP ``bridge:wake:{holder_id}`` LEFT COUNT count with a server-side timeout:
        in push order, the user ids pushed (possibly repeated), the entries callers
        read for this process (:class:`Pushed`) and the supersede notices
        (:class:`Superseded`), or [] on timeout. A cancelled wait pops nothing."""

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
        """For every beat, in one round trip (pipelined, one script per user, each within
        that user's slot): refresh presence PX ttl_s if absent or ours (a newer
        session's value stays, its TTL set to ttl_s) and then write the beat's
        catalogue if it has one; probe the user's stream (see :class:`BeatReply`; the
        index only when the group is not quiet or the beat is deep); with ``prune``,
        delete consumers other than ``consumer`` with nothing pending and idle for at
        least ``reclaim_idle_ms``; with ``record_ttl_s``, a deep beat whose presence is
        ours also PEXPIREs the user's daemon record (``bridge:daemons:{user}``, if it
        exists) to ``record_ttl_s``, so a session that outlives the record's TTL keeps
        its instant takeover. Replies in the order of ``beats``. An idle user (group
        quiet, one consumer) costs 3 Redis commands as INFO commandstats counts them."""


class ResultSubstrate(Protocol):
    """Result lists: the holder publishes, the caller waits (invariant 3: durable
    before the XACK)."""

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
        """RPUSH the result list + PEXPIRE ttl_s, atomically; if ``idempotency_key``'s index
        entry names this job, it now expires with the result (a retry attaches as long as
        the answer is kept). Then, in the same round trip, RPUSH ``<job_id> <payload>`` to
        the mailbox ``notify`` (its caller's process) with a TTL of ``MAILBOX_TTL_S``, and
        end the job's progress stream with :func:`outcome_event`, if that stream exists."""

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
        """The holder's one step for an answered entry (one round trip; one script in the
        user's slot), in this order, which matters because a failing write stops the
        step where it fails and keeps what came before:

        1. the fence: with ``epoch``, if the job's claim epoch (raised by
           :meth:`LedgerSubstrate.mark_delivered`) is another one, answer ``stale`` and
           write nothing (a newer delivery owns the job). No epoch stored (expired, or
           the store lost it) or ``epoch`` None: no check;
   1b. a terminal answer is final: if the job's stored state is terminal (finished,
       cancelled, expired, lost: another writer answered it first, e.g. a cancel racing
       the holder's ``expired``, or a stage report racing the tool's answer), only step
       4 happens and the answer is ``settled`` (``done`` if the stored state is
       ``state`` itself: this step retried after its reply was lost);
        2. ``payload`` (if not None) as :meth:`publish_result` writes it: RPUSH +
           PEXPIRE ttl_s, the idempotency record kept as long (invariant 3: durable
           first);
        3. SET the job's ``state`` PX ttl_s, and keep the job id's owner record
           (``bridge:job:{job_id}``, if any) at least as long (``PEXPIRE ... GT``: a job
           answered after its deadline outlived the record's deadline + result TTL;
           under Cluster it is in another slot and follows with step 5);
        4. with ``entry_id``: XACK it and HDEL it from the entry index;
        5. (if a payload was published) the outcome ends the job's progress stream and
           ``<job_id> <payload>`` goes to the mailbox ``notify``, as :meth:`publish_result`.
           Under Redis Cluster these keys live in other slots, so they follow in a second
           round trip, only once the step said ``done``.

        ``provisional``: step 2 is left out, the payload only goes to the caller (step 5):
        an answer that is not the job's last word (an ``in_doubt`` at a hand-over whose
        desktop comes back, ``detail.pending``), so :meth:`get_result` and every retry
        attached by the idempotency key wait for the job's real outcome.

        Returns:
            :class:`Finished`.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: the store is unreachable; the step may or may not have
                happened (retrying it is safe: the XACK of an acknowledged entry is 0).
            Other store errors (a key of another type) propagate; the step stopped at the
            write that failed, so a failed result write leaves the entry pending.
        """

    async def wait_result(self, user_id: str, job_id: str, *, timeout_s: float) -> str | None:
        """BLPOP with a server-side timeout (0: forever); the payload, or None on timeout.
        A cancelled wait pops nothing. (Tests and tools; ``Bridge`` reads results without
        popping them: :meth:`get_result` and the mailbox.)"""

    async def get_result(self, user_id: str, job_id: str) -> str | None:
        """LINDEX 0 of the result list: the first payload published for the job, left in
        place for other waiters (retries attach to it), or None."""

    async def read_notifications(
        self, mailbox: str, *, count: int, block_ms: int
    ) -> list[tuple[str, str]]:
        """BLMPOP up to ``count`` notifications from ``mailbox``, waiting up to
        ``block_ms`` (0: forever): ``[(job_id, payload)]``, [] on timeout. Cancellation as
        ``read_new``: a cancelled read pops nothing it does not return."""

    async def publish_progress(
        self, job_id: str, payload: str, *, ttl_s: float, maxlen: int = 64
    ) -> None:
        """XADD the job's progress stream (MAXLEN ~ maxlen) + (P)EXPIRE ttl_s, one round
        trip. Progress is best effort: readers see the latest reports, not every one."""

    async def read_progress(
        self, job_id: str, after: str, *, block_ms: int
    ) -> list[tuple[str, str]]:
        """XREAD the job's progress stream after entry ID ``after`` ("0": from the start),
        blocking up to ``block_ms`` (server-side) for a first one: ``[(entry_id,
        payload)]``, ``[]`` on timeout or when there is no stream."""


class LedgerSubstrate(Protocol):
    """The job ledger and catalogue: the entry index (lost entries), job states
    (``_jobstate.JobState``), cancel flags, the desktop's tool catalogue."""

    async def job_ids(self, user_id: str, entry_ids: list[str]) -> dict[str, str]:
        """HMGET the index: job id of each entry ID still indexed (enqueued, not acked)."""

    async def trimmed(self, user_id: str) -> list[tuple[str, str]]:
        """Indexed entries no longer in the stream (older than its first entry: trimmed
        by MAXLEN, or the stream was deleted; or deleted from its middle: XDEL) and in no
        consumer's pending entries list (no consumer read them): ``[(entry_id,
        job_id)]``, oldest first."""

    async def forget(self, user_id: str, entry_id: str) -> bool:
        """HDEL the entry from the index. True if this call removed it (the caller then
        owns answering its requester)."""

    async def set_job_state(
        self, user_id: str, job_id: str, state: JobState, *, ttl_s: float
    ) -> None:
        """SET ``bridge:state:{user_id}:job_id`` = state.encode() PX ttl."""

    async def claim_job(self, user_id: str, job_id: str, state: JobState, *, ttl_s: float) -> bool:
        """SET the state NX PX ttl: True if the id was free for this user."""

    async def get_job_state(self, user_id: str, job_id: str) -> JobState | None:
        """GET the state, decoded; raises ``MalformedState`` if it is not a job state."""

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
        """In one atomic step, on the substrate's clock: if ``deadline`` (Unix seconds on
        that clock) has passed and the stored state is not ``delivered``/
        ``awaiting_approval``/``interrupted`` (``FORWARDED``: it may have run, the
        desktop's ledger answers) answer ``expired``; else if a cancel was requested
        answer ``cancelled`` when the stored state is not ``FORWARDED``, and when it is
        (the job may have run) raise the job's claim epoch (the old delivery's late
        answer is refused), leave the state as it was and answer ``in_doubt`` with the
        epoch and ``elsewhere`` (False only when every earlier delivery went to this
        very desktop, whose ledger ``_delivery`` then asks; else the hub answers
        ``in_doubt``); else SET the job state PX ttl, raise the job's claim epoch (INCR
        ``bridge:fence:{user_id}:job_id``, kept until ``deadline`` + ttl_s, at least
        ttl_s), keep the record of ``idempotency_key`` (the entry's), if it names this
        job, at least ttl_s (``PEXPIRE ... GT``: a holder that dies writes nothing more,
        and a retry must still find the key's job) and answer ``delivered`` with the
        epoch. Only ``delivered``, and ``in_doubt`` with ``elsewhere`` False, may be
        forwarded. ``read_new_delivered`` and the push delivery of ``submit`` do the
        same for the entry's ``idempotency_key`` field."""

    async def keep_job(
        self, user_id: str, job_id: str, *, ttl_s: float, idempotency_key: str | None = None
    ) -> None:
        """The job still runs (its holder is serving it): each of its records that
        exists lives at least ``ttl_s`` more seconds, none is shortened, none is made
        (``PEXPIRE ... GT``): the state, the claim epoch, the cancel flag, the
        ``idempotency_key``'s record and the ``bridge:job:{job_id}`` owner record. One
        write (under Cluster split per node: the owner record is in another slot).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: the store is unreachable (nothing or some extended).
        """

    async def keep_job_ids(self, job_ids: Sequence[str], *, ttl_s: float) -> None:
        """Each ``bridge:job:{job_id}`` owner record (of a caller-chosen job id) that
        exists and is not marked answered (``JobOwner.answered``: the answer's write,
        which may land first, wins) lives at least ``ttl_s`` more seconds (``PEXPIRE ...
        GT``: none is shortened, none is made). One write (under Cluster split per node). The
        delivery's keep of a forwarded job's chosen id (``_keepalive``): the mark keeps
        its state ``forwarded_keep_s`` in the user's slot, which cannot reach this one.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: the store is unreachable (nothing or some extended).
        """

    async def unmark_delivered(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """Undo a delivery mark that was never forwarded (a job pushed to a process
        that no longer holds the session it was marked for), in one atomic step: only
        while the job's claim epoch is still ``epoch`` and its stored stage is
        ``delivered``, SET the state to ``state`` (``queued``) PX ttl and DEL the claim
        epoch (no delivery exists, so a cancel may answer ``cancelled`` again). True if
        it did."""

    async def restore_delivery(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """Write back a delivery that a store rewound to ``queued`` (it lost its last
        writes: the delivery's mark among them), in one atomic step: only while the
        stored stage is ``queued`` and the job's claim epoch is absent or not above
        ``epoch`` (the delivery's own), SET the state to ``state`` (``delivered``) PX
        ttl and the claim epoch to ``epoch`` (its TTL never shortened). The holder of the
        delivery does it (``_cancel_notice``): a cancel flag then makes the job's next
        reader ask the desktop (``in_doubt``, not ``elsewhere``) instead of answering
        ``cancelled``. True if it wrote; False for a state absent, malformed or not
        ``queued`` (answered, or delivered again), or a newer delivery's epoch.

        Raises:
            SubstrateUnavailable: the store is unreachable (written or not).
        """

    async def cancel_requested(self, user_id: str, job_id: str) -> bool:
        """Whether ``bridge:cancel:{user_id}:job_id`` (the job's cancel flag) exists.

        Raises:
            SubstrateUnavailable: the store is unreachable.
        """

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """SET ``bridge:cancel:{user_id}:job_id`` 1 NX PX ttl (an existing flag keeps its
        value and TTL): the job's deliveries are refused from now on. Writes no control
        entry (``Bridge.withdraw`` of a job whose enqueue may still land)."""

    async def send_cancel(
        self, user_id: str, job_id: str, *, ttl_s: float, maxlen: int
    ) -> str | None:
        """One atomic step: :meth:`request_cancel`, and unless the flag says ``sent``,
        XADD the indexed ``control: cancel`` entry for ``job_id`` to the user's stream
        (MAXLEN ~ ``maxlen``, the group made if missing, as :meth:`enqueue`) and mark the
        flag ``sent`` (its TTL kept). So concurrent cancels of one job write one control
        entry between them, and a step that failed wrote neither the entry nor the mark
        (its retry sends it).

        Returns:
            The control entry's ID, or None when an earlier cancel of the job sent one.

        Raises:
            ValueError: ``maxlen`` < 1 or ``ttl_s`` not positive.
            SubstrateUnavailable: the store is unreachable or refused the write (the
                step may or may not have run).
        """

    async def claim_job_id(
        self, job_id: str, owner: JobOwner, *, ttl_s: float, replace: bool = False
    ) -> bool:
        """SET ``bridge:job:{job_id}`` NX PX ttl: True if no job (of any user) has this id.
        Used before :meth:`submit` when the caller chose the job id.

        ``replace``: the caller enqueued its job under the id (going on with another
        copy's claim of the same request): write ``owner`` whatever record is there,
        unless it is marked answered (the job's answer landed first; left as it is), in
        one step. A refused copy's late :meth:`forget_job_id` then finds another
        record and keeps it. True if written."""

    async def job_owner(self, job_id: str) -> JobOwner | None:
        """GET ``bridge:job:{job_id}``: whose job it is and its caller's mailbox, or None."""

    async def forget_job_id(self, job_id: str, owner: JobOwner) -> None:
        """DEL ``bridge:job:{job_id}`` if it is still ``owner``'s record, as written by
        :meth:`claim_job_id` (one step): a claimed id whose job was never enqueued. A
        record rewritten meanwhile (another copy's re-claim of the job it enqueued, the
        answered mark) stays."""

    async def submit(self, user_id: str, submission: Submission) -> Submitted:
        """The caller's one step (one script, one round trip; see :class:`Submission`):
        idempotency index, presence, catalogue version, job id claim, XADD with the
        deadline from the substrate's clock, entry index, and the wake-up of
        ``submission.alive_holder`` (in the script, or under Cluster in the same write);
        then, only once queued, the ``bridge:job:{job_id}`` owner record (if
        ``submission.write_owner``: a second write; if it fails, this raises
        ``SubstrateUnavailable`` with the job enqueued)."""

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """SET ``bridge:tools:{user_id}`` (JSON array of tool specs), no TTL."""

    async def get_catalogue(self, user_id: str) -> str | None:
        """GET ``bridge:tools:{user_id}``."""


class Substrate(
    PresenceSubstrate,
    StreamSubstrate,
    ReaderSubstrate,
    ResultSubstrate,
    LedgerSubstrate,
    DesktopSubstrate,
    RevocationSubstrate,
    McpSessionSubstrate,
    Protocol,
):
    """Everything the hub needs from its store: the eight parts (``DesktopSubstrate`` in
    ``_substrate_desktop``, ``RevocationSubstrate`` in ``_revocation``,
    ``McpSessionSubstrate`` in ``_mcp_store``), plus health and
    lifetime. ``MemorySubstrate`` and ``RedisSubstrate`` implement all of it; the shared
    contract suite is ``deskbridge_hub.testing.check_substrate``."""

    async def ping(self) -> None:
        """Round trip to the store (health check)."""

    async def aclose(self) -> None:
        """Release connections (the object stays usable). Idempotent."""

    def history_changes(self) -> int:
        """How many times the store was found to hold another data set than before (a
        Redis failover or a restart without persistence, seen by its health probe as
        another replication history): its last writes, presence among them, may be
        lost. 0 for a store that cannot tell; only increases."""

    def health_warnings(self) -> tuple[str, ...]:
        """What the store's last health check found that does not stop calls but stops
        an operator view (Redis: commands only those views send, refused by the ACL,
        each with its grant); ``/healthz`` reports them and still answers 200. Empty
        when there is none."""
