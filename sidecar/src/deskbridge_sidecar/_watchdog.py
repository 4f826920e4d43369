"""The clock watchdog: notice that the machine slept or the event loop wedged.

Every ``interval_s`` compare how far the wall clock and the monotonic clock moved with
how far they should have moved. On macOS the monotonic clock pauses while the lid is
closed and the wall clock does not; a wedged loop (a tool that blocks the thread) makes
both late. Either way, a gap over ``gap_s`` (5 s, seed report) means the socket is
presumed dead: the session drops it and reconnects instead of waiting for the OS to
notice. Backward jumps (NTP corrections) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio


@attrs.frozen
class ClockGap:
    """A detected gap.

    Attributes:
        gap_s: how much longer than expected the interval was, seconds.
        clock: ``"wall"`` or ``"monotonic"`` (the larger gap is reported).
    """

    gap_s: float
    clock: str

    def describe(self) -> str:
        """The log line: ``clock gap of 12.3 s (wall) — lid closed or loop wedged; ...``."""
        return (
            f"clock gap of {self.gap_s:.1f} s ({self.clock}) — lid closed or loop wedged; "
            "reconnecting"
        )


async def watch_clocks(
    *,
    interval_s: float,
    gap_s: float,
    wall_clock: Callable[[], float],
    monotonic: Callable[[], float] = trio.current_time,
) -> ClockGap:
    """Sleep in ``interval_s`` steps until either clock jumps; return the gap.

    Args:
        interval_s: seconds between checks (1 s).
        gap_s: tolerated excess per interval, seconds (5 s).
        wall_clock: Unix time source, seconds.
        monotonic: monotonic source, seconds (default the trio clock, which is also what
            ``trio.sleep`` measures).

    Returns:
        The first gap over ``gap_s``.

    Raises:
        trio.Cancelled: when the enclosing session ends; nothing to clean up.
    """
    wall0, mono0 = wall_clock(), monotonic()
    while True:
        await trio.sleep(interval_s)
        wall1, mono1 = wall_clock(), monotonic()
        wall_gap = (wall1 - wall0) - interval_s
        mono_gap = (mono1 - mono0) - interval_s
        if wall_gap > gap_s or mono_gap > gap_s:
            if wall_gap >= mono_gap:
                return ClockGap(gap_s=wall_gap, clock="wall")
            return ClockGap(gap_s=mono_gap, clock="monotonic")
        wall0, mono0 = wall1, mono1


__all__ = ["ClockGap", "watch_clocks"]
