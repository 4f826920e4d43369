"""Admission control: a call this process cannot answer in time is refused at once.

Measured (``bench/overload.py``, docs/operations.md "Overload"): with no bound, every
request was taken, so a call waited behind all the others and callers asking
``timeout_s`` 10 were answered after up to 30 s, or not at all. A serious service sheds
early and truthfully instead: a call it cannot take is refused before anything is
enqueued (``Overloaded``: HTTP 503 ``overloaded`` with ``Retry-After``, so a retry is
safe), and a call it took is answered by its deadline.

Two gates, both O(1) per call (a counter and two floats; no Redis round trip):

- **calls in flight**: at most ``limit`` dispatch calls wait in this process at once
  (``DESKBRIDGE_MAX_CALLS``, default :data:`DEFAULT_MAX_CALLS`);
- **loop lag**: no new call while the event loop wakes tasks more than ``lag_limit_s``
  late (``DESKBRIDGE_SHED_LAG_S``, default :data:`DEFAULT_SHED_LAG_S`): the lag is what
  every step of an admitted call waits, its answer's wake-up included, so past it the
  process cannot keep the deadlines it already took. Read from :meth:`CallAdmission.probe`
  (a sleep of ``LAG_PROBE_S``, how late it woke), smoothed (``LAG_WEIGHT``): a lag that
  lasts sheds, a single stall of any length (a full garbage collection, the machine busy
  for a moment, a paused VM: each sample counts for at most ``LAG_SAMPLE_CAP`` times the
  bound) does not refuse the calls that queued behind it, which the process can still
  serve.

No I/O here; the probe is one task of the app's nursery.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Iterator

import attrs

from ._errors import Overloaded

#: Default ``DESKBRIDGE_MAX_CALLS``: a bound on what waiting calls hold, memory and
#: descriptors, not on CPU (the lag gate guards the CPU). Most calls wait on slow desktop
#: tools (browser actions of 5-60 s) and cost little while they wait: measured
#: (``bench/waiting_calls.py``, 2,000 calls on 2,000 desktops, each tool 30 s) 49.8 KiB
#: of RSS and one descriptor per waiting call, 3.3 s of hub CPU in all. A process sized
#: for 10,000 desktops (46 KiB each, bench/README.md "idle.py") in the manifests' 1 GiB
#: pod holds about 560 MiB idle; 5,000 waiting calls add about 245 MiB and 5,000
#: descriptors, which stays under both. Was 500 (Little's law on echo throughput): a
#: healthy, idle process refused the 501st of 600 calls waiting on 30 s tools. With the
#: count out of reach (10,000), the lag gate alone kept every call it took answered by its
#: ``timeout_s`` plus the grace in the echo flood of ``bench/overload.py`` (1,000 callers:
#: 8,054 answered, the latest 0.11 s past T, 92 refused), where 500 refused 2,938 and
#: completed 3,195. Neither gate keeps deadlines on a machine starved as a whole (2,500
#: callers on the same 2 cores: answers up to T+8 s with a bound of 500, 1,000 or 5,000,
#: and the most late with 500); bench/README.md has the runs.
DEFAULT_MAX_CALLS = 5000
#: Default ``DESKBRIDGE_SHED_LAG_S``, seconds: ``ANSWER_GRACE_S``, the margin an answer
#: may take past the caller's ``timeout_s`` for its last looks; a loop that wakes tasks
#: later than that cannot answer by the deadline plus that margin. Measured
#: (``bench/overload.py``, a starved process: 43 % of a core, 0.22-0.25 s mean lag): at
#: 0.5 s, 3.4 % of the answers came 1-5 s after their ``timeout_s``; at 0.25 s none did,
#: with as many calls completed. (A healthy loop lags under 10 ms.)
DEFAULT_SHED_LAG_S = 0.25
#: How often the lag probe wakes, seconds (ten wake-ups a second: nothing measurable).
LAG_PROBE_S = 0.1
#: Weight of each new lag sample in the smoothed lag (an exponentially weighted moving
#: average): one stall of 0.8 s alone moves it from 0 to 0.24 s, under the default
#: bound; a lag that stays at 0.5 s (twice the default bound) passes it in two samples.
LAG_WEIGHT = 0.3
#: A sample counts for at most this many times ``lag_limit_s``: one stall of any length
#: (SIGSTOP, a paused VM, a full collection of a large heap) then moves the smoothed lag
#: to at most ``LAG_WEIGHT`` x 2 = 0.6 of the bound, so the calls after it are taken
#: (uncapped, a 9 s stop made it 2.7 s: every call refused for the next 0.7 s of a prompt
#: loop), while a lag of twice the bound or more still sheds in two samples and stops
#: shedding two samples after it ends.
LAG_SAMPLE_CAP = 2.0
#: ``Retry-After`` of an ``overloaded`` refusal, seconds: about the time a full house of
#: calls turns over (500 calls at the overload bench's 250-450 calls/s: 1-2 s), so a
#: retry then is likely to find room, while refused callers that all came back after 1 s
#: cost the process a refusal each per second (about 0.5 ms of CPU each: a quarter of a
#: core for 500 of them). Clients should back off further, with jitter, on repeats.
OVERLOAD_RETRY_AFTER_S = 2


@attrs.define(eq=False)
class CallAdmission:
    """The admission gates of one process's dispatch calls (module docstring).

    Args:
        limit: most calls in flight at once (None: no bound).
        lag_limit_s: refuse new calls while the loop lags more than this, seconds
            (None or 0: no lag gate).
        clock: the event loop's clock (``trio.current_time``), seconds.

    Attributes:
        in_flight: calls admitted and not yet ended.
        refused: calls refused so far, by reason (``calls``, ``lag``).
    """

    limit: int | None
    lag_limit_s: float | None
    clock: Callable[[], float]
    in_flight: int = attrs.field(default=0, init=False)
    refused: dict[str, int] = attrs.field(factory=lambda: {"calls": 0, "lag": 0}, init=False)
    _lag_s: float = attrs.field(default=0.0, init=False)

    def lag_s(self) -> float:
        """The loop's smoothed lag, seconds (0 before the probe has run)."""
        return self._lag_s

    @contextlib.contextmanager
    def admitted(self, user_id: str) -> Iterator[None]:
        """Hold one call's slot for the block.

        Raises:
            Overloaded: ``limit`` calls are in flight, or the loop lags more than
                ``lag_limit_s``; nothing was done for the call (``reason`` says which).
        """
        if self.limit is not None and self.in_flight >= self.limit:
            self.refused["calls"] += 1
            raise Overloaded(
                f"this hub process has {self.in_flight} calls in flight, its bound "
                f"(DESKBRIDGE_MAX_CALLS={self.limit}); nothing was enqueued: retry in "
                f"{OVERLOAD_RETRY_AFTER_S} s or later, or at another replica",
                user_id=user_id,
                reason="calls",
                retry_after_s=OVERLOAD_RETRY_AFTER_S,
            )
        if self.lag_limit_s and (lag_s := self._lag_s) > self.lag_limit_s:
            self.refused["lag"] += 1
            raise Overloaded(
                f"this hub process's event loop lags {lag_s:.3f} s, over its bound "
                f"(DESKBRIDGE_SHED_LAG_S={self.lag_limit_s:g}): it could not answer by the "
                f"deadline; nothing was enqueued: retry in {OVERLOAD_RETRY_AFTER_S} s or "
                "later, or at another replica",
                user_id=user_id,
                reason="lag",
                retry_after_s=OVERLOAD_RETRY_AFTER_S,
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def probe(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        """Run until cancelled: sleep ``LAG_PROBE_S``, note how late it woke.

        Cancellation: ends the probe; the lag gate then reads the last lag noted.
        """
        cap_s = LAG_SAMPLE_CAP * self.lag_limit_s if self.lag_limit_s else math.inf
        while True:
            due = self.clock() + LAG_PROBE_S
            await sleep(LAG_PROBE_S)
            late_s = min(max(0.0, self.clock() - due), cap_s)
            self._lag_s += LAG_WEIGHT * (late_s - self._lag_s)

    def statistics(self) -> dict[str, object]:
        """``{"in_flight", "limit", "lag_s", "lag_limit_s", "refused"}``."""
        return {
            "in_flight": self.in_flight,
            "limit": self.limit,
            "lag_s": self.lag_s(),
            "lag_limit_s": self.lag_limit_s,
            "refused": dict(self.refused),
        }


__all__ = [
    "DEFAULT_MAX_CALLS",
    "DEFAULT_SHED_LAG_S",
    "LAG_PROBE_S",
    "LAG_SAMPLE_CAP",
    "LAG_WEIGHT",
    "OVERLOAD_RETRY_AFTER_S",
    "CallAdmission",
]
