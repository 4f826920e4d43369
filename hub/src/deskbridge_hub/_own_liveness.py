"""Whether this process's own writes to Redis may have lapsed for want of a refresh.

A hub process cut off from Redis for a few seconds (a black-holed connection: no reset,
so its commands are only held), or answered seconds late (``DEBUG SLEEP``, ``CLIENT
PAUSE``, a long script), cannot refresh its liveness key nor its desktops' presence
meanwhile; both may lapse in Redis while the desktops stay connected to it. The calls
it had sent meanwhile are answered as the stall ends, before its liveness loop has
rewritten what lapsed, and found no presence: ``offline`` for a desktop connected to
this very process (a fault-injection test: three of three calls during a 3 s black
hole). The liveness loop (``_reader``) reports each refresh here; a submit or a presence
read (``GET /v1/users/{id}/presence``) that finds no presence while
:meth:`OwnLiveness.in_doubt` looks once more (``_bridge``) instead of answering
``offline`` at once.

The same doubt, per user: on a Redis Cluster one node's slots can refuse or hold writes
(a slot migrating for seconds answers ``TRYAGAIN`` to the heartbeat's script, a primary
down until its replica is promoted) while the process's own liveness key, in another
slot, is refreshed fine. The beats of those users are held (``TRYAGAIN`` is retried for
about 4.5 s) or meet the outage (``_reader``'s ``_beats_missed``); their presence may
lapse though their desktops stay connected here, and was read ``offline`` (a
fault-injection test: a slot half migrated for 4 s, presence TTL 3 s). The beat loop
reports each user's beat as it sends it and once it is kept; ``in_doubt(user_id)``
covers them as it covers the process's own refresh. A user forgotten when its session
here ends (its desktop may then really be gone).

The same doubt, per Cluster slot, for a process that does not hold the user's session:
another worker or pod reads the presence (a call, ``GET .../presence``) while the
holder's beats are held; the holder's doubt is its own, and this process answered from
presence alone, ``offline``. Its own evidence is what the slot answered it: a
redirection to the node importing it (ASK: the slot is migrating, so a script over the
user's keys, the beat, meets ``TRYAGAIN``), ``TRYAGAIN`` / ``CLUSTERDOWN``, MOVED (the
slot just changed hands: a migration or a failover ended), or its node unreachable
(``_redis_cluster`` reports each with :meth:`OwnLiveness.slot_troubled`). For
:data:`DOUBT_AFTER_S` after, an absent presence of a user in that slot is in doubt too.
Nothing on a single Redis; one dict look-up per doubt check while some slot is recorded.

The same doubt after the store changed under this process: a connection of it found
dead (Redis restarted, Sentinel's ``CLIENT KILL``) or on a replica (``READONLY``, a
demotion), the health probe finding another replication history (a failover), an
outage ended. A failover may have lost the writes acknowledged last, the newest
handshakes' presence among them, and the process rewrites every presence it holds
(``_reader``); until that lands it answered its own callers ``offline`` for a desktop
connected to it (a fault-injection test: four reads of ``GET .../presence`` over 0.8 s,
and a call made at once). :meth:`OwnLiveness.store_changed` puts the absent presence of
every user with a session here (:meth:`OwnLiveness.holding`) in doubt for
:data:`DOUBT_AFTER_S`; another desktop's is another process's to doubt.

State is per event-loop run (``anyio.lowlevel.RunVar``), as ``_outage``'s; time is the
loop's clock (``anyio.current_time``).
"""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel
import attrs

from ._errors import SubstrateUnavailable
from ._keys import presence_key
from ._redis_slots import key_slot
from ._retry import LIVENESS_RECHECK_S, PROCESS_LIVENESS_REFRESH_S, PROCESS_LIVENESS_TTL_S

#: A refresh unanswered for longer than this, seconds, means this process's writes are
#: held or failing (it is answered within milliseconds when Redis is healthy).
STALLED_AFTER_S = PROCESS_LIVENESS_REFRESH_S
#: After a refresh that found the key lapsed (or the first answer after a stall), this
#: long, seconds, an absent presence may still be one this process is rewriting: a
#: lapsed key's TTL and the recheck's wait.
DOUBT_AFTER_S = PROCESS_LIVENESS_TTL_S + LIVENESS_RECHECK_S


