"""OS sleep notifications (``_sleep.watch_sleep_notifications``) with a stand-in for
``gdbus monitor``: a real child process printing what gdbus prints. Real time, bounded."""

from __future__ import annotations

import logging
import sys

import trio
from deskbridge_sidecar._sleep import PREPARE_FOR_SLEEP, watch_sleep_notifications

_MONITOR = f"""
import sys, time
print("/org/freedesktop/login1: org.freedesktop.login1.Manager.SessionNew ('3', '/x')")
print("/org/freedesktop/login1: {PREPARE_FOR_SLEEP.replace("true", "false")}")
print("/org/freedesktop/login1: {PREPARE_FOR_SLEEP}", flush=True)
sys.stdout.write("/org/freedesktop/login1: {PREPARE_FOR_SLEEP[:20]}")
sys.stdout.flush()
time.sleep(0.2)
sys.stdout.write("{PREPARE_FOR_SLEEP[20:]}\\n")
sys.stdout.flush()
time.sleep(60)
"""


async def test_each_prepare_for_sleep_true_line_is_a_notification():
    seen: list[float] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            def on_sleep() -> None:
                seen.append(trio.current_time())
                if len(seen) == 2:
                    nursery.cancel_scope.cancel()  # kills the monitor

            nursery.start_soon(
                lambda: watch_sleep_notifications(
                    on_sleep, command=[sys.executable, "-c", _MONITOR]
                )
            )
    assert len(seen) == 2  # "(true,)" twice (one split across writes); "(false,)" is a wake


async def test_a_missing_monitor_is_one_info_line_not_a_failure(caplog):
    caplog.set_level(logging.INFO, logger="deskbridge")
    with trio.fail_after(5):
        await watch_sleep_notifications(lambda: None, command=["no-such-gdbus-here"])
    assert "no no-such-gdbus-here: no OS sleep notifications" in caplog.text


async def test_a_monitor_that_exits_ends_the_watch(caplog):
    caplog.set_level(logging.INFO, logger="deskbridge")
    with trio.fail_after(10):
        await watch_sleep_notifications(lambda: None, command=[sys.executable, "-c", "pass"])
    assert "monitor" in caplog.text and "exited" in caplog.text
