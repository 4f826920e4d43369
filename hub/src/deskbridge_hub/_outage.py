"""One account of a substrate (Redis) outage in the log, whichever loop meets it.

Every loop of a hub process that retries through an outage (the reader's wake-up wait,
reads and heartbeats, the delivery's held writes: mark delivered, finish, XACK) reports
each failed attempt and each success here. The operator reads:

* one WARNING when the outage starts (the first failed attempt of the event-loop run,
  naming the operation and Redis' error);
* every :data:`SUMMARY_EVERY_S` (60 s) while it lasts, one WARNING: still unavailable,
  for how long, how many attempts failed, and what is waiting (``3 x finish, heartbeat,
  wake-up wait``);
* one WARNING when an operation succeeds again: back after how long.

Each retry itself is the caller's DEBUG line. An attempt that was in flight when Redis
returned may fail just after the "back" line: a failure within :data:`REOPEN_QUIET_S`
of it re-opens the outage at DEBUG (so a flap of a second is not three more WARNINGs);
it is announced if it lasts to its first summary.

State is per event-loop run (``anyio.lowlevel.RunVar``): a hub process has one; test
runs on their own clocks never share it. Time is the loop's clock (``anyio.current_time``;
trio's MockClock in tests).
"""

from __future__ import annotations

import logging
from collections import Counter

import anyio
import anyio.lowlevel
import attrs

from . import _stall

log = logging.getLogger("deskbridge.hub.outage")

#: While an outage lasts, one summary line this often, seconds.
SUMMARY_EVERY_S = 60.0
#: A failure this soon after an outage ended (an attempt that was in flight when Redis
#: returned) re-opens it quietly, seconds.
REOPEN_QUIET_S = 2.0
#: Most kinds of waiting operation named in a summary line.
SUMMARY_KINDS = 6


@attrs.define(eq=False)
class OutageLog:
    """The outage state of one event-loop run. Not thread-safe (one loop's tasks)."""

    summary_every_s: float = SUMMARY_EVERY_S
    _since: float | None = None
    _announced: bool = False
    _last_summary: float = 0.0
    _ended_at: float | None = None
    _attempts: int = 0
    #: the stall (seconds) this outage's first failure followed, 0.0: none (``_stall``)
    _stall_s: float = 0.0
    #: what -> its kind, for every operation that failed during this outage
    _waiting: dict[str, str] = attrs.field(factory=dict)

    @property
    def down(self) -> bool:
        """True between a failed attempt and the next success."""
        return self._since is not None

    def failed(self, what: str, exc: BaseException, *, kind: str | None = None) -> None:
        """An attempt of ``what`` failed with ``exc`` and will be retried.

        Args:
            what: names the operation (``finish <job_id>``); its ``kind`` (default: its
                first word) groups it in the summary line.
            exc: the failure (its text is logged; it never holds a password).
        """
        now = anyio.current_time()
        self._attempts += 1
        self._waiting[what] = kind or what.split(" ", 1)[0]
        if self._since is None:
            global _down
            _down += 1
            self._since = self._last_summary = now
            quiet = self._ended_at is not None and now - self._ended_at < REOPEN_QUIET_S
            self._announced = not quiet
            stalled_s = _stall.stalled_s()
            if stalled_s and not quiet:  # timed out by this process's clock: not Redis'
                self._stall_s = stalled_s
                log.info(
                    "%s failed just after this process did not run for %.1f s (its own "
                    "stall, not Redis'): %s; retrying (each retry at DEBUG, a summary "
                    "every %.0f s)",
                    what, stalled_s, exc, self.summary_every_s,
                )  # fmt: skip
                return
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "Redis unavailable: %s failed: %s; retrying (each retry at DEBUG, a "
                "summary every %.0f s)",
                what, exc, self.summary_every_s,
            )  # fmt: skip
        elif now - self._last_summary >= self.summary_every_s:
            self._last_summary = now
            self._announced = True
            log.warning(
                "Redis still unavailable after %.0f s: %d failed attempts; waiting: %s; "
                "last error: %s",
                now - self._since, self._attempts, self.waiting(), exc,
            )  # fmt: skip

    def succeeded(self) -> None:
        """An attempt succeeded: the outage, if any, is over. What was waiting is
        forgotten (what still fails reports itself again)."""
        if self._since is None:
            return
        now = anyio.current_time()
        if self._stall_s:  # what failed after a stall works again: not Redis coming back
            log.info(
                "Redis answers (the failures after this process's %.1f s stall were its "
                "own: %d failed attempts; waiting: %s)",
                self._stall_s, self._attempts, self.waiting(),
            )  # fmt: skip
        else:
            log.log(
                logging.WARNING if self._announced else logging.DEBUG,
                "Redis available again after %.1f s (%d failed attempts; waiting: %s)",
                now - self._since, self._attempts, self.waiting(),
            )  # fmt: skip
        self._since, self._ended_at, self._attempts, self._stall_s = None, now, 0, 0.0
        self._waiting.clear()
        global _down
        _down -= 1

    def waiting(self) -> str:
        """What is waiting, by kind, most first: ``3 x finish, heartbeat``."""
        kinds = Counter(self._waiting.values()).most_common()
        named = [k if n == 1 else f"{n} x {k}" for k, n in kinds[:SUMMARY_KINDS]]
        if len(kinds) > SUMMARY_KINDS:
            named.append(f"{len(kinds) - SUMMARY_KINDS} more kinds")
        return ", ".join(named) or "nothing"


_RUN: anyio.lowlevel.RunVar[OutageLog] = anyio.lowlevel.RunVar("deskbridge_outage_log")
#: How many event-loop runs of this process are in an outage: a success elsewhere looks
#: its run's log up only then (the lookup costs microseconds, per job: issue 10).
_down = 0


def succeeded() -> None:
    """An attempt succeeded: end this run's outage, if one is open (cheap when none is)."""
    if _down:
        outage_log().succeeded()


def outage_log() -> OutageLog:
    """The :class:`OutageLog` of the running event loop (created on first use)."""
    try:
        return _RUN.get()
    except LookupError:
        current = OutageLog()
        _RUN.set(current)
        return current
