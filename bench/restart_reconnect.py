"""Graceful restart: SIGTERM to the hub worker holding the socket -> the sidecar's next
accepted hello (issue 4's figure; the field figure to beat is ~22 s).

Starts Redis-backed `deskbridge-hub serve --workers 2` and a real sidecar process, then
runs N cycles: find the worker holding the sidecar's socket (presence names the session,
the hub log names the worker's pid), SIGTERM it, and poll the presence key on Redis every
millisecond until it names a new session (the hub sets presence while it accepts the
hello, before it answers welcome). Between cycles it waits for Hypercorn's replacement
worker. Prints per cycle and median / worst of:

  sigterm->hello   SIGTERM sent -> presence names the new session (the figure)
  1012->welcome    the sidecar's log: close 1012 received -> welcome of the next session
  offline          how long presence read "offline" in between (0: never)

Usage: .venv/bin/python bench/restart_reconnect.py [--cycles N]   (Redis at 127.0.0.1:6379)
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.procs import (  # noqa: E402
    Hub,
    RedisPoller,
    Sidecar,
    issue,
    log_text,
    running,
    session_pid,
    wait_until,
    worker_pids,
)

TARGET_S = 1.0
FIELD_S = 22.0


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _sidecar_gap(sidecar: Sidecar, new_sid: str) -> float | None:
    """Seconds from the last 1012 close before ``new_sid``'s welcome to that welcome."""
    text = log_text(sidecar)
    welcome = re.search(rf"^(\S+ \S+) .*welcomed by hub: session {new_sid}", text, re.M)
    if welcome is None:
        return None
    closes = re.findall(
        r"^(\S+ \S+) .*disconnected from hub \(closed, code 1012", text[: welcome.start()], re.M
    )
    return _stamp(welcome.group(1)) - _stamp(closes[-1]) if closes else None


def cycle(hub: Hub, sidecar: Sidecar, poller: RedisPoller, user: str) -> tuple[float, ...]:
    old = wait_until(lambda: poller.presence(user), timeout_s=30, what="online")
    holder = session_pid(hub, old)
    offline_since = None
    offline_s = 0.0
    t0 = time.perf_counter()
    os.kill(holder, signal.SIGTERM)
    deadline = t0 + 60
    while True:
        now_sid = poller.presence(user)
        now = time.perf_counter()
        if now_sid is None:
            offline_since = offline_since or now
        elif offline_since is not None:
            offline_s += now - offline_since
            offline_since = None
        if now_sid not in (None, old):
            break
        if now > deadline:
            raise TimeoutError("no new session within 60 s")
        time.sleep(0.001)
    took = now - t0
    try:  # the sidecar logs the welcome just after the hub set presence
        gap = wait_until(lambda: _sidecar_gap(sidecar, now_sid), timeout_s=5, what="welcome")
    except TimeoutError:
        gap = None
    # let the old worker go and the replacement come up before the next cycle
    wait_until(
        lambda: len(worker_pids(hub)) == 2 and holder not in worker_pids(hub),
        timeout_s=30,
        what="replacement worker",
    )
    return took, (gap if gap is not None else float("nan")), offline_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    args, _ = parser.parse_known_args()
    user = "bench-" + secrets.token_hex(4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, RedisPoller() as poller:
        hub = Hub(Path(tmp), workers=2)
        with running(hub):
            hub.wait_healthy()
            wait_until(lambda: len(worker_pids(hub)) == 2, timeout_s=20, what="2 workers")
            sidecar = Sidecar(Path(tmp), hub.ws, issue(user))
            with running(sidecar):
                print(f"restart_reconnect: {args.cycles} cycles, 2 workers, Redis-backed")
                for n in range(1, args.cycles + 1):
                    took, gap, offline = cycle(hub, sidecar, poller, user)
                    rows.append((took, gap, offline))
                    print(
                        f"  cycle {n:2d}: sigterm->hello {took * 1000:7.1f} ms   "
                        f"1012->welcome {gap * 1000:7.1f} ms   offline {offline * 1000:6.1f} ms"
                    )
                text = log_text(sidecar)
    took = [r[0] for r in rows]
    gaps = [r[1] for r in rows if r[1] == r[1]]
    offline = [r[2] for r in rows]
    quick = text.count("quick retry")
    print(
        f"sigterm->hello  median {statistics.median(took) * 1000:7.1f} ms   "
        f"worst {max(took) * 1000:7.1f} ms   (target < {TARGET_S * 1000:.0f} ms; "
        f"field ~{FIELD_S:.0f} s)"
    )
    if gaps:
        print(
            f"1012->welcome   median {statistics.median(gaps) * 1000:7.1f} ms   "
            f"worst {max(gaps) * 1000:7.1f} ms"
        )
    print(
        f"offline window  median {statistics.median(offline) * 1000:7.1f} ms   "
        f"worst {max(offline) * 1000:7.1f} ms   quick retries used: {quick}"
    )
    verdict = "meets" if max(took) < TARGET_S else "does NOT meet"
    print(f"worst {max(took) * 1000:.1f} ms {verdict} the target of {TARGET_S * 1000:.0f} ms")
    return 0  # a bench prints figures; it is not a test


if __name__ == "__main__":
    sys.exit(main())
