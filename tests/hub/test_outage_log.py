"""A Redis outage is told once, whoever meets it (``_outage``): one WARNING when it
starts, a summary every 60 s (for how long, how many attempts, what is waiting), one
WARNING when Redis is back; each retry at DEBUG. Was: a WARNING per retry of every held
write (``retrying``) and an INFO per retry of every read loop, every 2 s for as long as
Redis was down. MockClock (autojump), no real sleeps."""

from __future__ import annotations

import logging

import pytest
import trio
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._outage import REOPEN_QUIET_S, SUMMARY_EVERY_S, OutageLog, outage_log
from deskbridge_hub._retry import retrying

OUTAGE_LOG = "deskbridge.hub.outage"
RETRY_LOG = "deskbridge.hub.retry"


def told(caplog: pytest.LogCaptureFixture, name: str = OUTAGE_LOG) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == name]


def down() -> SubstrateUnavailable:
    return SubstrateUnavailable("Redis at h:1 unavailable (x): refused")


def test_the_summary_interval_and_the_quiet_reopen_window() -> None:
    assert (SUMMARY_EVERY_S, REOPEN_QUIET_S) == (60.0, 2.0)


async def test_one_warning_a_summary_a_minute_and_one_when_back(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)
    log = OutageLog()
    for i in range(130):  # one failure a second for 130 s, from three kinds of loop
        log.failed(f"finish job{i % 3}", down())
        if i % 10 == 0:
            log.failed("heartbeat", down())
        await trio.sleep(1)
    assert log.down
    log.succeeded()
    assert not log.down
    lines = told(caplog)
    assert [level for level, _ in lines] == [logging.WARNING] * 4
    assert lines[0][1] == (
        "Redis unavailable: finish job0 failed: Redis at h:1 unavailable (x): refused; "
        "retrying (each retry at DEBUG, a summary every 60 s)"
    )
    assert lines[1][1] == (
        "Redis still unavailable after 60 s: 67 failed attempts; waiting: 3 x finish, "
        "heartbeat; last error: Redis at h:1 unavailable (x): refused"
    )
    assert lines[2][1].startswith("Redis still unavailable after 120 s: 133 failed attempts")
    assert lines[3][1] == (
        "Redis available again after 130.0 s (143 failed attempts; waiting: 3 x finish, "
        "heartbeat)"
    )


async def test_a_success_with_no_outage_says_nothing(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)
    log = OutageLog()
    log.succeeded()
    assert told(caplog) == [] and not log.down


async def test_an_attempt_failing_just_after_the_return_reopens_it_quietly(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)
    log = OutageLog()
    log.failed("wake-up wait", down())
    await trio.sleep(5)
    log.succeeded()
    await trio.sleep(REOPEN_QUIET_S / 2)
    log.failed("XACK 1-0", down())  # in flight when Redis returned
    log.succeeded()
    assert [level for level, _ in told(caplog)] == [
        logging.WARNING, logging.WARNING, logging.DEBUG, logging.DEBUG,
    ]  # fmt: skip
    await trio.sleep(REOPEN_QUIET_S)  # a failure later than that is a new outage
    log.failed("XACK 1-0", down())
    assert told(caplog)[-1][0] == logging.WARNING


async def test_a_quiet_reopening_that_lasts_is_announced_by_its_summary(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)
    log = OutageLog()
    log.failed("heartbeat", down())
    log.succeeded()
    log.failed("heartbeat", down())  # quiet
    await trio.sleep(SUMMARY_EVERY_S)
    log.failed("heartbeat", down())
    log.succeeded()
    assert [level for level, _ in told(caplog)][2:] == [
        logging.DEBUG, logging.WARNING, logging.WARNING,
    ]  # fmt: skip


async def test_held_writes_retry_at_debug_and_the_outage_is_told_once(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger=RETRY_LOG)
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)
    attempts = 0

    async def finish() -> str:
        nonlocal attempts
        attempts += 1
        if attempts <= 12:
            raise down()
        return "done"

    assert await retrying(finish, what="finish j1") == "done"
    retries = told(caplog, RETRY_LOG)
    assert len(retries) == 12 and {level for level, _ in retries} == {logging.DEBUG}
    outage = told(caplog)
    assert [level for level, _ in outage] == [logging.WARNING, logging.WARNING]
    assert outage[0][1].startswith("Redis unavailable: finish j1 failed: ")
    assert outage[1][1].startswith("Redis available again after ")


def test_each_event_loop_run_has_its_own_outage() -> None:
    async def fail_once() -> bool:
        outage_log().failed("heartbeat", down())
        return outage_log().down

    async def is_down() -> bool:
        return outage_log().down

    assert trio.run(fail_once) is True
    assert trio.run(is_down) is False  # a later run (another clock) starts clean


async def test_any_success_ends_it_also_one_that_never_failed(autojump_clock, caplog):
    # a held write cancelled mid-outage (its session ended) never succeeds: the next
    # success of anything else in the run must end the outage
    caplog.set_level(logging.DEBUG, logger=OUTAGE_LOG)

    async def refused() -> None:
        raise down()

    async def fine() -> str:
        return "ok"

    with trio.move_on_after(1):
        await retrying(refused, what="XACK 1-0")
    assert outage_log().down
    assert await retrying(fine, what="finish j2") == "ok"
    assert not outage_log().down
    assert [text.split(" after ")[0] for _, text in told(caplog)][-1] == "Redis available again"


async def test_a_success_with_nothing_down_does_not_look_the_run_up(autojump_clock, monkeypatch):
    # retrying() and the read loops end the outage on every success: a RunVar lookup
    # costs microseconds, per job (issue 10), so it happens only while a run is down
    from deskbridge_hub import _outage

    looked: list[int] = []
    monkeypatch.setattr(_outage, "outage_log", lambda: looked.append(1) or OutageLog())
    monkeypatch.setattr(_outage, "_down", 0)
    _outage.succeeded()
    assert looked == []
    monkeypatch.setattr(_outage, "_down", 1)
    _outage.succeeded()
    assert looked == [1]
