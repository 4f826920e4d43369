"""One reader per hub process for every connected user's stream (issue 10).

A hub process holds thousands of idle desktops on a bounded number of Redis connections:
no per-desktop blocking read, no per-desktop reclaim pass, no per-desktop heartbeat round
trip. Three loops, all owned by :meth:`ProcessReader.run`'s nursery:

* **wake-ups**: the enqueuer pushes the user id onto this process's wake list
  (``bridge:wake:{<holder>}``; the holder id is the prefix of the session id that
  presence holds). One blocking BLMPOP per process pops them; each woken user is read
  once, without BLOCK, for as long as a read comes back full. The same list carries
  notices: a supersede (``Superseded``), a token revocation (``Revoked``, handed to
  ``_revocation.RevocationWatch``, whose sweep also runs in this reader's nursery) and a
  job's cancel (``CancelAsked``, handed to the session: ``_cancel_notice``).
* **heartbeat**: each session is beaten every ``heartbeat_s`` (30 s by default), counted
  from its handshake, so the beats of many sessions spread over the interval; beats due
  within ``BEAT_BATCH_S`` of each other go out in one pipelined write (one script per
  session, each in its user's slot). A beat refreshes presence (the catalogue is written
  only when the store may have lost it) and reports, per user, entries never delivered
  (a missed wake-up: read), entries pending past the reclaim idle (reclaim: XAUTOCLAIM
  for that user only) and indexed entries older than the stream (lost-entry sweep);
  idle empty consumers of dead processes are deleted by the same script. So a missed
  wake-up delays a job by at most one heartbeat, and an idle desktop costs one script
  of 3 Redis commands per heartbeat (0.1 commands/s at 30 s) and its pings. After a
  failure, or when this process's liveness key had lapsed (Redis lost its data, or the
  process stalled), every session is beaten at once, catalogues included.
* **workers**: a fixed number of tasks serve the due users, one pump per user at a time:
  drain this consumer's own pending entries (from ``0``, skipping those in flight),
  reclaim, sweep, read new entries (``>``), as much as the session has capacity for.

Recovery guarantees kept from the per-user relay: a new session drains its own pending
entries and reclaims at once; an entry whose serving task ended without an answer (the
socket died) is drained again when the user's next session is attached; a NOGROUP read
heals the group; a substrate outage is retried with bounded back-off (an entry whose
wake-up was lost meanwhile is found by the next heartbeat).
"""

from __future__ import annotations

import logging
from collections import deque

import attrs
import trio
from deskbridge_common import Timings

from . import _metrics
from ._beats import BeatSchedule, Listener, SessionGone
from ._errors import SubstrateMisconfigured, SubstrateUnavailable
from ._jobstate import forwarded_keep_s
from ._keepalive import RunningJobs
from ._logging import fields
from ._outage import outage_log
from ._outage import succeeded as outage_over
from ._own_liveness import own_liveness
from ._pacer import Pacer
from ._presence_doubt import Verdict, check_holder, clear_ended, unmark_unheld
from ._retry import (
    CLEANUP_TIMEOUT_S,
    CUT_OFF_MIN_S,
    HEARTBEAT_RETRY_S,
    PROCESS_LIVENESS_REFRESH_S,
    PROCESS_LIVENESS_RETRY_S,
    PROCESS_LIVENESS_TTL_S,
    READ_ERROR_BACKOFF_S,
)
from ._revocation import RevocationWatch
from ._substrate import (
    Beat,
    BeatReply,
    CancelAsked,
    Entry,
    Pushed,
    Revoked,
    Substrate,
    Superseded,
)

__all__ = ["Listener", "ProcessReader"]

log = logging.getLogger("deskbridge.hub.reader")

#: Entries asked for per read and per XAUTOCLAIM batch.
READ_BATCH = 32
#: Most XAUTOCLAIM batches per reclaim pass of one user (bounds one pass's work).
RECLAIM_MAX_BATCHES = 100
#: Tasks reading due users concurrently (each holds at most one Redis command at a time,
#: so this also bounds the reader's share of the connection pool).
WORKERS = 8
#: Most wake-ups popped per BLMPOP.
WAKE_BATCH = 1000
#: Longest block of the wake-up BLMPOP, seconds (the heartbeat if shorter). A wait whose
#: connection is black-holed (a partition of that one connection, a dead NAT entry: no
#: reset) is given up only when its reply is late by the command timeout (5 s), and
#: every job pushed to this process meanwhile waits for that (and for the drain that
#: follows, ``_wait_lost``): with the heartbeat (30 s) as the block it was up to 35 s,
#: now 7 s. The price: an idle process sends one BLMPOP every 2 s instead of every 30 s
#: (its liveness refresh alone is one command a second).
WAKE_BLOCK_S = 2.0
#: A wake-up wait that answered later than its block plus this (seconds) was late in
#: transit (a slow path): what it popped may have waited for that long.
WAKE_LATE_S = 0.5
#: Longest pause, seconds, between retries of a process-wide loop whose step keeps
#: failing unexpectedly (``ProcessReader._unexpected``; 1 s doubling).
UNEXPECTED_BACKOFF_MAX_S = 30.0
#: Most entries one session start takes over from its daemon's dead sockets (issue 12.4;
#: more wait for the reclaim idle).
TAKEOVER_BATCH = 256
#: How long the record of which daemon each consumer's deliveries went to is kept after
#: the user's last session start or deep heartbeat (every few minutes), seconds: 7 days
#: for a user gone, while a session that stays connected longer keeps it (an expired
#: record only costs the instant takeover).
DAEMON_RECORD_TTL_S = 7 * 86_400.0

