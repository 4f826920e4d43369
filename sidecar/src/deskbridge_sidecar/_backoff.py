"""Full-jitter exponential backoff for reconnects.

Delay before retry ``n`` (0-based) is ``random() * min(max_s, initial_s * 2**n)``: the
first retry comes within ``initial_s`` (0.5 s by default), later ones spread uniformly
over a window that doubles up to ``max_s`` (30 s). Full jitter keeps a fleet of sidecars
that lost the same hub from reconnecting in lockstep (AWS Architecture Blog, "Exponential
Backoff And Jitter": full jitter does the least total work of the variants compared).
``max_s`` below ``initial_s`` is allowed and simply caps every window (a user who sets
``DESKBRIDGE_BACKOFF_MAX_S=0.5`` gets windows of 0.5 s, not a crash). Pure: no I/O, no
clock; the random source is injectable for tests.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

import attrs


@attrs.define(eq=False)
class Backoff:
    """Reconnect delays.

    Args:
        initial_s: upper bound of the first delay, seconds (positive).
        max_s: cap on every window, seconds (positive; below ``initial_s`` it caps the
            first window too).
        random: source of floats in [0, 1) (default ``random.random``).

    Raises:
        ValueError: ``initial_s`` or ``max_s`` not positive.
    """

    initial_s: float = 0.5
    max_s: float = 30.0
    random: Callable[[], float] = _random.random
    attempt: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if not (self.initial_s > 0 and self.max_s > 0):
            raise ValueError(
                "Backoff needs positive initial_s and max_s, "
                f"got {self.initial_s!r} and {self.max_s!r}"
            )

    def window_s(self) -> float:
        """Upper bound of the next delay, seconds."""
        # Cap the exponent so 2**attempt never overflows after days of failures.
        return min(self.max_s, self.initial_s * 2.0 ** min(self.attempt, 62))

    def next_delay(self, cap_s: float | None = None) -> float:
        """The next delay in seconds, in ``[0, window_s())``; advances the attempt count.

        ``cap_s``: this delay's window is at most ``cap_s`` (still full jitter), and the
        attempt count goes on as usual."""
        window = self.window_s() if cap_s is None else min(self.window_s(), cap_s)
        self.attempt += 1
        fraction = min(max(float(self.random()), 0.0), 1.0)
        return fraction * window

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a session that proved the link works)."""
        self.attempt = 0


__all__ = ["Backoff"]
