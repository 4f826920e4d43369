"""A hub process that did not run for a while (SIGSTOP, a paused VM, swap) says so once,
and does not blame Redis for the commands that timed out meanwhile. Found running three
replicas: a 40 s SIGSTOP of one logged, on resume, only ``WARNING Redis unavailable:
wake-up wait failed: ... BLMPOP timed out after 7.0 seconds`` and ``Redis available again
after 0.2 s``, while Redis had answered throughout (the other replicas served), and
nothing said the process itself had been stopped. MockClock: the stop is a clock jump
with no task running in between."""

from __future__ import annotations

import logging
import re

import pytest
import trio
from deskbridge_hub import SubstrateUnavailable, _metrics, _stall
from deskbridge_hub._outage import OutageLog

STALL_LOG = "deskbridge.hub.stall"
OUTAGE_LOG = "deskbridge.hub.outage"


def told(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == name]


def _seconds(message: str, after: str) -> float:
    """The number of seconds written after ``after`` in ``message``."""
    match = re.search(re.escape(after) + r"([0-9.]+) s", message)
    assert match is not None, message
    return float(match.group(1))


def timed_out() -> SubstrateUnavailable:
    return SubstrateUnavailable("Redis at h:1 unavailable (BLMPOP wake): timed out")


async def _probe_then_stop(clock: trio.testing.MockClock, stop_s: float) -> None:
    """Run the lag probe 5 s, stop the process ``stop_s`` (a clock jump), and let a
    Redis command's timeout fire at the resume, before the probe has run again."""
    outage = OutageLog()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_metrics.probe_loop_lag, trio.sleep, trio.current_time)
        await trio.sleep(5.2)
        clock.jump(stop_s)  # nothing runs during the stop
        outage.failed("wake-up wait", timed_out())  # first at the resume
        await trio.sleep(0.3)  # the probe wakes, late
        outage.succeeded()
        await trio.sleep(30)
        nursery.cancel_scope.cancel()


async def test_a_stopped_process_says_so_once_and_blames_not_redis(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG)
    await _probe_then_stop(autojump_clock, 40.0)
    stall = told(caplog, STALL_LOG)
    assert len(stall) == 1, stall
    level, message = stall[0]
    assert level == logging.WARNING
    assert 38 <= _seconds(message, "did not run for ") <= 40, message
    outage = told(caplog, OUTAGE_LOG)
    assert [level for level, _ in outage] == [logging.INFO, logging.INFO], outage
    assert 38 <= _seconds(outage[0][1], "this process did not run for ") <= 40, outage


async def test_lag_under_the_stall_bound_is_only_a_metric(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG)
    await _probe_then_stop(autojump_clock, _stall.STALL_S - 1.5)
    assert told(caplog, STALL_LOG) == []
    outage = told(caplog, OUTAGE_LOG)
    assert [level for level, _ in outage] == [logging.WARNING, logging.WARNING], outage