DRAIN = "drain"  # this consumer's own pending entries, from 0
NEW = "new"  # entries never delivered (>)
RECLAIM = "reclaim"  # XAUTOCLAIM entries idle past reclaim_idle_s
TRIMMED = "trimmed"  # indexed entries trimmed before anyone read them
TAKEOVER = "takeover"  # record the session's daemon; claim what went to it elsewhere
#: the same for a running session whose beat wrote lost presence back: the store may
#: have lost the daemon record with it (Redis restarted empty, FLUSHALL, an eviction)
RECORD = "record"
#: a beat found presence held by another session: check that session is real before
#: handing over (``_presence_doubt``)
CHECK = "check"
PUSHED = "pushed"  # entries a caller's step read for this process (push delivery)
#: Entries of one user whose dispatch this process remembers, to refuse a pushed copy of
#: one it already served (a wake-up popped after a drain found the entry). Per user, so
#: other users' traffic cannot evict it; a user's pushed copies are at most its sessions'
#: in-flight limit behind, far fewer than this.
DISPATCHED_REMEMBERED = 1024
#: Checks of a holder that was not ours before the session hands over (``_doubt``), a
#: beat (about a second) apart: a dead holder process's liveness key lapses within 3 s,
#: and a live one answers the ``check`` notice within its wake-up wait (2 s).
DOUBT_ASKS = 5
#: Sessions that ended in this process, remembered to tell a presence naming one of
#: them (a store that lost its last writes) from a session still starting.
ENDED_REMEMBERED = 4096
ALL = frozenset({TAKEOVER, DRAIN, NEW, RECLAIM, TRIMMED})
#: Users whose deliveries' daemons this process remembers (least recent dropped first:
#: a forgotten user's pending entries go to its next session at once, as before).
HANDED_USERS_REMEMBERED = 10_000
#: Deliveries remembered per user, most recent last: four times the default in-flight
#: limit of a session (``DESKBRIDGE_MAX_INFLIGHT``, 32), so every entry still pending on
#: this consumer is covered, while the memory stays bounded at about 1.3 M entries a
#: process (10,000 users; 1,024 per user made up to ~10 M, found by review).
HANDED_PER_USER = 128


