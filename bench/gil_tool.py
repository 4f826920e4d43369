"""A tool that holds the GIL in one long C call (``sum(range(n))``): ``status`` latency
and presence while it runs, in its own process (``@isolated``) vs in a worker thread.

One Redis-backed `deskbridge-hub serve --workers 1` (ping every 1 s, deadline 2 s,
heartbeat 1 s, presence TTL 3 s: the chaos suite's timings), one sidecar with
``tests/tools/gil_tools.py``. For each mode it starts the tool, then until it answers:
``POST /v1/users/{u}/status`` every 50 ms on one keep-alive connection, and the presence
key read from Redis at the same pace. Prints status p50 / p99 / max, presence flaps
(reads naming no session or another one), sessions the sidecar opened, and the tool's
own duration.

Usage: .venv/bin/python bench/gil_tool.py [--n N]   (Redis at 127.0.0.1:6379, or
       DESKBRIDGE_TEST_REDIS_URL)
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.chaos._harness import TIMINGS, headers, post_job, wait_online  # noqa: E402
from tests.procs import REDIS_URL, Hub, RedisPoller, Sidecar, issue, running  # noqa: E402


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(tmp: Path, tool: str, n: int) -> None:
    user = "gil-" + secrets.token_hex(4)
    hub = Hub(tmp, workers=1, env=TIMINGS)
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp, hub.ws, issue(user), tools=["gil_tools"], env=TIMINGS)
        with running(sidecar), RedisPoller(REDIS_URL) as poller, ThreadPoolExecutor(1) as pool:
            session = wait_online(hub.http, user)
            started = time.perf_counter()
            job = pool.submit(post_job, hub.http, user, tool, {"n": n}, timeout_s=300)
            latencies, flaps = [], 0
            with httpx.Client(headers=headers(), timeout=30) as client:
                url = f"{hub.http}/v1/users/{user}/status"
                while not job.done():
                    if poller.presence(user) != session:
                        flaps += 1
                    t0 = time.perf_counter()
                    client.post(url)
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(0.05)
            answer = job.result()
            took = time.perf_counter() - started
            sessions = sidecar.output().count("welcomed by hub")
    print(
        f"  {tool:12s} {answer.status:10s} tool {took:5.1f} s   status n={len(latencies):3d} "
        f"p50 {statistics.median(latencies) * 1000:7.1f} ms  p99 "
        f"{quantile(latencies, 0.99) * 1000:7.1f} ms  max {max(latencies) * 1000:7.1f} ms   "
        f"presence flaps {flaps:3d}   sessions {sessions}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300_000_000)
    args, _ = parser.parse_known_args()
    print(f"gil_tool: sum(range({args.n:_})) while status is polled every 50 ms")
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp), "crunch", args.n)  # @isolated: its own process
        measure(Path(tmp), "crunch_here", args.n)  # a worker thread of the sidecar
    return 0


if __name__ == "__main__":
    sys.exit(main())
