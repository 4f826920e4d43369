"""A tool that records every execution, for the chaos suite (``--tools counting_tools``).

Each execution appends one JSON line to the file named by ``DESKBRIDGE_TEST_LEDGER``
(O_APPEND, one ``write`` per line, so lines from any number of processes never
interleave): ``{"event": "start", "key", "pid", "t"}`` when the tool starts and
``{"event": "end", ...}`` when it returns. Counting ``start`` lines per key is the
"executed exactly once" oracle; it does not depend on anything the sidecar reports.
"""

from __future__ import annotations

import json
import os
import time

import trio
from deskbridge_sidecar import tool

LEDGER_ENV = "DESKBRIDGE_TEST_LEDGER"


def _append(event: str, key: str, t: float) -> None:
    path = os.environ[LEDGER_ENV]
    line = json.dumps({"event": event, "key": key, "pid": os.getpid(), "t": t}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@tool(side_effects=True, description="Append KEY to the test ledger, then sleep SECONDS.")
async def record(key: str, seconds: float = 0.0) -> dict:
    started = time.time()
    _append("start", key, started)
    await trio.sleep(seconds)
    _append("end", key, time.time())
    return {"key": key, "pid": os.getpid(), "started": started}


@tool(side_effects=True, description="As record, in a worker thread: a cancel cannot stop it.")
def record_sync(key: str, seconds: float = 0.0) -> dict:
    started = time.time()
    _append("start", key, started)
    time.sleep(seconds)
    _append("end", key, time.time())
    return {"key": key, "pid": os.getpid(), "started": started}