@attrs.define(eq=False)
class ProcessReader:
    """Reads every attached user's stream for this process (see the module docstring).

    Attributes:
        substrate: the shared substrate.
        timings: ``heartbeat_s``, ``presence_ttl_s``, ``reclaim_idle_s``.
        consumer: this process's consumer name.
        holder_id: this process's wake-list id (prefix of its session ids).
        inflight: per user, entry IDs being served in this process (shared with the
            sessions).
        timers: the process's session timers (``_pacer``), run alongside, or None.
        running_jobs: see the attribute.
        revocations: see the attribute.
        max_pending: see the attribute.
    """

    substrate: Substrate
    timings: Timings
    consumer: str
    holder_id: str
    inflight: dict[str, set[str]]
    timers: Pacer | None = None
    #: The jobs this process serves, whose records are kept alive while they run
    #: (``_keepalive``), run alongside, or None.
    running_jobs: RunningJobs | None = None
    #: Applies token revocations to this process's sessions (``_revocation``): the wake-up
    #: loop hands it the notices it pops, and its sweep runs alongside; or None.
    revocations: RevocationWatch | None = None
    #: Most deliveries a session takes at once (``max_inflight_per_session``): callers
    #: push an entry to this process only while the group has fewer pending.
    max_pending: int = 32
    _listeners: dict[str, Listener] = attrs.field(factory=dict)
    _beating: dict[str, Listener] = attrs.field(factory=dict)
    _due: dict[str, set[str]] = attrs.field(factory=dict)
    _queue: deque[str] = attrs.field(factory=deque)
    _busy: set[str] = attrs.field(factory=set)
    #: Per user, entries callers' steps read for this process and pushed onto its wake
    #: list (``Pushed``), not yet dispatched.
    _pushed: dict[str, list[Entry]] = attrs.field(factory=dict)
    #: the nursery of :meth:`run` while it runs (``detach`` starts clean-ups in it)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: Per user, the entry IDs dispatched lately, oldest first (see ``_dispatch``).
    _dispatched: dict[str, dict[str, None]] = attrs.field(factory=dict)
    #: Session ids that ended (detached) in this process, oldest first (bounded).
    _ended: dict[str, None] = attrs.field(factory=dict)
    #: user id -> entry id -> the daemon (``hello.daemon_id``) this process last handed
    #: it to; kept across sessions (bounded by HANDED_PER_USER per user): the
    #: drain gives a gone daemon's pending entries to another daemon only via reclaim
    _handed_to: dict[str, dict[str, str | None]] = attrs.field(factory=dict)
    #: Idle workers park here; each due user unparks exactly one (a shared Event woke
    #: all ``WORKERS`` per wake-up, seven of them only to find the queue empty).
    _idle: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _failures: int = 0
    #: Unexpected failures in a row of each process-wide loop (``_unexpected``).
    _unexpected_streaks: dict[str, int] = attrs.field(factory=dict)
    _check_presence: bool = False  # after an outage: is one presence intact?
    #: ``substrate.history_changes()`` when last looked at (the liveness loop).
    _history: int = 0
    #: When this process's liveness key was last refreshed (trio clock; the reader's
    #: start until then): see ``_cut_off_loop``.
    _live_at: float = 0.0
    #: When the refreshes began to find the key lapsed, each of them (None: the last
    #: one found it alive): see ``_cut_off_loop``.
    _lapsing_since: float | None = None
    #: Sessions were ended because the process was cut off from Redis (logged once).
    _cut_off: bool = False
    _schedule: BeatSchedule = attrs.field(init=False)
    _beat_now: trio.Event = attrs.field(factory=trio.Event)
    running: bool = False

    def __attrs_post_init__(self) -> None:
        self._schedule = BeatSchedule(self.timings.heartbeat_s)

    @property
    def cut_off_s(self) -> float:
        """How long this process may go without refreshing its liveness key before it
        ends its sessions (``_cut_off_loop``): the presence TTL, at least
        ``CUT_OFF_MIN_S``."""
        return max(self.timings.presence_ttl_s, CUT_OFF_MIN_S)

    # -- sessions ------------------------------------------------------------------------

    def attach(self, listener: Listener) -> None:
        """Start reading for ``listener`` (the newest session of its user in this
        process): drain its own pending entries, reclaim and sweep at once."""
        if not self.running:
            raise RuntimeError("the process reader is not running (start ProcessReader.run)")
        listener.attached_at = trio.current_time()
        own_liveness().holding(listener.user_id)
        self._listeners[listener.user_id] = listener
        self._beating[listener.session_id] = listener
        # the handshake has just written presence and the catalogue
        self._schedule.at(listener, trio.current_time() + self.timings.heartbeat_s)
        self.schedule(listener.user_id, *ALL)

    def detach(self, listener: Listener) -> None:
        """Stop reading and beating for ``listener``."""
        listener.stopped.set()
        self._ended[listener.session_id] = None
        while len(self._ended) > ENDED_REMEMBERED:
            del self._ended[next(iter(self._ended))]
        self._beating.pop(listener.session_id, None)
        if self._listeners.get(listener.user_id) is listener:
            del self._listeners[listener.user_id]
            own_liveness().forget(listener.user_id)
            # pending on this consumer: the next session's drain (or its daemon's
            # takeover elsewhere) serves them; marked delivered for this session, which
            # never forwarded them: queued again
            pushed = self._pushed.pop(listener.user_id, None)
            if pushed and self._nursery is not None:
                items = [Pushed(listener.user_id, entry) for entry in pushed]
                self._nursery.start_soon(self._unmark, items)
            self._dispatched.pop(listener.user_id, None)

    def stop_beating(self, listener: Listener) -> None:
        """The session hands over: its presence is no longer refreshed."""
        self._beating.pop(listener.session_id, None)
        if self._listeners.get(listener.user_id) is listener:
            own_liveness().forget(listener.user_id)

    def schedule(self, user_id: str, *kinds: str) -> None:
        """Mark ``user_id`` due for ``kinds`` of reads (see the module constants)."""
        due = self._due.setdefault(user_id, set())
        due.update(kinds)
        if user_id not in self._busy and user_id not in self._queue:
            self._queue.append(user_id)
            self._idle.unpark()

    def served(self, user_id: str, *, answered: bool, entry_id: str | None = None) -> None:
        """A serving task of ``user_id`` ended: read more if the session was full, and
        drain again if it ended without an answer (the entry is pending and ours).
        An answered ``entry_id`` (acknowledged, or left to a newer delivery elsewhere) is
        no daemon's any more: it is dropped from the record of handed entries."""
        if answered and entry_id is not None:
            handed = self._handed_to.get(user_id)
            if handed:
                handed.pop(entry_id, None)
        listener = self._listeners.get(user_id)
        kinds = [] if answered else [DRAIN]
        if listener is not None and listener.wants_more:
            listener.wants_more = False
            kinds.append(NEW)
        if kinds:
            self.schedule(user_id, *kinds)

    # -- the loops -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the wake-up, heartbeat and worker loops until cancelled.

        Cancellation: stops reading; entries being served are not affected (their tasks
        belong to the sessions).
        """
        self._live_at = trio.current_time()
        self._history = self.substrate.history_changes()
        with trio.move_on_after(PROCESS_LIVENESS_REFRESH_S):
            try:  # best effort before the first session: presence must name a live process
                await self.substrate.set_liveness(
                    self.holder_id,
                    PROCESS_LIVENESS_TTL_S,
                    consumer=self.consumer,
                    max_pending=self.max_pending,
                )
            except SubstrateMisconfigured:
                raise  # no retry helps: the served hub refuses to start (``_app``)
            except SubstrateUnavailable:
                pass
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._liveness_loop)
            nursery.start_soon(self._cut_off_loop)
            nursery.start_soon(self._wake_loop)
            nursery.start_soon(self._beat_loop)
            if self.timers is not None:
                await nursery.start(self.timers.run)
            if self.running_jobs is not None:
                nursery.start_soon(self.running_jobs.run)
            if self.revocations is not None:
                nursery.start_soon(self.revocations.run)
            for _ in range(WORKERS):
                nursery.start_soon(self._worker)
            self.running = True
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self.running = False
                self._nursery = None
                with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
                    try:  # stopping: this process's presences stop counting at once
                        await self.substrate.clear_liveness(self.holder_id)
                    except SubstrateUnavailable:
                        pass

    async def _liveness_loop(self) -> None:
        """Keep ``bridge:proc:{holder_id}`` alive (issue 16.2: presence follows the
        process): a killed process's presences stop counting within
        ``PROCESS_LIVENESS_TTL_S``. A refresh that finds the key gone means Redis lost
        its data (restarted empty, failed over) or this process stalled past the TTL:
        presence may be gone too, so every session is beaten at once."""
        while True:
            sent_at = trio.current_time()
            own_liveness().sending()
            try:
                kept = await self.substrate.set_liveness(
                    self.holder_id,
                    PROCESS_LIVENESS_TTL_S,
                    consumer=self.consumer,
                    max_pending=self.max_pending,
                )
            except SubstrateUnavailable as exc:
                # DEBUG: it fails four times a second of an outage, and the other loops warn
                log.debug("liveness refresh failed: %s", exc)
                await trio.sleep(PROCESS_LIVENESS_RETRY_S)  # rewrite it as Redis returns
                continue
            except Exception:  # not an outage (a bug, an unmapped refusal): keep the process
                # at most a second apart: past its 3 s TTL every desktop here reads offline
                await self._unexpected("liveness refresh", max_s=PROCESS_LIVENESS_REFRESH_S)
                continue
            self._expected("liveness refresh")
            own_liveness().answered(kept=kept)
            self._live_at = trio.current_time()
            # Refreshes that keep finding the key lapsed count as none (``_cut_off_loop``):
            # on a slow path (replies seconds late, every command still working) the
            # refreshes, a second after each reply, landed further apart than the TTL,
            # and the key lapsed between every two of them, so callers read the
            # desktops offline most of the time, for as long as it lasted.
            if kept:
                self._lapsing_since = None
            elif self._lapsing_since is None:
                self._lapsing_since = sent_at  # it had lapsed before this one was sent
            if self._cut_off and kept:
                self._cut_off = False
                log.warning("this process reaches Redis again; it takes sessions again")
            recovered, self._check_presence = self._check_presence, False
            history, self._history = self._history, self.substrate.history_changes()
            if history != self._history and self._beating:
                # Redis failed over (or restarted empty) and this process may have seen
                # nothing else: its connections were killed (Sentinel's CLIENT KILL) and
                # its commands sent again, successfully, through an endpoint that follows
                # the primary. The new primary may lack the last writes, the newest
                # handshakes' presence among them: other replicas read those desktops
                # offline until their next beat (a heartbeat: 30 s). Beat every one now.
                own_liveness().store_changed()  # until they land: not "offline" here
                log.warning(
                    "Redis failed over or restarted: rewriting the presence of %d "
                    "sessions now (the writes it acknowledged last may be lost)",
                    len(self._beating),
                )
                self.beat_all()
            elif (not kept or recovered) and self._beating:
                await self._lapsed("liveness key had lapsed" if not kept else "outage ended")
            await trio.sleep(PROCESS_LIVENESS_REFRESH_S)

    async def _cut_off_loop(self) -> None:
        """End every session (1013) once this process has gone ``cut_off_s`` without
        refreshing its liveness key in time (a refresh that finds it lapsed does not
        count): it is cut off from Redis (a partition, a dead NAT entry: no reset, so
        every command only times out), or Redis answers it so late that the key lapses
        between its refreshes. Its liveness key lapsed
        ``PROCESS_LIVENESS_TTL_S`` after the last refresh, so the other replicas tell
        callers ``offline`` for its desktops; its sessions can neither receive jobs nor
        publish answers, and kept their sockets for as long as the partition lasted. A
        sidecar told 1013 after a healthy session reconnects within its first backoff
        window (0.5 s), to a replica whose readiness (``/healthz``) still passes; its
        running jobs stay pending on this consumer and its next session, on any process,
        takes them over at once (issue 12.4: the daemon's ledger answers them).
        Checked every ``PROCESS_LIVENESS_REFRESH_S``, apart from the refresh itself,
        which is stuck in a command timing out while the partition lasts."""
        while True:
            await trio.sleep(PROCESS_LIVENESS_REFRESH_S)
            now = trio.current_time()
            since = self._live_at if self._lapsing_since is None else self._lapsing_since
            silent_s = now - since
            if silent_s < self.cut_off_s:
                continue
            # A session attached since the silence began had its handshake write presence
            # then (a review found sessions that reconnected right after a heal cut once
            # more while the stuck refresh timed out): its silence counts from its attach.
            cut = [
                x
                for x in self._listeners.values()
                if x.on_cut_off is not None and now - max(since, x.attached_at) >= self.cut_off_s
            ]
            if not cut:
                continue
            if not self._cut_off:
                self._cut_off = True
                log.warning(
                    "this process has not kept its liveness key alive for %.1f s (%s; "
                    "other replicas read its desktops offline): ending its %d sessions with "
                    "1013 so that they reconnect to a replica that can serve them",
                    silent_s,
                    "Redis unreachable" if self._lapsing_since is None
                    else "Redis answers so late that the key lapses between refreshes",
                    len(cut),
                )  # fmt: skip
            for listener in cut:
                self.detach(listener)  # read and beat nothing more for it here
                assert listener.on_cut_off is not None
                listener.on_cut_off()

    async def _lapsed(self, why: str) -> None:
        """The liveness key had lapsed, or an outage ended (``why``): if Redis lost its
        data, presence went with it (beat every session now); if this process only
        stalled or Redis only paused, one presence still names its session and the beats
        due will do (a full beat of 10,000 sessions would only stall a busy process
        further). The sample is the newest session's: a store that lost only its last
        writes (a replica promoted without them) lost the newest handshakes' presence
        and kept the older ones (the oldest, sampled before, read "intact", and the
        newest desktops read offline until their next heartbeat, 30 s)."""
        sample = next(reversed(self._beating.values()))
        try:
            intact = await self.substrate.get_presence(sample.user_id) == sample.session_id
        except SubstrateUnavailable:
            intact = False
        if intact:
            log.info(
                "this process's %s; presence intact (Redis was unreachable, or this process "
                "stalled, past the key's %g s TTL)",
                why, PROCESS_LIVENESS_TTL_S,
            )  # fmt: skip
            return
        log.warning(
            "this process's %s and a presence is gone (Redis lost its data?): rewriting "
            "the presence of %d sessions now",
            why,
            len(self._beating),
        )
        self.beat_all()

    def beat_all(self) -> None:
        """Beat every session now, catalogues included (the store may have lost them)."""
        self._schedule.all_now()
        self._beat_now.set()

    async def _wake_loop(self) -> None:
        block_s = min(self.timings.heartbeat_s, WAKE_BLOCK_S)
        failing = False  # in a streak of failed waits
        while True:
            sent_at = trio.current_time()
            try:
                users = await self.substrate.wait_wakes(
                    self.holder_id, timeout_s=block_s, count=WAKE_BATCH
                )
            except SubstrateUnavailable as exc:
                if not failing:
                    failing = True
                    self._wait_lost()
                await self._failed("wake-up wait", exc)
                continue
            except Exception:  # not an outage (a bug, an unmapped refusal): keep the process
                if not failing:
                    failing = True
                    self._wait_lost()
                await self._unexpected("wake-up wait")
                continue
            # Pushed entries carry the mark (and the server time) of their submit, and
            # their deadline counts the time this process holds them from the pop. What
            # the first wait after failed ones pops may have sat in the wake list all
            # the while, and a reply late in transit (a slow path) arrives that much
            # after the pop: a 1 s job whose caller had been told "timeout" reached the
            # desktop with a fresh budget and ran. Those are marked again on the
            # server's clock when served (no time left: the desktop answers expired).
            stale = failing or trio.current_time() - sent_at > block_s + WAKE_LATE_S
            if failing:
                # the streak ends: drain again, for what a later failed wait of the streak
                # popped (the first drain ran at its start, before those were popped)
                self._wait_lost()
            failing = False
            self._expected("wake-up wait")
            self._recovered()
            woken: list[str] = []
            for item in users:
                if isinstance(item, Revoked):
                    if self.revocations is not None:
                        self.revocations.notice(item)
                elif isinstance(item, CancelAsked):
                    self._cancel_asked(item)
                elif isinstance(item, Superseded) and item.check:
                    await self._clear_ended(item.user_id, item.session_id)
                elif isinstance(item, Superseded):
                    self._superseded(item)
                elif not isinstance(item, Pushed):
                    woken.append(item)
                elif item.user_id not in self._listeners:
                    # the session is gone (or not attached yet): the entry is pending on
                    # this consumer, and the next session's drain or its daemon's
                    # takeover serves it; no desktop got it, so it is queued again
                    await self._unmark([item])
                    woken.append(item.user_id)
                elif stale and item.entry.marked is not None:
                    self._remark(item)
                elif not await self._dispatch_now(item):  # the session is attached here
                    self._pushed.setdefault(item.user_id, []).append(item.entry)
                    self.schedule(item.user_id, PUSHED)
            for user_id in dict.fromkeys(woken):
                if user_id in self._listeners:
                    self.schedule(user_id, NEW)
                elif self._ended:  # presence may name a session that ended here
                    await self._clear_ended(user_id)

    async def _unmark(self, items: list[Pushed]) -> None:
        """Pushed entries no session here forwarded go back to ``queued``
        (``unmark_unheld``)."""
        for item in items:
            await unmark_unheld(self.substrate, item, ttl_s=self.timings.result_ttl_s)

    def _remark(self, item: Pushed) -> None:
        """A pushed entry that may have waited long before it arrived (``_wake_loop``):
        drop its submit-time mark, so that serving it marks it delivered again
        (``mark_delivered``: its deadline judged on the server's clock, a new claim
        epoch), and queue it in order behind what waits (a worker serves it). Only for a
        user with a session here (the wake loop undoes the mark of the others)."""
        entry = attrs.evolve(item.entry, marked=None, received_at=None)
        self._pushed.setdefault(item.user_id, []).append(entry)
        self.schedule(item.user_id, PUSHED)

    def _wait_lost(self) -> None:
        """A wake-up wait failed (timed out, its connection lost): Redis may have popped
        wake-ups for it whose reply never arrived (a connection black-holed while its
        BLMPOP was in place: Redis answers the BLMPOP into the hole). A lost user id
        would wait for the next heartbeat's backlog (30 s), a lost pushed entry, already
        pending on this consumer and marked delivered, for ``RECLAIM_IDLE_S`` (180 s),
        its caller told "delivered, may be running". So every attached user is drained
        (its own pending entries, then new ones) when a streak of failures starts and
        again when it ends (a review found that a wait later in the streak may pop
        entries too, after the first drain: they waited for the reclaim idle); a user
        whose read fails stays due and is read again with the workers' back-off. The
        drain marks each entry again (the deadline judged on the server's clock)."""
        for user_id in list(self._listeners):
            self.schedule(user_id, DRAIN, NEW)

    async def _clear_ended(self, user_id: str, session_id: str | None = None) -> None:
        """Presence of ``user_id`` names ``session_id`` of this process (a ``check``
        notice), or may (a wake-up for a user this process holds no session of: presence
        named a session here, read first): cleared if that session ended here
        (``_presence_doubt``). A store that lost its last writes can name an ended
        session again; callers were then told "delivered, may be running" about jobs
        pushed here that no desktop received, until that presence expired (90 s)."""
        try:
            if session_id is None:
                session_id = await self.substrate.get_presence(user_id)
            if session_id is not None:
                await clear_ended(self.substrate, user_id, session_id, self._ended_here)
        except SubstrateUnavailable as exc:  # looked at again at the next such wake-up
            log.debug("clearing a presence of an ended session failed: %s", exc)

    def _cancel_asked(self, notice: CancelAsked) -> None:
        """A cancel of one of the user's jobs (``_cancel_notice``): handed to the user's
        session here, whatever its room (its read of the control entry waits for room).
        No session here: the entry's next reader refuses it by the cancel flag."""
        listener = self._listeners.get(notice.user_id)
        if listener is not None and listener.on_cancel is not None:
            listener.on_cancel(notice.job_id)

    def _superseded(self, notice: Superseded) -> None:
        """A newer session of the user took presence from one of ours (on another
        process: its handshake pushed the notice): hand it over now, as its next
        heartbeat would have on finding presence taken (that stays the fallback when the
        notice is lost)."""
        listener = self._listeners.get(notice.user_id)
        if listener is None or listener.session_id != notice.session_id:
            return  # gone already, or a newer session of ours holds the user here
        if self._beating.get(listener.session_id) is not listener:
            return  # handing over already
        _metrics.presence_failed("not_holder")
        self.stop_beating(listener)
        listener.on_superseded()

    async def _dispatch_now(self, pushed: Pushed) -> bool:
        """Hand a pushed entry to its session from the wake-up loop itself, when nothing
        of the user's waits for a worker and the session has room (the usual case: the
        caller pushed only because it had): one task switch fewer than through a worker.
        False: left to the workers (in order behind what waits), or the session is gone.
        Never raises for the entry's fault (the worker's rule: one user's fault must not
        stop reading for every user)."""
        user_id = pushed.user_id
        listener = self._listeners.get(user_id)
        if (
            listener is None
            or listener.stopped.is_set()
            or user_id in self._busy
            or user_id in self._due
            or self._pushed.get(user_id)
            or listener.capacity() <= 0
        ):
            return False
        inflight = self.inflight.setdefault(user_id, set())
        try:
            await self._dispatch(listener, inflight, [pushed.entry], pushed=True)
        except Exception:
            log.exception("dispatching a pushed entry for %s failed; it stays pending", user_id)
        return True

    async def _beat_loop(self) -> None:
        t = self.timings
        while True:
            with trio.move_on_at(self._schedule.next_at()):
                await self._beat_now.wait()
            self._beat_now = trio.Event()
            full, listeners = self._schedule.take(self._beating)
            if not listeners:
                continue
            beats = [x.beat(full=full) for x in listeners]
            reads = [x.reads for x in listeners]
            for x in listeners:  # held or failing past a second: in doubt (``_own_liveness``)
                own_liveness().beat_sending(x.user_id)
            try:
                replies = await self.substrate.heartbeat(
                    beats,
                    ttl_s=t.presence_ttl_s,
                    consumer=self.consumer,
                    reclaim_idle_ms=int(t.reclaim_idle_s * 1000),
                    prune=True,  # costs a command only where the group has another consumer
                    record_ttl_s=DAEMON_RECORD_TTL_S,  # one PEXPIRE per deep beat
                )
            except SubstrateUnavailable as exc:
                # Retry sooner than a full interval, every session and its catalogue:
                # after Redis comes back (maybe empty) the desktops must read online
                # again quickly, not a heartbeat later.
                for _ in listeners:
                    _metrics.presence_failed("unavailable")
                # DEBUG: it retries every second; the outage is told once (``_outage``)
                outage_log().failed("heartbeat", exc)
                log.debug("heartbeat of %d sessions failed: %s", len(beats), exc)
                self._failures += 1
                self._schedule.all_now(
                    retry_at=trio.current_time() + min(HEARTBEAT_RETRY_S, t.heartbeat_s)
                )
                continue
            except Exception:  # not an outage (a bug, a refusal): it must not stop every beat
                self._beat_failed(listeners, full=full)
                continue
            if not any(r.unavailable for r in replies):  # else a part is still out
                self._recovered(beaten=full)
            self._answered(listeners, beats, reads, replies)

    def _beat_failed(self, listeners: list[Listener], *, full: bool) -> None:
        """A heartbeat raised something other than an outage: the same sessions are
        beaten again after 1 s, doubling up to a heartbeat while theirs keep failing
        (each session counts its own failures in a row, so other batches' successes do
        not reset it; a full beat stays full: its catalogues are still to be written).
        A session's first failure is logged with its traceback, the rest at DEBUG: a
        fault that persists must cost neither a log line nor a full beat of every
        session each second."""
        t = self.timings
        streak = max((x.beat_errors for x in listeners), default=0)
        delay_s = min(HEARTBEAT_RETRY_S * 2 ** min(streak, 20), t.heartbeat_s)
        if streak == 0:
            log.exception(
                "heartbeat of %d sessions failed; retried after %g s, backing off to %g s "
                "while it fails (logged again only once it has succeeded)",
                len(listeners), delay_s, t.heartbeat_s,
            )  # fmt: skip
        else:
            log.debug("heartbeat of %d sessions failed again", len(listeners), exc_info=True)
        for listener in listeners:
            listener.beat_errors += 1
            _metrics.presence_failed("error")
        retry_at = trio.current_time() + delay_s
        if full:
            self._schedule.all_now(retry_at=retry_at)
            return
        for listener in listeners:
            if self._beating.get(listener.session_id) is listener:
                self._schedule.at(listener, retry_at)

    def _beats_missed(self, missed: list[tuple[Listener, str]]) -> None:
        """Beats that met an outage of their part of the store (a Cluster node) while the
        others of the write ran: those sessions are beaten again after 1 s, doubling to a
        heartbeat while theirs keep failing; the outage is told once (``_outage``)."""
        t = self.timings
        now = trio.current_time()
        outage_log().failed("heartbeat", SubstrateUnavailable(missed[0][1]))
        log.debug("heartbeat of %d sessions met an outage: %s", len(missed), missed[0][1])
        for listener, _ in missed:
            _metrics.presence_failed("unavailable")
            streak = listener.beat_misses
            listener.beat_misses += 1
            if self._beating.get(listener.session_id) is listener:
                delay_s = min(HEARTBEAT_RETRY_S * 2 ** min(streak, 20), t.heartbeat_s)
                self._schedule.at(listener, now + delay_s)

    def _answered(
        self,
        listeners: list[Listener],
        beats: list[Beat],
        reads: list[int],
        replies: list[BeatReply],
    ) -> None:
        refreshed = 0
        refused: list[tuple[Listener, str]] = []
        missed: list[tuple[Listener, str]] = []
        for listener, beat, n, reply in zip(listeners, beats, reads, replies, strict=True):
            if reply.unavailable is not None:  # its Cluster node is out: not beaten
                missed.append((listener, reply.unavailable))
                continue
            listener.beat_errors = listener.beat_misses = 0
            if reply.error is not None:
                # this user's own keys (a key of the wrong type, an index field that is
                # no entry ID): the session stays and is beaten again next interval; the
                # other users' beats went on
                _metrics.presence_failed("error")
                refused.append((listener, reply.error))
                if self._beating.get(listener.session_id) is listener:
                    self._schedule.again(listener)
                continue
            if not reply.ours:
                _metrics.presence_failed("not_holder")
                if listener.doubt < DOUBT_ASKS:
                    self._doubt(listener)
                    continue
                self.stop_beating(listener)
                listener.on_superseded()
                continue
            listener.doubt = 0  # a check may still run: its verdict is looked at afresh
            refreshed += 1
            listener.answered(beat, n, taken=reply.taken)
            if self._beating.get(listener.session_id) is listener:
                # only a session still beating here: one that ended while its beat was
                # in flight was forgotten (``OwnLiveness.forget``); noted again, its user
                # stayed in the dict for the process's life (and read in doubt)
                own_liveness().beat_kept(listener.user_id, taken=bool(reply.taken))
                if listener.catalogue_due:  # presence was lost: the catalogue may be too
                    self._schedule.at(listener, trio.current_time())
                    self._beat_now.set()
                else:
                    self._schedule.again(listener)
            kinds = [NEW] * reply.backlog + [RECLAIM] * reply.reclaim_due
            kinds += [TRIMMED] * reply.trimmed_due + [RECORD] * reply.taken
            if kinds:
                self.schedule(listener.user_id, *kinds)
        if refreshed:
            _metrics.presence_written("refresh", refreshed)  # once per pipelined beat
        if missed:
            self._beats_missed(missed)
        if refused:  # one line per write, however many users: bad data must not flood
            first, why = refused[0]
            log.warning(
                "heartbeat refused by the store for %d user(s) (their own keys), e.g. %s "
                "(session %s): %s",
                len(refused), first.user_id, first.session_id, why[:200],
                extra=fields(user_id=first.user_id, session_id=first.session_id),
            )  # fmt: skip

    def _doubt(self, listener: Listener) -> None:
        """A beat found presence held by another session: check that session before
        handing over (``CHECK``, a worker runs ``_presence_doubt.check_holder``) and beat
        again a second on; the session hands over once the holder was found real, or
        still possibly real after ``DOUBT_ASKS`` checks. The store may have lost its last
        writes and named an older session."""
        if not listener.checking:
            listener.checking = True
            self.schedule(listener.user_id, CHECK)
        if self._beating.get(listener.session_id) is listener:
            self._schedule.at(listener, trio.current_time() + HEARTBEAT_RETRY_S)

    def _held(self, session_id: str) -> bool:
        """This process holds session ``session_id`` (attached or beating)."""
        return session_id in self._beating or any(
            x.session_id == session_id for x in self._listeners.values()
        )

    def _ended_here(self, session_id: str) -> bool:
        """Session ``session_id`` ended in this process (and is not held again)."""
        return session_id in self._ended and not self._held(session_id)

    async def _check(self, listener: Listener) -> None:
        """The ``CHECK`` step of one user (see ``_doubt``)."""
        verdict = await check_holder(
            self.substrate, user_id=listener.user_id, session_id=listener.session_id,
            holder_id=self.holder_id, held_here=self._held, ended_here=self._ended_here,
            ttl_s=self.timings.presence_ttl_s,
        )  # fmt: skip
        listener.checking = False
        if verdict is Verdict.ASKED:
            listener.doubt += 1
        else:
            listener.doubt = DOUBT_ASKS if verdict is Verdict.REAL else 0
        if verdict is not Verdict.ASKED and self._beating.get(listener.session_id) is listener:
            self._schedule.at(listener, trio.current_time())  # beat again now
            self._beat_now.set()

    async def _worker(self) -> None:
        while True:
            while not self._queue:
                await self._idle.park()
            user_id = self._queue.popleft()
            kinds = self._due.pop(user_id, set())
            listener = self._listeners.get(user_id)
            if listener is None or listener.stopped.is_set() or not kinds:
                # pending on this consumer (see detach); never forwarded: queued again
                pushed = self._pushed.pop(user_id, None)
                if pushed:
                    await self._unmark([Pushed(user_id, entry) for entry in pushed])
                continue
            self._busy.add(user_id)
            try:
                await self._pump(listener, kinds)
            except SubstrateUnavailable as exc:
                # once busy is cleared below. A failed read of new entries may have taken
                # some whose reply was lost (group reads are not sent again: _redis_resend):
                # pending here, no later read of new entries returns them, so drain first
                again = kinds | {DRAIN} if NEW in kinds else kinds
                self.schedule(user_id, *again)
                await self._failed(f"read for {user_id}", exc)
            except Exception:  # one user's fault must not stop reading for every user
                log.exception(
                    "reading for %s failed; read again when its heartbeat finds a backlog", user_id
                )
            finally:
                self._busy.discard(user_id)
                if user_id in self._due and user_id not in self._queue:
                    self._queue.append(user_id)
                    self._idle.unpark()
            # not kept while parked: an ended session (and its socket) must be freed at
            # once, not when this worker next reads (docs/security.md, flooding)
            listener = None

    async def _pump(self, listener: Listener, kinds: set[str]) -> None:
        user_id, consumer = listener.user_id, self.consumer
        inflight = self.inflight.setdefault(user_id, set())
        if CHECK in kinds:
            try:
                await self._check(listener)
            finally:
                listener.checking = False  # a failed check is scheduled again by a beat
        if kinds & {TAKEOVER, RECORD}:
            # First, before this session is handed anything: record its daemon, and take
            # over at once what went to that daemon on sockets that are gone (issue 12.4).
            # RECORD: presence had been lost and a beat wrote it back; the record may have
            # gone with it, and without it this daemon's deliveries here could not be
            # taken over at once if this process died (they waited the reclaim idle). Not
            # when this process handed entries to another daemon of the user: those may
            # still be pending here, and recording the consumer as this daemon's would let
            # it take them over at once elsewhere (the drain withholds them: _same_daemon).
            taken = await self.substrate.take_over(
                user_id, consumer, daemon_id=listener.daemon_id, session_id=listener.session_id,
                count=TAKEOVER_BATCH, record_ttl_s=DAEMON_RECORD_TTL_S,
                again=TAKEOVER not in kinds and not self._handed_elsewhere(listener),
            )  # fmt: skip
            if taken.entries or taken.deleted_ids:
                log.info(
                    "session %s of %s: took over %d entries from its daemon's gone sockets",
                    listener.session_id, user_id, len(taken.entries) + len(taken.deleted_ids),
                )  # fmt: skip
                _metrics.entries_reclaimed(len(taken.entries))
            await self._dispatch(listener, inflight, list(taken.entries))
            if taken.deleted_ids:
                await listener.on_deleted(list(taken.deleted_ids))
            if taken.quiet:
                # Nothing pending, undelivered or indexed, checked in the same atomic
                # step: an idle desktop's attach is this one round trip (issue 10; at a
                # reconnect storm the full pass per user queued jobs behind thousands of
                # empty reads). A job enqueued after it wakes this user as usual.
                kinds = kinds - {DRAIN, RECLAIM, TRIMMED, NEW}
        if PUSHED in kinds:
            # read and marked delivered for this process by the callers' steps, in order
            pushed = self._pushed.pop(user_id, [])
            await self._dispatch(listener, inflight, pushed, pushed=True)
        if DRAIN in kinds:
            # Own pending entries first (a restarted session's, or one whose serving task
            # ended without an answer); stop as soon as nothing unserved is pending.
            entries = await self.substrate.read_pending(user_id, consumer, count=READ_BATCH)
            await self._dispatch(listener, inflight, self._same_daemon(listener, entries))
        if RECLAIM in kinds:
            claimed, deleted = await self._reclaim(user_id)
            _metrics.entries_reclaimed(len(claimed))
            await self._dispatch(listener, inflight, claimed)
            await listener.on_deleted(deleted)
        elif TRIMMED in kinds:
            await listener.on_deleted([])
        if kinds & {NEW, DRAIN}:
            while not listener.stopped.is_set():
                room = min(READ_BATCH, listener.capacity())
                if room <= 0:
                    listener.wants_more = True  # read again when a serving task ends
                    break
                if listener.delivered_state is None:
                    entries = await self.substrate.read_new(
                        user_id, consumer, count=room, block_ms=None
                    )
                else:  # the read and the delivery mark in one round trip (issue 10.3)
                    # nothing while presence names a newer session (this one may be
                    # half-open: its entries would wait in a dead socket)
                    entries = await self.substrate.read_new_delivered(
                        user_id, consumer, count=room, state=listener.delivered_state(),
                        ttl_s=forwarded_keep_s(self.timings.result_ttl_s),
                        session_id=listener.session_id,
                    )  # fmt: skip
                await self._dispatch(listener, inflight, entries)
                if len(entries) < room:
                    break

    async def _reclaim(self, user_id: str) -> tuple[list[Entry], list[str]]:
        entries: list[Entry] = []
        deleted: list[str] = []
        start = "0-0"
        min_idle_ms = int(self.timings.reclaim_idle_s * 1000)
        for _ in range(RECLAIM_MAX_BATCHES):
            claimed = await self.substrate.autoclaim(
                user_id, self.consumer, min_idle_ms=min_idle_ms, start=start, count=READ_BATCH
            )
            entries.extend(claimed.entries)
            deleted.extend(claimed.deleted_ids)
            start = claimed.next_start
            if start in ("0-0", "0"):
                break
        return entries, deleted

    def _same_daemon(self, listener: Listener, entries: list[Entry]) -> list[Entry]:
        """``entries`` (pending on this consumer) less those this process handed to
        another daemon of the user: that desktop may still be running them (its socket
        went, not necessarily its process), so they wait RECLAIM_IDLE_S like a gone
        daemon's entries on another process (the reclaim then hands them over). Either
        daemon unknown (an older sidecar): handed over as before."""
        handed = self._handed_to.get(listener.user_id)
        if not handed or listener.daemon_id is None:
            return entries
        return [e for e in entries if handed.get(e.entry_id) in (None, listener.daemon_id)]

    def _handed_elsewhere(self, listener: Listener) -> bool:
        """This process handed entries of ``listener``'s user to another daemon (or to
        one it could not tell) that may still be pending on its consumer."""
        handed = self._handed_to.get(listener.user_id) or {}
        return any(d != listener.daemon_id for d in handed.values())

    def release(self, listener: Listener) -> None:
        """``listener``'s session ends on purpose after its grace (superseded by a newer
        session in this process): what it was handed may go to the next session's drain
        at once, whichever daemon that is (the grace was the old desktop's time)."""
        handed = self._handed_to.get(listener.user_id)
        if handed:
            for entry_id in [k for k, d in handed.items() if d == listener.daemon_id]:
                del handed[entry_id]

    def _note_handed(self, listener: Listener, entry_id: str) -> None:
        handed = self._handed_to.pop(listener.user_id, None) or {}
        self._handed_to[listener.user_id] = handed  # most recent user last
        while len(self._handed_to) > HANDED_USERS_REMEMBERED:
            del self._handed_to[next(iter(self._handed_to))]
        handed.pop(entry_id, None)
        handed[entry_id] = listener.daemon_id
        while len(handed) > HANDED_PER_USER:
            del handed[next(iter(handed))]

    async def _dispatch(
        self, listener: Listener, inflight: set[str], entries: list[Entry], *, pushed: bool = False
    ) -> None:
        """Hand ``entries`` to the session, skipping those in flight. A pushed entry is
        dispatched only if no read here dispatched it first (a drain after an outage can
        find it pending before its wake-up is popped: its copy, marked with an older
        claim epoch, must not go out again); a read skips entries whose pushed copy is
        waiting to be dispatched. Pushed entries met once the session reads nothing more
        (stopped: draining, superseded) were never forwarded: queued again
        (``unmark_unheld``), as for a session that ended."""
        user_id = listener.user_id
        queued = self._pushed.get(user_id)
        waiting = {e.entry_id for e in queued} if queued else set()
        seen = self._dispatched.setdefault(user_id, {})
        unsent: list[Pushed] = []  # pushed entries the session stopped before taking
        for entry in entries:
            if listener.stopped.is_set() and pushed and entry.entry_id not in inflight:
                unsent.append(Pushed(user_id, entry))
            if entry.entry_id in inflight or listener.stopped.is_set():
                continue
            if (pushed and entry.entry_id in seen) or (not pushed and entry.entry_id in waiting):
                continue
            seen[entry.entry_id] = None
            while len(seen) > DISPATCHED_REMEMBERED:
                del seen[next(iter(seen))]
            inflight.add(entry.entry_id)
            self._note_handed(listener, entry.entry_id)
            listener.reads += 1  # its next beat looks at the entry index
            try:
                await listener.dispatch(entry)
            except SessionGone:
                # ended before it took the entry (its detach not yet run): stopped now,
                # nothing started; the rest of the batch is not offered to it either
                inflight.discard(entry.entry_id)
                seen.pop(entry.entry_id, None)
                if pushed:
                    unsent.append(Pushed(user_id, entry))
            except BaseException:
                # Never started (cancelled while waiting for an in-flight slot): a stale
                # in-flight mark would hide the entry from every drain and reclaim here.
                inflight.discard(entry.entry_id)
                raise
        if unsent:  # marked delivered for a session that reads nothing more: queued again
            await self._unmark(unsent)

    async def _unexpected(self, what: str, *, max_s: float = UNEXPECTED_BACKOFF_MAX_S) -> None:
        """A process-wide loop's step raised something other than an outage (called in its
        ``except``): it must not end the process (it did: a Cluster error coredis raised
        unmapped stopped every hub of a cluster whose primary was down for seconds). The
        traceback is logged once per streak; the loop retries after 1 s, doubling to
        ``max_s`` (``UNEXPECTED_BACKOFF_MAX_S``)."""
        streak = self._unexpected_streaks.get(what, 0)
        self._unexpected_streaks[what] = streak + 1
        if streak == 0:
            log.exception("%s failed unexpectedly; retrying (logged once until it works)", what)
        delay_s = min(max_s, 2.0 ** min(streak, 10))
        log.debug("%s failed %d times in a row; retrying in %g s", what, streak + 1, delay_s)
        await trio.sleep(delay_s)

    def _expected(self, what: str) -> None:
        """``what``'s step worked: a later unexpected failure is logged again."""
        if self._unexpected_streaks and self._unexpected_streaks.pop(what, 0):
            log.info("%s works again", what)

    async def _failed(self, what: str, exc: SubstrateUnavailable) -> None:
        delay = READ_ERROR_BACKOFF_S[min(self._failures, len(READ_ERROR_BACKOFF_S) - 1)]
        self._failures += 1
        # DEBUG: the outage is told once, with a summary a minute (``_outage``)
        outage_log().failed(what, exc, kind=what.split(" for ", 1)[0])
        log.debug("%s: %s; retrying in %.2f s (failure %d)", what, exc, delay, self._failures)
        await trio.sleep(delay)

    def _recovered(self, *, beaten: bool = False) -> None:
        """A substrate call succeeded. ``beaten``: it was a beat of every session."""
        # Nothing to re-read here: a wake-up pushed during the outage is still on the list
        # (or Redis lost everything, entries included), and an entry whose wake-up failed
        # is flagged as backlog by the next heartbeat.
        outage_over()
        if self._failures:
            log.debug("substrate back after %d failures", self._failures)
            self._failures = 0
            own_liveness().store_changed()  # what it was writing may be lost
            if not beaten:
                # Redis may have come back empty: then every presence is rewritten
                # within a second (the liveness loop looks at one), not a heartbeat
                # later. Not blindly: on a saturated process, "back after failures" is
                # the loop catching up, and a beat of every session (10,000 scripts with
                # catalogues) stalled it again, failing the next commands: a cycle.
                self._check_presence = True
