"""What one `Bridge.call` costs the hub and the caller, and the same for another checkout
run back to back (issue 10: a before/after that the machine's drift cannot fake).

One private ``redis-server``, one ``deskbridge-hub serve --workers 1`` and one fake desktop
(``bench/lib/desktop.py``: real v1 frames, echo answered at once); this process calls
``Bridge.call(user, "echo", ...)`` on trio, after a warm-up, in two shapes:

  seq    ``--calls`` calls one after another: p50 latency, hub CPU ms per call (the
         hub's ``/proc/<pid>/stat``), caller CPU ms per call (``time.process_time``)
  http   ``--calls`` of the same call one after another as ``POST /v1/users/{u}/jobs``
         (wait) over one keep-alive HTTP connection: the same figures; "HTTP adds" is its
         hub CPU per call minus seq's (issue 10's "HTTP adds <= 1 ms of hub CPU")
  conc   ``--calls`` calls from ``--concurrency`` tasks to the same user: jobs/s and the
         same CPU figures

With ``--baseline DIR`` (another checkout of this repository, e.g. ``git worktree add
/tmp/base <commit>``) each run is a *pair*: the baseline (its ``hub/src`` and
``common/src`` first on ``PYTHONPATH``, for this process and the hub it starts), then this
checkout, ``--pairs`` times, interleaved. On a shared 2-core machine whose speed drifts by
2x within minutes, only figures taken back to back compare.

Usage: ./dev bench call_cost [--calls 3000] [--concurrency 64] [--pairs 3]
       [--baseline DIR] [--redis-port 6415] [--hub-port PORT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One run in this process (the code on ``sys.path`` is the code measured)."""
    import secrets

    import trio

    from bench.compare import start_desktops, start_hub
    from bench.lib.measure import cpu_s, group_pids, start_private_redis

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-call-cost-") as tmp:
        redis = start_private_redis(Path(tmp), args.redis_port, "redis-call-cost")
        procs = [redis]
        try:
            hub, ws, http = start_hub("deskbridge", Path(tmp), redis.url, port=args.hub_port)
            procs.append(hub)
            prefix = f"c{secrets.token_hex(2)}-"
            desktops, _ = start_desktops(Path(tmp), ws, prefix, 1)
            procs.append(desktops)
            user = f"{prefix}00000"
            hub_pids = group_pids(hub.pid)

            async def main() -> None:
                import httpx
                from deskbridge_hub import Bridge, RedisSubstrate

                from tests.procs import API_KEY

                async with (
                    RedisSubstrate.from_url(redis.url) as substrate,
                    httpx.AsyncClient(
                        headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=30.0,
                        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                    ) as client,
                ):
                    bridge = Bridge(substrate)
                    job = {"name": "echo", "args": {"i": 1}, "timeout_s": 10}

                    async def bridge_call() -> None:
                        await bridge.call(user, "echo", {"i": 1}, timeout_s=10)

                    async def http_call() -> None:
                        r = await client.post(f"{http}/v1/users/{user}/jobs", json=job)
                        if r.status_code != 200:
                            raise RuntimeError(f"HTTP {r.status_code}: {r.text}")

                    for _ in range(200):
                        await bridge_call()
                        await http_call()
                    shapes = (("seq", 1, bridge_call), ("http", 1, http_call))
                    for shape, tasks, call in (*shapes, ("conc", args.concurrency, bridge_call)):
                        per_task = args.calls // tasks
                        latencies: list[float] = []

                        async def worker(
                            n: int, lat: list[float] = latencies, call: Any = call
                        ) -> None:
                            for _ in range(n):
                                t0 = time.perf_counter()
                                await call()
                                lat.append(time.perf_counter() - t0)

                        hub0, own0, t0 = cpu_s(hub_pids), time.process_time(), time.perf_counter()
                        async with trio.open_nursery() as nursery:
                            for _ in range(tasks):
                                nursery.start_soon(worker, per_task)
                        wall = time.perf_counter() - t0
                        n = per_task * tasks
                        latencies.sort()
                        out[shape] = {
                            "p50_ms": latencies[n // 2] * 1000,
                            "hub_cpu_ms": (cpu_s(hub_pids) - hub0) / n * 1000,
                            "caller_cpu_ms": (time.process_time() - own0) / n * 1000,
                            "jobs_per_s": n / wall,
                        }

            trio.run(main)
        finally:
            for proc in reversed(procs):
                proc.stop(timeout_s=5)
    return out


def _run(args: argparse.Namespace, checkout: Path | None) -> dict[str, dict[str, float]]:
    env = dict(os.environ)
    if checkout is not None:
        paths = [str(checkout / "hub" / "src"), str(checkout / "common" / "src")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [sys.executable, __file__, "--child", *sys.argv[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _line(label: str, r: dict[str, dict[str, float]]) -> str:
    s, h, c = r["seq"], r["http"], r["conc"]
    return (
        f"{label:<9} seq p50 {s['p50_ms']:6.3f} ms  hub {s['hub_cpu_ms']:6.3f}  caller "
        f"{s['caller_cpu_ms']:6.3f} ms/call | http p50 {h['p50_ms']:6.3f} ms  HTTP adds "
        f"{h['hub_cpu_ms'] - s['hub_cpu_ms']:+6.3f} ms | conc {c['jobs_per_s']:6.0f} jobs/s  "
        f"hub {c['hub_cpu_ms']:6.3f}  caller {c['caller_cpu_ms']:6.3f} ms/call"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000, help="calls per shape (default 3000)")
    p.add_argument("--concurrency", type=int, default=64, help="tasks in the conc shape")
    p.add_argument("--pairs", type=int, default=3, help="runs (pairs with --baseline)")
    p.add_argument("--baseline", default="", metavar="DIR", help="another checkout to pair")
    p.add_argument("--redis-port", type=int, default=6415)
    p.add_argument("--hub-port", type=int, default=None, help="the hub's (default: a free one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    baseline = Path(args.baseline).resolve() if args.baseline else None
    if baseline is not None and not (baseline / "hub" / "src" / "deskbridge_hub").is_dir():
        p.error(f"--baseline {args.baseline}: not a checkout of this repository")
    print(
        f"call_cost: {args.calls} calls per shape, conc = {args.concurrency} tasks to one "
        f"user, one hub process; load average {os.getloadavg()[0]:.2f}, "
        f"{os.cpu_count()} CPUs"
    )
    for i in range(args.pairs):
        if baseline is not None:
            print(_line(f"{i + 1} base", _run(args, baseline)), flush=True)
        print(_line(f"{i + 1} this", _run(args, None)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
