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

State is per event-loop run (``anyio.lowlevel.RunVar``), as ``_outage``'s; time is the
loop's clock (``anyio.current_time``).
"""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel
import attrs

from ._errors import SubstrateUnavailable
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

    def in_doubt(self) -> bool:
        """True while this process's writes are held or failing, and for
        :data:`DOUBT_AFTER_S` after they were found lapsed or answered late."""
        now = anyio.current_time()
        since = self._unanswered_since
        if since is not None and now - since > STALLED_AFTER_S:
            return True
        return now - self._doubt_at < DOUBT_AFTER_S


_RUN: anyio.lowlevel.RunVar[OwnLiveness] = anyio.lowlevel.RunVar("deskbridge_own_liveness")


def own_liveness() -> OwnLiveness:
    """The :class:`OwnLiveness` of the running event loop (created on first use)."""
    try:
        return _RUN.get()
    except LookupError:
        current = OwnLiveness()
        _RUN.set(current)
        return current


def in_doubt_error() -> SubstrateUnavailable:
    """What a caller is told when a presence is still absent after the second look
    while this process's own writes are in doubt: ``unavailable``, not ``offline``."""
    return SubstrateUnavailable(
        "no presence for the desktop while this hub process cannot keep its own writes to "
        "Redis alive (held or refused past their TTL); retry"
    )
