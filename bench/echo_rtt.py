"""Echo round-trip time through two real Hypercorn workers (issue 2's figure).

Starts Redis-backed `deskbridge-hub serve --workers 2` and a real sidecar process, then
times N `echo` calls three ways and prints median / p90 / max in milliseconds:

  http-new   POST /v1/users/{u}/jobs on a fresh HTTP connection each time (any worker)
  http-keep  the same on one keep-alive connection
  bridge     Bridge.call from this process straight over Redis (no HTTP hop)

Usage: .venv/bin/python bench/echo_rtt.py [--calls N]   (Redis at 127.0.0.1:6379)
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.procs import REDIS_URL, Hub, Sidecar, api, issue, running, wait_until  # noqa: E402


def summary(label: str, samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p90 = ms[int(len(ms) * 0.9) - 1]
    return (
        f"{label:<10} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   "
        f"p90 {p90:7.2f} ms   max {ms[-1]:7.2f} ms"
    )


async def bridge_calls(user: str, n: int) -> list[float]:
    from deskbridge_hub import Bridge, RedisSubstrate

    out = []
    async with RedisSubstrate.from_url(REDIS_URL) as substrate:
        bridge = Bridge(substrate)
        for i in range(n):
            t0 = time.perf_counter()
            result = await bridge.call(user, "echo", {"i": i}, timeout_s=10)
            out.append(time.perf_counter() - t0)
            assert result == {"i": i}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    n = parser.parse_known_args()[0].calls
    user = "bench-" + secrets.token_hex(4)
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp), workers=2)
        with running(hub):
            hub.wait_healthy()
            sidecar = Sidecar(Path(tmp), hub.ws, issue(user))
            with running(sidecar), api() as client:
                url = f"{hub.http}/v1/users/{user}"
                wait_until(lambda: client.get(url + "/presence").json()["online"], timeout_s=15)
                fresh, keep = [], []
                for i in range(n):
                    with api() as c:
                        t0 = time.perf_counter()
                        r = c.post(url + "/jobs", json={"name": "echo", "args": {"i": i}})
                        fresh.append(time.perf_counter() - t0)
                    assert r.json()["result"] == {"i": i}, r.text
                for i in range(n):
                    t0 = time.perf_counter()
                    r = client.post(url + "/jobs", json={"name": "echo", "args": {"i": i}})
                    keep.append(time.perf_counter() - t0)
                    assert r.json()["result"] == {"i": i}, r.text
                direct = trio.run(bridge_calls, user, n)
                print(f"echo round trip, 2 Hypercorn workers + Redis + 1 sidecar ({n} calls each)")
                print(summary("http-new", fresh))
                print(summary("http-keep", keep))
                print(summary("bridge", direct))
    return 0


if __name__ == "__main__":
    sys.exit(main())
