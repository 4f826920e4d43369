"""Full-jitter exponential backoff for reconnects.

Delay before retry ``n`` (0-based) is ``random() * min(max_s, initial_s * 2**n)``: the
first retry comes within ``initial_s`` (1 s), later ones spread uniformly over a window
that doubles up to ``max_s`` (30 s). Full jitter keeps a fleet of sidecars that lost the
same hub from reconnecting in lockstep. Pure: no I/O, no clock; the random source is
injectable for tests.
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
        max_s: cap on the window, seconds (>= ``initial_s``).
        random: source of floats in [0, 1) (default ``random.random``).

    Raises:
        ValueError: ``initial_s`` not positive or ``max_s`` below it.
    """

    initial_s: float = 1.0
    max_s: float = 30.0
    random: Callable[[], float] = _random.random
    attempt: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if not self.initial_s > 0 or self.max_s < self.initial_s:
            raise ValueError("Backoff needs 0 < initial_s <= max_s")

    def window_s(self) -> float:
        """Upper bound of the next delay, seconds."""
        # Cap the exponent so 2**attempt never overflows after days of failures.
        return min(self.max_s, self.initial_s * 2.0 ** min(self.attempt, 62))

    def next_delay(self) -> float:
        """The next delay in seconds, in ``[0, window_s())``; advances the attempt count."""
        window = self.window_s()
        self.attempt += 1
        fraction = min(max(float(self.random()), 0.0), 1.0)
        return fraction * window

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a session that proved the link works)."""
        self.attempt = 0


__all__ = ["Backoff"]
