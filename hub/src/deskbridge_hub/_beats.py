"""The sessions attached to a process reader (``Listener``) and when each one's presence
is next refreshed (``BeatSchedule``); the beat loop itself is ``_reader``'s.

Each session is beaten every ``heartbeat_s``, counted from its handshake (which has just
written presence and the catalogue), so the beats of 10,000 sessions spread over the
interval instead of arriving as one burst that would stall the event loop; beats due
within ``BEAT_BATCH_S`` of each other share one pipelined write. A *full* beat covers
every session at once, catalogues included: after a failed beat, after any substrate
failure, and when the process's liveness key had lapsed (the store may have lost
presence and catalogues alike).
"""

from __future__ import annotations

import heapq
import math
import weakref
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from ._jobstate import JobState
from ._substrate import Beat, Entry

#: Beats due within this many seconds of each other (at most this early, or a tenth of
#: the heartbeat if shorter) share one pipelined write: one round trip a second at most
#: however many sessions, and presence (TTL: three heartbeats) never gets close to lapsing.
BEAT_BATCH_S = 1.0
#: Every this many beats a session's beat is deep: the entry index is looked at even when
#: the group looks quiet (every 5 minutes at 30 s). Beats after a read are deep too.
DEEP_EVERY = 10


class SessionGone(Exception):
    """A ``Listener.dispatch`` found its session ended (its tasks over, its detach not
    yet run): the entry was not taken, nothing started. The reader treats the session as
    stopped (a pushed entry goes back to ``queued``; a read one stays pending here for
    the daemon's next session)."""


@attrs.define(eq=False)
class Listener:
    """One session attached to the process reader.

    Attributes:
        user_id, session_id: whose stream, which session (presence value).
        catalogue: the session's tool catalogue (JSON text), written at the handshake and
            again whenever a beat finds presence had been lost.
        dispatch: start serving one entry (returns once its task started; the reader has
            added the entry ID to the in-flight set). Raises :class:`SessionGone`, with
            ``stopped`` set, when the session has ended meanwhile: nothing started.
        on_deleted: answer entries whose body is gone (see ``EntryServer.answer_deleted``).
        on_superseded: the heartbeat found presence held by another session.
        capacity: how many more entries the session can take now.
        stopped: once set, nothing more is read for this session.
        delivered_state: the state a delivery by this session records: given, new entries
            are read and marked delivered in one step (``read_new_delivered``).
        wants_more: the session was full when entries were waiting: read again when a
            serving task ends.
        due_s: when its next beat is due (trio clock); ``beats``: beats answered.
        reads, reads_checked: entries dispatched for it, and how many of those a deep
            beat has covered (more were read since: the next beat is deep).
        catalogue_due: its next beat writes the catalogue (presence had been lost).
        daemon_id: the sidecar's daemon instance (``hello.daemon_id``), or None.
        on_retaken: called when a beat found presence had been lost and wrote it again
            (Redis lost its data, or presence lapsed): the session records itself in the
            admin directory again, which went with it.
        beat_misses: its beats missed in a row because its Cluster node was out
            (``BeatReply.unavailable``): their retry backs off.
        beat_errors: its beats that failed in a row for a reason other than an outage
            (the heartbeat raised): they back off, and only its own success resets it.
        on_cancel: called with a job id from a cancel notice (:class:`CancelAsked`): the
            session sends the job's ``cancel`` frame or answers it ``cancelled``
            (``_cancel_notice``), whatever its room; it must not block (None: ignored).
        on_cut_off: called when this process has not reached Redis for
            ``ProcessReader.cut_off_s`` (partitioned from it): the session ends with
            1013 so that its sidecar reconnects, to a replica that can serve it.
        doubt: see the attribute.
        attached_at: when the reader attached it (trio clock, seconds): its handshake had
            just written presence, so this process's silence counts for it from then at
            the earliest (``ProcessReader._cut_off_loop``).
    """

    user_id: str
    session_id: str
    catalogue: str
    dispatch: Callable[[Entry], Awaitable[None]]
    on_deleted: Callable[[list[str]], Awaitable[None]]
    on_superseded: Callable[[], None]
    capacity: Callable[[], int]
    stopped: trio.Event = attrs.field(factory=trio.Event)
    delivered_state: Callable[[], JobState] | None = None
    wants_more: bool = False
    due_s: float = 0.0
    beats: int = 0
    reads: int = 0
    reads_checked: int = 0
    catalogue_due: bool = False
    daemon_id: str | None = None
    on_retaken: Callable[[], None] | None = None
    beat_errors: int = 0  # its beats failed in a row for a reason other than an outage
    beat_misses: int = 0  # its beats missed in a row for an outage of its Cluster node
    on_cut_off: Callable[[], None] | None = None
    on_cancel: Callable[[str], None] | None = None
    attached_at: float = -math.inf
    #: Beats found presence held by another session: how many checks of that holder
    #: (``_presence_doubt``) found it possibly real; at ``_reader.DOUBT_ASKS`` the next
    #: such beat hands over. 0 again at a beat that finds presence ours.
    doubt: int = 0
    checking: bool = False  # a check of the holder is due or running

    def beat(self, *, full: bool) -> Beat:
        """This session's next beat (``full``: with its catalogue)."""
        return Beat(
            self.user_id,
            self.session_id,
            self.catalogue if full or self.catalogue_due else None,
            deep=self.reads != self.reads_checked or self.beats % DEEP_EVERY == DEEP_EVERY - 1,
        )

    def answered(self, beat: Beat, reads: int, *, taken: bool) -> None:
        """Its ``beat`` (built when it had ``reads``) was answered; ``taken``: presence
        had been lost, so the next beat writes the catalogue unless this one did."""
        self.beats += 1
        if beat.deep:
            self.reads_checked = reads
        self.catalogue_due = taken and beat.catalogue is None
        if taken and self.on_retaken is not None:
            self.on_retaken()


