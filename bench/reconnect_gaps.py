"""Issue 16's minimal case: every connection cut some seconds after it connects ->
how long until the sidecar is back (its next hello accepted by the hub)?

One Redis-backed `deskbridge-hub serve --workers 1`, one real sidecar process dialling
through a TCP proxy in this process (``tests.chaos._harness.CuttableProxy``). Each cycle
waits until presence names a new session (the hub sets presence while it accepts the
hello, just before `welcome`), holds it ``--hold-s`` seconds (8 by default), then resets
the sidecar's end of the connection (the hub's end stays open and silent, like a Wi-Fi
switch) and polls presence every millisecond until it names the next session. Default
hub/sidecar timings (ping every 10 s, so an 8 s session never saw a ping).

Prints each gap and p50 / p99 / max. Before the healthy-session reset (issue 16 item 1)
the field saw gaps of 0.4, 0.7, 0.4, 6.9, 5.3, 10.9, 29.9, 5.9, 2.1, 1.3 s.

Usage: .venv/bin/python bench/reconnect_gaps.py [--cycles N] [--hold-s S]
       (Redis at 127.0.0.1:6379, or DESKBRIDGE_TEST_REDIS_URL)
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.chaos._harness import CuttableProxy  # noqa: E402
from tests.procs import REDIS_URL, Hub, RedisPoller, Sidecar, issue, running, wait_until  # noqa: E402

TARGET_S = 1.0


def cut_cycles(
    tmp: Path, *, cycles: int, hold_s: float, on_gap=None, env: dict[str, str] | None = None
) -> list[float]:
    """Run ``cycles`` cut-after-``hold_s`` cycles on real processes; returns the gaps in
    seconds (cut -> presence names the next session). ``on_gap(n, gap_s)`` is called
    after each."""
    user = "gaps-" + secrets.token_hex(4)
    gaps: list[float] = []
    hub = Hub(tmp, workers=1, env=env)
    with running(hub), RedisPoller(REDIS_URL) as poller:
        hub.wait_healthy()
        proxy = CuttableProxy(hub.port)
        sidecar = Sidecar(tmp, proxy.ws, issue(user), env=env)
        try:
            with running(sidecar):
                current = wait_until(lambda: poller.presence(user), timeout_s=30, what="online")
                for n in range(1, cycles + 1):
                    time.sleep(hold_s)
                    assert proxy.cut_client_side() >= 1
                    cut_at = time.perf_counter()
                    while True:
                        sid = poller.presence(user)
                        now = time.perf_counter()
                        if sid not in (None, current):
                            break
                        if now - cut_at > 60:
                            raise TimeoutError(f"cycle {n}: no new session within 60 s")
                        time.sleep(0.001)
                    gaps.append(now - cut_at)
                    current = sid
                    if on_gap is not None:
                        on_gap(n, now - cut_at)
        finally:
            proxy.close()
    return gaps


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--hold-s", type=float, default=8.0)
    args, _ = parser.parse_known_args()
    print(f"reconnect_gaps: {args.cycles} cycles, cut {args.hold_s:g} s after each connect")
    with tempfile.TemporaryDirectory() as tmp:
        gaps = cut_cycles(
            Path(tmp),
            cycles=args.cycles,
            hold_s=args.hold_s,
            on_gap=lambda n, g: print(f"  cycle {n:2d}: cut -> next hello {g * 1000:7.1f} ms"),
        )
    p50, p99 = quantile(gaps, 0.5), quantile(gaps, 0.99)
    print(
        f"cut->hello  p50 {p50 * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms   "
        f"max {max(gaps) * 1000:7.1f} ms   (target p99 < {TARGET_S * 1000:.0f} ms)"
    )
    return 0 if p99 < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
