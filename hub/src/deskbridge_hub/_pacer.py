"""The timers of every session of one hub process, in one task (issue 10).

A session used to run a pinger task (a ping every ``ping_interval_s``, then a wait for
the pong with its deadline) and, with a token ``exp``, an expiry task: two tasks and two
timers per socket, woken every ten seconds each. At 10,000 idle desktops those wake-ups
(trio's deadline heap, task switches, an ``os.urandom`` per nonce) were most of the
hub's idle CPU. Here one task keeps a heap of when each session next needs attention
and calls its :meth:`Paced.pace`, which does what is due without waiting: queue a ping
(the session's writer sends it; the :class:`deskbridge_common.Connection` holds its
deadline), end the session whose pong is late (4002) or whose token expired (4003), and
answer when to come back. Invariant 4 holds: the writer stays the only sender.

A session can also ask for a visit sooner than the one it has (:meth:`Pacer.add` again,
for example the deadline of a ping it queued itself): the sooner visit replaces the later
one, whose heap entry is skipped when it comes up, so each session has exactly one
pending visit however often it asks.

A session that ends is :meth:`Pacer.discard`-ed, and the heap refers to sessions only
weakly: the pacer used to keep an ended session (and through its socket Hypercorn's
stream, with any unfinished message in its buffer, up to 2 MiB) until its next planned
visit, up to ``ping_interval_s + ping_timeout_s / 2`` later, so one token reconnecting
fast, each time leaving an unfinished message, held memory in proportion to its rate
(60 sockets leaving 1.5 MB each: +89 MB; docs/security.md).
"""

from __future__ import annotations

import heapq
import logging
import math
import weakref
from typing import Protocol

import attrs
import trio

log = logging.getLogger("deskbridge.hub.pacer")

#: The pacer wakes for due visits on a grid of this many seconds (trio clock): visits
#: due within one step are made together, at most this late. Every timer it drives is
#: ten seconds or more (ping timeout, silence window, token expiry checks); at 10,000
#: idle desktops their visits fall at ~330 distinct times a second, and waking for each
#: was one event-loop pass per visit (issue 10, idle CPU). A visit asked for now
#: (:meth:`Pacer.add` with the current time: a session's start, a probe after a job) is
#: made at once, not on the grid.
PACE_GRID_S = 0.25


class Paced(Protocol):
    """What the pacer drives (``HubSession``)."""

    def pace(self, now_s: float) -> float | None:
        """Do what is due at ``now_s`` (trio clock) without blocking.

        Returns:
            When to be called next (trio clock), or None: never again (ended).
        """


@attrs.define(eq=False)
class Pacer:
    """One heap of ``(when, n, weak reference to paced)`` and the task that works through it.

    ``_due`` holds each paced thing's one pending visit; a heap entry whose time is not
    its thing's pending visit is stale (replaced by a sooner one, or discarded) and
    skipped. Paced things must support weak references.

    Attributes:
        running: whether :meth:`run` is running.
    """

    _heap: list[tuple[float, int, weakref.ref[Paced]]] = attrs.field(factory=list)
    _due: dict[Paced, float] = attrs.field(factory=dict)
    _pushed: int = 0
    _sooner: trio.Event = attrs.field(factory=trio.Event)
    running: bool = False

    def add(self, paced: Paced, at_s: float) -> None:
        """Call ``paced.pace`` at ``at_s`` (trio clock) and then whenever it asks.

        If ``paced`` already has a visit pending, the sooner of the two is kept.
        """
        due = self._due.get(paced)
        if due is not None and due <= at_s:
            return
        if not self._heap or at_s < _on_grid(self._heap[0][0]):
            self._sooner.set()  # before the task's wake-up: it wakes to look again
        self._push(paced, at_s)

    def discard(self, paced: Paced) -> None:
        """Forget ``paced``: no more visits, and no strong reference to it is kept (its
        heap entry is skipped when it comes up). Harmless if it has no visit pending."""
        self._due.pop(paced, None)

    def _push(self, paced: Paced, at_s: float) -> None:
        self._pushed += 1
        self._due[paced] = at_s
        heapq.heappush(self._heap, (at_s, self._pushed, weakref.ref(paced)))

    def __len__(self) -> int:
        """How many paced things have a visit pending."""
        return len(self._due)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Work through the heap until cancelled.

        Cancellation: stops; the sessions' timers stop with it (their sockets do not).
        """
        self.running = True
        task_status.started()
        try:
            while True:
                with trio.move_on_at(_on_grid(self._heap[0][0]) if self._heap else math.inf):
                    await self._sooner.wait()
                self._sooner = trio.Event()
                self._visit_due(trio.current_time())
                await trio.lowlevel.checkpoint()
        finally:
            self.running = False

    def _visit_due(self, now: float) -> None:
        """Make every visit due at ``now`` (a function of its own: no paced thing stays
        referenced by a local of :meth:`run` while it waits)."""
        while self._heap and self._heap[0][0] <= now:
            at_s, _, ref = heapq.heappop(self._heap)
            paced = ref()
            if paced is None or self._due.get(paced) != at_s:
                continue  # replaced by a sooner visit, already made; or discarded
            del self._due[paced]
            try:
                again = paced.pace(now)
            except Exception:  # one session's fault must not stop every timer
                log.exception("session timer failed; its socket goes unpinged")
                continue
            if again is not None:
                self._push(paced, again)


def _on_grid(at_s: float) -> float:
    """``at_s`` rounded up to the next point of the ``PACE_GRID_S`` grid (never earlier)."""
    return max(math.ceil(at_s / PACE_GRID_S) * PACE_GRID_S, at_s)
