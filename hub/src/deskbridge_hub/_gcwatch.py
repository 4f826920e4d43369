"""The garbage collector of a serving hub process (issue 10).

A hub process holding 10,000 sockets holds millions of objects. CPython's full (oldest
generation) collection walks all of them, and while it does the event loop stands still:
pings go unanswered, Redis replies sit unread past their timeout, the process liveness
key lapses. Two measures, both only in a served process (``asgi.py``), never in tests:

* ``gc.freeze()`` once serving: everything allocated at start-up (imports, the app,
  the substrate) moves to the permanent generation, which collections never walk.
* after each full collection, what survived it is frozen too, so the next full
  collection walks only what was allocated since: measured with ``bench/idle.py`` at
  10,000 idle desktops, every full collection stood the loop still for 2.7-3.4 s
  (about once a minute) and collected almost nothing, which lapsed the process's 3 s
  liveness key and timed out Redis commands. The cost: cyclic garbage among frozen
  objects is not collected until ``UNFREEZE_EVERY_S`` passes, when one full collection
  walks everything again (then freezes what survived).
* a ``gc.callbacks`` hook times every collection of the oldest generation and logs a
  WARNING (at most once a minute) when one stood the loop still for longer than
  ``SLOW_COLLECTION_S``, so an operator can tell a GC stall from a Redis problem.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("deskbridge.hub.gc")

#: A full collection longer than this (seconds) is logged.
SLOW_COLLECTION_S = 0.25
#: At most one such WARNING per this many seconds.
WARN_EVERY_S = 60.0
#: How often (seconds) the frozen heap is given back to the collector, so cyclic garbage
#: that became unreachable while frozen is collected (one long full collection an hour).
UNFREEZE_EVERY_S = 3600.0

_started: list[float] = []
_warned_at: list[float] = [-WARN_EVERY_S]
_unfrozen_at: list[float] = [time.perf_counter()]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if info.get("generation") != 2:
        return
    now = time.perf_counter()
    if phase == "start":
        _started[:] = [now]
        return
    if not _started:
        return
    took_s = now - _started.pop()
    if now - _unfrozen_at[0] >= UNFREEZE_EVERY_S:
        _unfrozen_at[0] = now
        gc.unfreeze()  # the next full collection walks everything once
    else:
        gc.freeze()  # what survived stays out of the next full collections
    if took_s > SLOW_COLLECTION_S and now - _warned_at[0] >= WARN_EVERY_S:
        _warned_at[0] = now
        log.warning(
            "a full garbage collection stood the event loop still for %.2f s (%d objects "
            "collected); at most one such line a minute",
            took_s,
            info.get("collected", 0),
        )


def install() -> None:
    """Freeze what start-up allocated and watch full collections (idempotent)."""
    gc.freeze()
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


__all__ = ["SLOW_COLLECTION_S", "install"]
