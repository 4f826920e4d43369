"""Whether this hub process just did not run for a while (SIGSTOP, a paused VM, swap, a
blocking call): the lag probe's view, for the log lines that would otherwise blame Redis.

The lag probe (``_metrics.probe_loop_lag``) wakes every second; a wake
:data:`STALL_S` or more late is a *stall*: it logs one WARNING naming how long the process
did not run (``deskbridge.hub.stall``). Commands to Redis that timed out across the stall
failed by this process's own clock, not Redis': :func:`stalled_s` tells the outage log
(``_outage``) so, also at the resume, before the probe has run again (it compares the
probe's due wake with now).

State is per event-loop run (``anyio.lowlevel.RunVar``), on the loop's clock.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import attrs

log = logging.getLogger("deskbridge.hub.stall")

#: A wake of the lag probe this late, seconds, is a stall (a healthy loop lags under
#: 10 ms; an overloaded one 0.05-0.3 s, which the lag histogram and shedding cover).
STALL_S = 5.0
#: A failure this long after a stall ended is still laid to it, seconds.
AFTER_S = 2.0


@attrs.define(eq=False)
class _Probe:
    due: float | None = None  # when the probe's sleep should end
    ended_at: float = -1e18  # when the last stall ended
    length_s: float = 0.0  # how long it was


_RUN: anyio.lowlevel.RunVar[_Probe] = anyio.lowlevel.RunVar("deskbridge_stall")


def _probe() -> _Probe:
    try:
        return _RUN.get()
    except LookupError:
        probe = _Probe()
        _RUN.set(probe)
        return probe


def probe_sleeps(due: float) -> None:
    """The lag probe sleeps until ``due`` (the loop's clock)."""
    _probe().due = due


def probe_woke(now: float) -> None:
    """The lag probe woke at ``now``: log a stall once if it woke :data:`STALL_S` late."""
    probe = _probe()
    if probe.due is None:
        return
    late = now - probe.due
    probe.due = None
    if late >= STALL_S:
        probe.ended_at, probe.length_s = now, late
        log.warning(
            "this process did not run for %.1f s (stopped: SIGSTOP, a paused VM, swap; "
            "or starved of CPU, or a call blocking the event loop); sockets, calls and "
            "Redis commands that timed out meanwhile did so by this process's clock",
            late,
        )


def stalled_s() -> float:
    """How long this process did not run, if it is resuming from a stall now (the probe
    is :data:`STALL_S` overdue) or one ended within :data:`AFTER_S`; else 0."""
    probe = _probe()
    now = anyio.current_time()
    if probe.due is not None and now - probe.due >= STALL_S:
        return now - probe.due
    if now - probe.ended_at <= AFTER_S:
        return probe.length_s
    return 0.0
