"""How many log lines one sidecar can make the hub write about frames it refuses or ignores.

A frame that is refused but not fatal (a ``job_result`` for a delivery not outstanding on
the socket, a ``pong`` for no ping, an ``error`` frame) is logged, because a few of them
are normal (a result crossing a cancel) and a few more say something is wrong on the
desktop. One line per frame let one token write the shared log as fast as it could send:
55,000 ``job_result`` frames for ids never delivered in 7 s wrote 18,800 WARNING lines
(4.6 MB) and doubled another user's call latency on a 2-core machine. A session now logs
the first :data:`BURST` such lines, then at most one per :data:`INTERVAL_S`, which says how
many were left out since the last; the session's end line counts any left out at the end.
"""

from __future__ import annotations

import attrs

#: Lines logged at once per session before the budget applies.
BURST = 10
#: After the burst: at most one line per this many seconds (trio clock) per session.
INTERVAL_S = 60.0


@attrs.define
class LogBudget:
    """A budget of log lines: ``burst`` at once, then one per ``interval_s`` saying how
    many were left out (a session's lines about its peer's frames; with ``burst=0``, the
    process's ``unavailable`` line, ``_unavailable_log``).

    Not thread-safe; times are the caller's monotonic seconds (``trio.current_time()``).
    """

    burst: int = BURST
    interval_s: float = INTERVAL_S
    _spent: int = 0
    _held: int = 0
    _next_s: float = float("-inf")

    def admit(self, now_s: float) -> int | None:
        """Whether to log one more line at ``now_s``.

        Returns:
            None: leave this line out (it is counted). An int: log it, and say that this
            many lines were left out before it (0: none).
        """
        if self._spent < self.burst:
            self._spent += 1
            return 0
        if now_s >= self._next_s:
            held, self._held = self._held, 0
            self._next_s = now_s + self.interval_s
            return held
        self._held += 1
        return None

    def held(self) -> int:
        """Lines left out since the last one logged (for the session's end line)."""
        return self._held


__all__ = ["BURST", "INTERVAL_S", "LogBudget"]