@attrs.define(eq=False)
class OwnLiveness:
    """The liveness refreshes of one event-loop run. Not thread-safe (one loop)."""

    #: since when a refresh is unanswered or failing (None: the last one was answered)
    _unanswered_since: float | None = None
    #: when a refresh last found the key lapsed, or was answered after a stall
    _doubt_at: float = -math.inf
    #: per user with a session here: since when its beat is unanswered or failing
    _missed_since: dict[str, float] = attrs.field(factory=dict)
    #: per user: when a beat rewrote its lapsed presence, or was kept after a stall
    _user_doubt_at: dict[str, float] = attrs.field(factory=dict)
    #: per Cluster slot: when this process's command on it last met a migration,
    #: refusal, move or outage (``slot_troubled``)
    _slot_trouble_at: dict[int, float] = attrs.field(factory=dict)
    #: when ``_slot_trouble_at`` was last walked to drop what no longer counts
    _slots_pruned_at: float = -math.inf
    #: users with a session attached here (``holding``; dropped by ``forget``)
    _held: set[str] = attrs.field(factory=set)
    #: when the store last changed under this process (``store_changed``)
    _changed_at: float = -math.inf

    def sending(self) -> None:
        """A refresh is being sent (the first of a series that fails marks the start)."""
        if self._unanswered_since is None:
            self._unanswered_since = anyio.current_time()

    def answered(self, *, kept: bool) -> None:
        """The refresh was answered; ``kept``: the key was still there."""
        now = anyio.current_time()
        since, self._unanswered_since = self._unanswered_since, None
        if not kept or (since is not None and now - since > STALLED_AFTER_S):
            self._doubt_at = now

    def beat_sending(self, user_id: str) -> None:
        """A beat of ``user_id``'s session here is being sent (the first of a series
        that is held or fails, e.g. meets an outage of its part of the store, marks the
        start)."""
        self._missed_since.setdefault(user_id, anyio.current_time())

    def beat_kept(self, user_id: str, *, taken: bool) -> None:
        """A beat of ``user_id``'s session here refreshed its presence; ``taken``: the
        presence had lapsed (or was lost) and was written again."""
        now = anyio.current_time()
        since = self._missed_since.pop(user_id, None)
        if taken or (since is not None and now - since > STALLED_AFTER_S):
            self._user_doubt_at[user_id] = now
        elif self._user_doubt_at.get(user_id, math.inf) <= now - DOUBT_AFTER_S:
            del self._user_doubt_at[user_id]

    def slot_troubled(self, slot: int) -> None:
        """A command of this process on Cluster ``slot`` was redirected (ASK, MOVED),
        refused (``TRYAGAIN``, ``CLUSTERDOWN``) or met its node unreachable: for
        :data:`DOUBT_AFTER_S` an absent presence in it proves nothing."""
        now = anyio.current_time()
        # bounded (by the 16384 slots, and what no longer counts is dropped), walked at
        # most once per DOUBT_AFTER_S: a node down troubles thousands of slots at once,
        # and a walk on every trouble past 256 was quadratic work through the outage
        if len(self._slot_trouble_at) > 256 and now - self._slots_pruned_at >= DOUBT_AFTER_S:
            self._slots_pruned_at = now
            self._slot_trouble_at = {
                k: at for k, at in self._slot_trouble_at.items() if now - at < DOUBT_AFTER_S
            }
        self._slot_trouble_at[slot] = now

    def holding(self, user_id: str) -> None:
        """A session of ``user_id`` is attached here (until :meth:`forget`)."""
        self._held.add(user_id)

    def store_changed(self) -> None:
        """The store may have lost the writes this process made last: a connection of it
        was found dead or on a replica, the store has another replication history, or
        an outage ended. For :data:`DOUBT_AFTER_S` an absent presence of a user held
        here proves nothing (its rewrite may be on its way)."""
        self._changed_at = anyio.current_time()

    def forget(self, user_id: str) -> None:
        """``user_id`` has no session here any more: an absent presence may be true."""
        self._missed_since.pop(user_id, None)
        self._user_doubt_at.pop(user_id, None)
        self._held.discard(user_id)

    def in_doubt(self, user_id: str | None = None) -> bool:
        """True while this process's writes are held or failing, and for
        :data:`DOUBT_AFTER_S` after they were found lapsed or answered late; with
        ``user_id``, also for :data:`DOUBT_AFTER_S` after a command on the user's
        Cluster slot met trouble (``slot_troubled``), while that user's beats here
        meet an outage of its slot (past :data:`STALLED_AFTER_S`), for
        :data:`DOUBT_AFTER_S` after one rewrote its lapsed presence, and, for a user
        held here, for :data:`DOUBT_AFTER_S` after :meth:`store_changed`."""
        now = anyio.current_time()
        since = self._unanswered_since
        if since is not None and now - since > STALLED_AFTER_S:
            return True
        if now - self._doubt_at < DOUBT_AFTER_S:
            return True
        if user_id is None:
            return False
        if now - self._changed_at < DOUBT_AFTER_S and user_id in self._held:
            return True
        if self._slot_trouble_at:
            at = self._slot_trouble_at.get(key_slot(presence_key(user_id)), -math.inf)
            if now - at < DOUBT_AFTER_S:
                return True
        missed = self._missed_since.get(user_id)
        if missed is not None and now - missed > STALLED_AFTER_S:
            return True
        return now - self._user_doubt_at.get(user_id, -math.inf) < DOUBT_AFTER_S


_RUN: anyio.lowlevel.RunVar[OwnLiveness] = anyio.lowlevel.RunVar("deskbridge_own_liveness")


def own_liveness() -> OwnLiveness:
    """The :class:`OwnLiveness` of the running event loop (created on first use)."""
    try:
        return _RUN.get()
    except LookupError:
        current = OwnLiveness()
        _RUN.set(current)
        return current


class PresenceInDoubt(SubstrateUnavailable):
    """No presence for a desktop while this process's own writes are in doubt: a call
    is answered ``unavailable`` (a ``SubstrateUnavailable``); the admin API says
    ``online: null`` (the store answered; what it answered proves nothing)."""


def in_doubt_error() -> PresenceInDoubt:
    """What a caller is told when a presence is still absent after the second look
    while this process's own writes are in doubt: ``unavailable``, not ``offline``."""
    return PresenceInDoubt(
        "no presence for the desktop while this hub process cannot keep its own writes to "
        "Redis alive (its liveness, or this user's presence on its Cluster node: held or "
        "refused past their TTL); retry"
    )
