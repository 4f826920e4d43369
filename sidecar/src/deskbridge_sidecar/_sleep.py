"""Sleep awareness on the desktop (issue 12.6): say so before the machine sleeps, and
say how long it slept when it is back.

* Before: :meth:`Daemon.going_to_sleep` (an embedder, or the OS notification below)
  sends ``sleeping`` and closes the socket with 1000, so the hub reads the desktop
  ``asleep`` at once (not online until its pings time out, then a bare ``offline``). The
  daemon then waits for the wake-up (:func:`wait_for_wake`: the clock watchdog's gap) at
  most ``SLEEP_PAUSE_S`` before it reconnects, so a sleep that never came does not
  leave the desktop away for long.
* After: the watchdog's gap (``_watchdog``) is sent as ``hello.slept_s`` on the next
  connection; the hub reads the desktop ``asleep`` if its socket goes missing again
  soon after (docs/outcomes.md, "Asleep").
* OS notification, best effort and Linux only: systemd-logind's ``PrepareForSleep``
  signal, read from ``gdbus monitor`` (part of GLib, installed on most desktops) as a
  child process: no D-Bus library to ship. Without gdbus (or logind, or a system bus)
  the watcher logs one INFO line and returns; the watchdog still reports the sleep
  afterwards. logind suspends without waiting for us unless a delay inhibitor is held,
  so ``sleeping`` may not reach the hub before the suspend: then the hub sees the ping
  timeout, and the wake-up's ``slept_s`` as usual. macOS and Windows notifications
  (IOKit, WM_POWERBROADCAST) need native bindings: not done.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence

import trio

from ._watchdog import watch_clocks

log = logging.getLogger("deskbridge.sidecar.sleep")

#: After ``sleeping`` is sent, the longest wait for the machine to sleep before
#: reconnecting anyway, seconds (an OS asks apps to get ready well within a minute:
#: logind's default InhibitDelayMaxSec is 5 s).
SLEEP_PAUSE_S = 60.0
#: ``gdbus monitor`` on logind's manager object (the ``PrepareForSleep`` signal).
GDBUS_MONITOR = (
    "gdbus", "monitor", "--system", "--dest", "org.freedesktop.login1",
    "--object-path", "/org/freedesktop/login1",
)  # fmt: skip
#: Longest monitor output line kept while waiting for its end, bytes.
MAX_LINE_BYTES = 65536
#: The line gdbus prints when the machine is about to sleep.
PREPARE_FOR_SLEEP = "org.freedesktop.login1.Manager.PrepareForSleep (true,)"


async def wait_for_wake(
    *,
    pause_s: float,
    interval_s: float,
    gap_s: float,
    wall_clock: Callable[[], float],
) -> float | None:
    """Wait for the machine to sleep and wake up again, at most ``pause_s``.

    Args:
        pause_s: the longest wait, seconds (``SLEEP_PAUSE_S``).
        interval_s, gap_s: the clock watchdog's interval and tolerated gap, seconds.
        wall_clock: Unix time source, seconds.

    Returns:
        How long it slept (the watchdog's gap, seconds), or None if no gap was seen
        within ``pause_s`` (the sleep did not happen).

    Cancellation: nothing to clean up.
    """
    with trio.move_on_after(pause_s):
        gap = await watch_clocks(interval_s=interval_s, gap_s=gap_s, wall_clock=wall_clock)
        log.info("woke up after %.1f s asleep", gap.gap_s)
        return gap.gap_s
    log.info("no sleep within %g s of the notification; reconnecting", pause_s)
    return None


async def watch_sleep_notifications(
    on_sleep: Callable[[], object], *, command: Sequence[str] = GDBUS_MONITOR
) -> None:
    """Call ``on_sleep`` whenever the OS says it is about to sleep (best effort).

    Args:
        on_sleep: called (on the event loop, must not block) for each notification.
        command: the monitor to run (default ``gdbus monitor`` on logind); each line of
            its output ending in :data:`PREPARE_FOR_SLEEP` is a notification.

    Returns:
        When the monitor is missing or exits (one INFO line says so): notifications are
        a convenience, never a reason to stop the daemon.

    Cancellation: the monitor process is killed.
    """
    if shutil.which(command[0]) is None:
        log.info("no %s: no OS sleep notifications (the watchdog still notices)", command[0])
        return
    try:
        proc = await trio.lowlevel.open_process(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
    except OSError as exc:
        log.info("cannot watch OS sleep notifications (%s)", exc)
        return
    try:
        assert proc.stdout is not None
        buffer = b""
        async for chunk in proc.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.decode("utf-8", "replace").strip().endswith(PREPARE_FOR_SLEEP):
                    log.info("the OS says it is about to sleep")
                    on_sleep()
            if len(buffer) > MAX_LINE_BYTES:  # a line that long is not the signal
                buffer = b""
    finally:
        proc.kill()
        with trio.move_on_after(1.0, shield=True):
            await proc.wait()
    log.info("the OS sleep notification monitor (%s) exited", command[0])


__all__ = [
    "GDBUS_MONITOR",
    "PREPARE_FOR_SLEEP",
    "SLEEP_PAUSE_S",
    "wait_for_wake",
    "watch_sleep_notifications",
]