@attrs.define(eq=False)
class BeatSchedule:
    """When each beating session is due (a heap of ``(due_s, n, weak reference to
    listener)``; an entry is stale once its listener's ``due_s`` moved, it stopped beating
    or it is gone). Weak: an ended session, its listener and its socket are freed at once,
    not when their next beat comes up (up to ``heartbeat_s`` later; ``_pacer``).

    Attributes:
        heartbeat_s: the interval between two beats of one session.
        full: the next beat covers every session, catalogues included.
        retry_at: when that full beat may go (trio clock; after a failure, a second on).
    """

    heartbeat_s: float
    full: bool = False
    retry_at: float = -math.inf
    _heap: list[tuple[float, int, weakref.ref[Listener]]] = attrs.field(factory=list)
    _pushed: int = 0
    _taken_at: float = -math.inf  # when the last batch was taken (trio clock)

    @property
    def window_s(self) -> float:
        return min(BEAT_BATCH_S, self.heartbeat_s / 10)

    def at(self, listener: Listener, due_s: float) -> None:
        """Beat ``listener`` at ``due_s`` (trio clock), not before (unless in a batch)."""
        listener.due_s = due_s
        self._pushed += 1
        heapq.heappush(self._heap, (due_s, self._pushed, weakref.ref(listener)))

    def again(self, listener: Listener) -> None:
        """Beat ``listener`` one heartbeat after its last due time: the next point of its
        own grid after now, so sessions stay spread (even after a full beat) and a beat
        sent early (the batch window) does not make the next one earlier."""
        now = trio.current_time()
        due_s = listener.due_s + self.heartbeat_s
        if due_s <= now:
            due_s = now + self.heartbeat_s - (now - listener.due_s) % self.heartbeat_s
        self.at(listener, due_s)

    def all_now(self, *, retry_at: float = -math.inf) -> None:
        """The next beat covers every session, at ``retry_at`` at the earliest."""
        self.full = True
        self.retry_at = retry_at

    def next_at(self) -> float:
        """When the beat loop should wake next (trio clock): when the first beat falls
        within the batch window, and not sooner than a window after the last batch.

        Why the second bound (issue 10, idle CPU): a batch takes the beats due within a
        window from now, so the next beat due lies just past it; waking a window before
        *that* meant waking again at once, and 10,000 sessions were beaten in ~150 writes
        of two beats a second instead of one write a second. Beats still go out at most
        a window early and never late (the presence TTL is three heartbeats)."""
        if self.full:
            return self.retry_at
        if not self._heap:
            return trio.current_time() + self.heartbeat_s
        return max(self._heap[0][0] - self.window_s, self._taken_at + self.window_s)

    def take(self, beating: Mapping[str, Listener]) -> tuple[bool, list[Listener]]:
        """The sessions to beat now, each once, and whether this is a full beat: every
        one of ``beating`` (session id -> listener) for a full beat, else those due
        within the batch window."""
        if self.full:
            self.full = False
            self._heap.clear()
            return True, list(beating.values())
        now = trio.current_time()
        horizon = now + self.window_s
        due: list[Listener] = []
        while self._heap and self._heap[0][0] <= horizon:
            due_s, _, ref = heapq.heappop(self._heap)
            listener = ref()
            if listener is None:
                continue
            if listener.due_s == due_s and beating.get(listener.session_id) is listener:
                due.append(listener)
        if due:
            self._taken_at = now
        return False, due

    def __len__(self) -> int:
        return len(self._heap)
