"""Why a caller was answered ``unavailable`` (HTTP 503, or the MCP tool result), in the
hub's log: the access line says only 503, and an operator looking at a wave of them must
see the cause (Redis refused: ``max number of clients reached``, ``OOM``, a timeout...)
without turning on DEBUG. One WARNING at most every ``EVERY_S`` seconds per process;
the answers in between are counted into the next line."""

from __future__ import annotations

import logging
import time

from deskbridge_common import safe_text

from ._peer_noise import LogBudget

log = logging.getLogger("deskbridge.hub.unavailable")

#: At most one WARNING per this many seconds (per process).
EVERY_S = 10.0

_budget = LogBudget(burst=0, interval_s=EVERY_S)


def note_unavailable(message: str, *, now_s: float | None = None) -> None:
    """A caller is being answered ``unavailable`` because of ``message`` (the
    ``SubstrateUnavailable`` text): log it, or count it if a line went out less than
    ``EVERY_S`` ago. ``now_s``: a monotonic time in seconds (default ``time.monotonic()``;
    tests pass their own). Never raises."""
    quiet = _budget.admit(time.monotonic() if now_s is None else now_s)
    if quiet is None:
        return
    more = f" ({quiet} more such answers since the last line)" if quiet else ""
    log.warning("answered unavailable (503): %s%s", safe_text(message), more)
