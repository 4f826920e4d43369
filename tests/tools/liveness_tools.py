"""Tools for the liveness suite and the benches (``--tools liveness_tools``).

``spin`` is CPU-bound and synchronous: a busy loop that holds the GIL except when the
interpreter's switch interval forces it to yield. It runs in a worker thread (every
plain ``def`` tool does), so it must not starve the task that reads the socket: pongs,
status and the close handshake. ``block`` is a synchronous tool that blocks its thread
without using the CPU (``time.sleep``), the shape of a blocking browser driver call.
"""

from __future__ import annotations

import time

from deskbridge_sidecar import tool


@tool(description="Busy-loop on the CPU for SECONDS (sync, in a worker thread).")
def spin(seconds: float) -> dict:
    started = time.monotonic()
    end = started + seconds
    loops = 0
    while time.monotonic() < end:
        loops += 1
    return {"spun_s": round(time.monotonic() - started, 3), "loops": loops}


@tool(description="Block the worker thread for SECONDS (time.sleep).")
def block(seconds: float) -> dict:
    started = time.monotonic()
    time.sleep(seconds)
    return {"blocked_s": round(time.monotonic() - started, 3)}
