"""The values the substrate contract (``_substrate``) takes and returns: heartbeats,
stream entries, claims, delivery verdicts, job owners, submissions."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import attrs

from ._jobstate import JobState


@attrs.frozen
class Beat:
    """One session's heartbeat (see :meth:`ReaderSubstrate.heartbeat`).

    Attributes:
        user_id: whose presence.
        session_id: the session that should hold it.
        catalogue: the session's tool catalogue (JSON text) to write with the refresh,
            or None to leave the stored one alone (it is written at the handshake and
            only needs rewriting when the store may have lost it: see
            :attr:`BeatReply.taken`).
        deep: also look for entries trimmed before anyone read them when the user's
            consumer group looks quiet (nothing undelivered, nothing pending). The
            reader asks for it after it read entries for the user and now and then.
    """

    user_id: str
    session_id: str
    catalogue: str | None = None
    deep: bool = False


@attrs.frozen
class BeatReply:
    """What one heartbeat found.

    Attributes:
        ours: presence was absent or ours and is refreshed; False: a newer session holds
            it (hand over; its value stays, its TTL set to ``ttl_s``).
        taken: presence was absent (expired, or the store lost it) and is now ours: the
            catalogue may be gone too, so write it (a beat with ``catalogue``). Also set
            when a ``deep`` beat without a catalogue found the catalogue gone (evicted:
            the store lost data while presence stayed).
        backlog: the user's stream has entries never delivered to the group (a missed
            wake-up), or its group is missing: read it.
        reclaim_due: an entry has been pending for at least the reclaim idle: run a
            reclaim pass for this user.
        trimmed_due: the entry index names an entry older than the stream's first entry
            (or the stream is gone), or, on a ``deep`` beat, one deleted from the
            stream's middle (XDEL): look for entries trimmed or deleted before anyone
            read them. Checked when the group is not quiet, or the beat is ``deep``.
        error: the store refused this user's beat (one of its keys holds the wrong kind
            of value: another program wrote it, or an operator did), with its message;
            nothing else is known (every flag False). Other users' beats are unaffected.
        unavailable: this user's beat met an outage of the part of the store holding
            its keys (a Cluster node down, its slot migrating) while other users' beats
            ran, with the outage's message; nothing else is known (every flag False):
            beat it again soon. A whole-store outage raises instead.
    """

    ours: bool
    backlog: bool = False
    reclaim_due: bool = False
    trimmed_due: bool = False
    taken: bool = False
    error: str | None = None
    unavailable: str | None = None


@attrs.frozen
class Asleep:
    """The desktop is (probably) asleep (issue 12.6; see :meth:`DesktopSubstrate.get_asleep`).

    Attributes:
        since: Unix seconds (the hub's wall clock) since when.
        source: ``"announced"`` (the sidecar said ``sleeping``) or ``"detected"`` (its
            socket went missing soon after it reported a sleep in ``hello.slept_s``).
    """

    since: float
    source: str


@attrs.frozen
class Marked:
    """Reply of :meth:`LedgerSubstrate.mark_delivered`.

    Attributes:
        verdict: ``"delivered"`` (state written: forward the job), ``"expired"`` (its
            deadline has passed on the substrate's clock and it was never forwarded;
            state untouched; a job forwarded before is ``"delivered"`` again: the
            desktop's ledger answers a redelivery),
            ``"cancelled"`` (a cancel was requested and the job was never forwarded;
            state untouched) or ``"in_doubt"`` (a cancel was requested for a job
            forwarded before, which may have run: answer it in doubt, never
            "cancelled"; the epoch is raised so the old delivery's answer is refused).
        server_time: the substrate's clock when it decided (Redis ``TIME``), Unix seconds.
            ``deadline - server_time`` is the time the job has left, measured on the one
            clock that set the deadline (docs/operations.md, "Clocks").
        epoch: for ``delivered`` and ``in_doubt``, this delivery's claim epoch (fencing
            token): the job's counter, raised by every delivery, so a later delivery
            (after a reclaim or a takeover) always holds a larger one; None for the other
            verdicts.
        elsewhere: for ``delivered`` and ``in_doubt``, whether an earlier delivery of
            the job went to another desktop than this one (another ``daemon_id``, or one
            not known): that desktop may have started it, so this one's "refused as
            late" is not "did not run" (the recorded ``daemon_id`` is then ``?``; an
            ``in_doubt`` leaves the state as it was). False for ``in_doubt``: every
            earlier delivery went to this desktop, whose ledger knows the job.
    """

    verdict: str
    server_time: float
    epoch: int | None = None
    elsewhere: bool = attrs.field(default=False, converter=bool)


@attrs.frozen
class Finished:
    """Reply of :meth:`ResultSubstrate.finish`.

    Attributes:
        verdict: ``"done"`` (everything written), ``"stale"`` (a newer delivery of the
            job holds the fence: nothing written) or ``"settled"`` (the job had a
            terminal answer already: only the XACK happened).
        newest: with ``"stale"``, the newest delivery's epoch.
        acked: with ``"done"`` or ``"settled"``, whether the XACK removed the entry from the pending
            entries list (False when it was not pending: acknowledged already, or the
            stream or group is gone).
    """

    verdict: str
    newest: int | None = None
    acked: bool = False


@attrs.frozen
class Entry:
    """One stream entry as read by a consumer.

    Attributes:
        entry_id: the Redis stream entry ID (``"<ms>-<seq>"``).
        fields: the entry's field/value pairs, or ``None`` when the entry is still in the
            pending entries list but its body was trimmed (MAXLEN) or deleted (XDEL).
        marked: the delivery verdict when the read also marked it delivered
            (:meth:`StreamSubstrate.read_new_delivered`), else None.
        received_at: for an entry a caller's step read and pushed (:class:`Pushed`), the
            local clock (``anyio.current_time()``, seconds) when ``wait_wakes`` popped it:
            its mark was taken at submit, so the holder counts the time it has held it
            since from here (the deadline); None otherwise.
    """

    entry_id: str
    fields: Mapping[str, str] | None
    marked: Marked | None = None
    received_at: float | None = None


@attrs.frozen
class Claimed:
    """Reply of :meth:`Substrate.autoclaim` (XAUTOCLAIM).

    Attributes:
        next_start: cursor for the next call; ``"0-0"`` when the scan is complete.
        entries: entries now owned by the claiming consumer (bodies present).
        deleted_ids: pending entry IDs whose body no longer exists; XAUTOCLAIM removed them
            from the pending entries list (Redis >= 7), the caller must answer their
            callers "lost".
        quiet: (``take_over`` only) nothing waits in the user's stream: no entry pending
            on any consumer, none undelivered to the group, the entry index empty; so a
            starting session has nothing to drain, reclaim, sweep or read (issue 10: the
            attach of an idle desktop is one round trip). False when unsure.
    """

    next_start: str
    entries: tuple[Entry, ...]
    deleted_ids: tuple[str, ...]
    quiet: bool = False


#: How long a process's notification mailbox outlives its last notification, seconds: a
#: mailbox whose process died is gone after this (its callers' results stay in their lists).
MAILBOX_TTL_S = 120.0


#: The last part of an answered job's owner record (``JobOwner.answered``).
ANSWERED_MARK = " !"
#: What starts the request digest in an owner record (user ids and mailboxes never do).
REQUEST_MARK = "="
#: What starts a claim's own token in an owner record (user ids and mailboxes never do).
CLAIM_MARK = "#"


@attrs.frozen
class JobOwner:
    """The value of ``bridge:job:{<job_id>}``: whose job, where its caller waits, and
    whether the job is answered: the answer's write appends :data:`ANSWERED_MARK` (in
    the record's own slot), so a keep of a forwarded id that lands after it keeps
    nothing (``Substrate.keep_job_ids``) and the id is free again with the answer's
    state, whatever the order of the two writes."""

    user_id: str
    reply_to: str | None = None
    answered: bool = False
    #: the request that claimed the id (``_idempotency.request_digest``), stored as
    #: `` =<digest>`` before the answered mark; None in records of older hubs
    request: str | None = attrs.field(default=None, kw_only=True)
    #: the claiming call's own token (random), stored as `` #<token>`` right after the
    #: user id (an older hub reads the last other part as ``reply_to``: still the
    #: mailbox): copies of one request write records that differ only here, so a copy
    #: drops only its own claim (``Substrate.forget_job_id``); None in older records
    claim: str | None = attrs.field(default=None, kw_only=True)

    def encode(self) -> str:
        text = self.user_id
        if self.claim is not None:
            text += f" {CLAIM_MARK}{self.claim}"
        if self.reply_to is not None:
            text += f" {self.reply_to}"
        if self.request is not None:
            text += f" {REQUEST_MARK}{self.request}"
        return text + ANSWERED_MARK if self.answered else text

    @classmethod
    def decode(cls, text: str) -> JobOwner:
        answered = text.endswith(ANSWERED_MARK)
        user_id, *rest = text.removesuffix(ANSWERED_MARK).split(" ")
        request = reply_to = claim = None
        for part in rest:
            if part.startswith(REQUEST_MARK):
                request = part.removeprefix(REQUEST_MARK)
            elif part.startswith(CLAIM_MARK):
                claim = part.removeprefix(CLAIM_MARK)
            elif part:
                reply_to = part
        return cls(user_id, reply_to, answered, request=request, claim=claim)


@attrs.frozen(kw_only=True)
class Submission:
    """What :meth:`LedgerSubstrate.submit` needs to enqueue one job.

    Attributes:
        job_id: the job's id.
        fields: the stream entry's fields (``_jobs.job_fields``), without ``deadline`` /
            ``enqueued_at``, which the substrate adds from its clock.
        start_within_s: the job must start within this many seconds (>= 0).
        state: the ``queued`` job state, claimed NX for ``state_ttl_s``.
        state_ttl_s: how long the state (and the owner record) lives.
        maxlen: the stream's ``MAXLEN ~``, and the queue's bound: with this many entries
            of the user not yet acknowledged (the entry index's length) the step answers
            ``queue_full`` and writes nothing, so the trim never takes an unread entry.
        catalogue_sha1: SHA-1 (hex) of the catalogue the caller validated against ("" for
            none cached), or None to skip the catalogue check (``status``).
        idempotency_key: the caller's key to index (None: the key is the job id itself,
            nothing to index).
        index_value: the index record (``_idempotency.IndexRecord.encode()``); the
            substrate stores it with `` <deadline>`` appended (the job's, from its clock).
        index_ttl_s: how long the index record lives before the job's result is published.
        owner: the owner record (``bridge:job:{job_id}``).
        write_owner: also SET the owner record, once queued (a second write; the Bridge does not
            need it: a hub-minted job id names its user, a caller-chosen one was claimed
            with ``claim_job_id`` first).
        alive_holder: the hub process the caller knows to be alive (its liveness key
            checked within ``HOLDER_ALIVE_CACHE_S``), expected to hold the user's socket.
            The script enqueues only while the presence names that process (or names
            none: older hubs) and, on a single Redis, its liveness key is set; otherwise
            it answers ``holder`` and writes nothing, and the caller checks the process
            the presence names. Its wake list
            (``bridge:wake:{holder}``) gets the user id in the same write, so the holder
            reads the stream at once.
        wake_ttl_s: TTL of that wake list after the push.
        delivered_ttl_s: push delivery (issue 10: the holder's read in the caller's
            step). When set, on a single Redis, and the holder process registered its
            consumer name with its liveness (``set_liveness(consumer=...)``), and the new
            entry is the group's only undelivered one, the script also reads it into that
            consumer's pending entries list and marks it delivered (state with the
            presence's session id, PX ceil(delivered_ttl_s * 1000); claim epoch raised),
            as ``read_new_delivered`` would, and pushes the read entry itself
            (:class:`Pushed`) onto the wake list instead of the user id. None: never.
        give_up_s: the caller stops waiting this many seconds after it calls ``submit``
            (> 0), or None: no bound. The substrate turns the moment of the call into an
            instant on its own clock that is not later than the real one (Redis: from a
            ``TIME`` read earlier, ``RedisSubstrate``'s clock reading), so that a step
            that runs only after the caller gave up (Redis stalled with the command in
            its input) answers ``late`` and writes nothing, and ``start_within_s`` counts
            from that instant, not from when the step ran (a job enqueued late in a
            caller's wait never starts after the wait).
        attach_only: only look the ``idempotency_key`` up (it must be set): ``indexed``
            when it names a job, else ``job_id_in_use`` and nothing else is checked or
            written. For a request whose caller-chosen job id another call claimed: the
            same request sent again or at once elsewhere attaches, never enqueues.
        own: the job id is this call's own (minted by the hub for it, or claimed by it
            with ``claim_job_id``): a state already stored under it can only have been
            written by an earlier run of this very step whose reply was lost (its
            connection died after Redis ran it), so the step answers ``queued`` (with an
            empty ``entry_id``) instead of ``job_id_in_use``, and an idempotency record
            naming this job likewise; the step may then be sent again on a new
            connection (``_redis_resend``). False: a found job proves nothing, and a
            step whose connection died is answered SubstrateUnavailable.
    """

    job_id: str
    fields: Mapping[str, str]
    start_within_s: float
    state: JobState
    state_ttl_s: float
    maxlen: int
    catalogue_sha1: str | None
    idempotency_key: str | None
    index_value: str
    index_ttl_s: float
    owner: JobOwner
    write_owner: bool = False
    alive_holder: str | None = None
    wake_ttl_s: float = 30.0
    delivered_ttl_s: float | None = None
    give_up_s: float | None = None
    attach_only: bool = False
    own: bool = False


@attrs.frozen
class Submitted:
    """Reply of :meth:`LedgerSubstrate.submit`.

    Attributes:
        verdict: ``queued`` (enqueued); ``offline`` (no presence; nothing written);
            ``catalogue`` (the desktop's catalogue is not the one the caller validated
            against: ``catalogue`` holds it, None if there is none; nothing written);
            ``job_id_in_use`` (nothing written); ``queue_full`` (the user already has
            ``maxlen`` entries not yet acknowledged; nothing written); ``indexed`` (the
            idempotency key already names a job: ``index_value`` is its record; nothing
            written); ``holder`` (the presence names a hub process other than
            ``alive_holder``: ``presence`` holds it; nothing written); ``late`` (the step
            ran after the caller's ``give_up_s``; nothing written).
        catalogue: see ``catalogue``.
        index_value: see ``indexed``.
        entry_id: the stream entry ID when ``queued``.
        presence: the presence value (holder session id) when ``queued`` or ``holder``.
        server_time: the substrate's clock (Redis ``TIME``, Unix seconds) when it
            answered ``indexed``: with the record's deadline, how long the job it names
            may still start.
        pushed: ``queued`` and pushed to the holder already read and marked delivered
            (see ``Submission.delivered_ttl_s``).
        holder_alive: ``queued`` and the step itself found ``alive_holder``'s liveness
            key (single Redis; then an absent key answers ``holder``): the caller may
            trust that process's liveness anew.
    """

    verdict: str
    catalogue: str | None = None
    index_value: str | None = None
    entry_id: str | None = None
    presence: str | None = None
    server_time: float | None = None
    pushed: bool = False
    holder_alive: bool = False


@attrs.frozen
class Pushed:
    """An entry the caller's step read for a holder process (push delivery, see
    ``Submission.delivered_ttl_s``), as ``wait_wakes`` returns it.

    Attributes:
        user_id: whose stream it was read from.
        entry: the entry, already in the holder consumer's pending entries list, with its
            ``marked`` verdict (``delivered`` and the claim epoch, or ``cancelled``).
    """

    user_id: str
    entry: Entry


@attrs.frozen
class Superseded:
    """A notice on a holder process's wake list: a newer session of ``user_id`` took
    presence from ``session_id``, one of this process's sessions (the newer one's
    handshake pushes it, so the older one hands over at once instead of at its next
    heartbeat), as ``wait_wakes`` returns it.

    Attributes:
        user_id: whose presence was taken.
        session_id: the session that no longer holds it.
        check: not a supersede but a doubt: a session of another process found presence
            naming ``session_id`` (the store may have lost its last writes and named an
            older session again); clear it unless this process holds that session
            (``_presence_doubt``).
    """

    user_id: str
    session_id: str
    check: bool = False


@attrs.frozen
class Revoked:
    """A notice on a holder process's wake list: ``user_id``'s tokens issued before
    ``before_s`` are revoked (``deskbridge-hub revoke`` pushes it to the process whose
    session holds presence), as ``wait_wakes`` returns it. The process closes its
    sessions of that user whose token's ``iat`` is earlier (``_revocation``).

    Attributes:
        user_id: whose tokens.
        before_s: the cut-off, Unix seconds.
    """

    user_id: str
    before_s: float


@attrs.frozen
class Revocation:
    """A user's revocation record (``bridge:revoked:{<user_id>}``, ``_revocation``):
    every token of the user whose ``iat`` is earlier than ``before_s`` (or that has no
    ``iat``) is refused.

    Attributes:
        before_s: the cut-off, Unix seconds (a whole second: ``iat`` is one).
        at_s: when it was recorded, Unix seconds (the revoking machine's clock).
    """

    before_s: float
    at_s: float

    def refuses(self, issued_at: float | None) -> bool:
        """True if a token issued at ``issued_at`` (its ``iat``; None: none) is revoked."""
        return issued_at is None or issued_at < self.before_s

    def shown(self) -> dict[str, float | None]:
        """``{"before": ..., "at": ...}`` as the admin API shows it (a record that did not
        decode: ``before`` null)."""
        before = self.before_s if math.isfinite(self.before_s) else None
        return {"before": before, "at": self.at_s}

    def encode(self) -> str:
        """JSON ``{"before": ..., "at": ...}``, as stored."""
        return json.dumps({"before": self.before_s, "at": self.at_s})

    @classmethod
    def decode(cls, text: str | bytes | None) -> Revocation | None:
        """The record from its JSON, or None (absent). A record that does not decode
        refuses every token (``before_s`` = +inf): a revocation is never dropped for
        its form."""
        if text is None:
            return None
        try:
            data = json.loads(text)
            return cls(float(data["before"]), float(data["at"]))
        except (ValueError, KeyError, TypeError):
            return cls(math.inf, 0.0)


@attrs.frozen
class CancelAsked:
    """A notice on a holder process's wake list: a cancel of ``job_id`` (``user_id``'s)
    was requested (``Bridge.cancel`` pushes it to the process whose session holds
    presence), as ``wait_wakes`` returns it. The holder sends the ``cancel`` frame for a
    delivery of the job on its socket, or answers a job it never forwarded
    ``cancelled``, whatever room the session has: the job's control entry waits in the
    stream behind the jobs queued before it, and a session whose in-flight window is
    full reads nothing (``_cancel_notice``).

    Attributes:
        user_id: whose job.
        job_id: the job to cancel.
    """

    user_id: str
    job_id: str


#: One item ``wait_wakes`` pops from a holder process's wake list: a user id to read, a
#: pushed entry, or a notice.
WakeItem = str | Pushed | Superseded | Revoked | CancelAsked
