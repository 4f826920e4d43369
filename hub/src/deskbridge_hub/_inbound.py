"""How fast one sidecar can make its hub process read and parse messages.

A socket's peer decides how much it sends; every message costs the process that serves it
CPU (a read, a JSON parse, a route), shared by every user of that process. Found by fault
injection: one user's raw client sending ~4,400 bogus ``job_result`` frames a second took
~30 % of a hub core and another user's echo p50 from 88 to 220 ms. A session now reads
its peer's messages of its own initiative (anything but the answer to a delivery the hub
sent: those are bounded by what the hub sends, 32 in flight) within an
:class:`InboundBudget` (a token bucket on messages and on characters) and, past it, waits
before reading the next message: the peer's sends block on TCP (nothing is dropped, no
close), so a flooder slows only itself. A sidecar's own messages are pings (one every
``ping_interval_s``), pongs, progress (at most one per 0.2 s per job, one tool at a time),
``sleeping`` and ``error``: far inside the budget, whatever the rate of its jobs.
Pure (no I/O): the session asks how long to wait and sleeps.
"""

from __future__ import annotations

import attrs

#: Messages of its own initiative a second a session reads from its peer past the burst.
FRAMES_PER_S = 200.0
#: Messages read at once before the rate applies (also the most a quiet peer saves up).
BURST = 400
#: Characters a second a session reads from its peer past the burst (1 MiB).
BYTES_PER_S = 1.0 * 2**20
#: Characters read at once before that rate applies (8 MiB).
BYTES_BURST = 8.0 * 2**20


@attrs.define
class InboundBudget:
    """A token bucket of messages and characters for one session's reads.

    Times are the caller's monotonic seconds (``trio.current_time()``). Not thread-safe.
    """

    frames_per_s: float = FRAMES_PER_S
    burst: float = BURST
    bytes_per_s: float = BYTES_PER_S
    bytes_burst: float = BYTES_BURST
    _frames: float = attrs.field(init=False)
    _bytes: float = attrs.field(init=False)
    _at_s: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._frames = self.burst
        self._bytes = self.bytes_burst

    def charge(self, now_s: float, size: int) -> float:
        """Count one message of ``size`` characters read at ``now_s``.

        Returns:
            Seconds to wait before reading the next message: 0.0 within the budget,
            else how long until the bucket holds what was overspent.
        """
        if self._at_s is not None:
            elapsed_s = max(0.0, now_s - self._at_s)
            self._frames = min(self.burst, self._frames + elapsed_s * self.frames_per_s)
            self._bytes = min(self.bytes_burst, self._bytes + elapsed_s * self.bytes_per_s)
        self._at_s = now_s
        self._frames -= 1
        self._bytes -= size
        return round(
            max(0.0, -self._frames / self.frames_per_s, -self._bytes / self.bytes_per_s), 9
        )
