"""The bench's caller process: runs one system's call path under a plan of phases and
prints one JSON document of figures (started by compare.py).

Systems and their call paths:
  deskbridge       ``Bridge.call`` over ``RedisSubstrate`` (trio), straight to Redis
  deskbridge-http  ``POST /v1/users/{u}/jobs`` on one keep-alive HTTP connection (trio, httpx)
  pubsub           :class:`bench.lib.pubsub_hub.PubSubCaller` (asyncio, redis-py)
  streams          :class:`bench.lib.streams_hub.StreamsCaller` (asyncio, redis-py)
  trio             :class:`bench.lib.trio_hub.TrioCaller` (trio, coredis)

The workload is written once with anyio and runs on trio (deskbridge, trio) or asyncio
(pubsub, streams).
Around each phase the :class:`bench.lib.measure.Meter` reads the hub's CPU from /proc and
Redis's INFO counters, so every figure covers exactly the calls of that phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.lib.measure import Meter, RedisInfo, connections_to, local_ports_to  # noqa: E402

Call = Callable[[str, dict], Awaitable[object]]


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    i = min(len(sorted_ms) - 1, max(0, int(round(q * len(sorted_ms) + 0.5)) - 1))
    return sorted_ms[i]


def latency(samples_s: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 0.50),
        "p99_ms": percentile(ms, 0.99),
        "max_ms": ms[-1] if ms else float("nan"),
    }


#: The first few distinct failures of the run, for the report (repr of the exception).
FAILURES: dict[str, int] = {}


def _failed(exc: BaseException) -> None:
    key = f"{type(exc).__name__}: {exc}"[:160]
    if key in FAILURES or len(FAILURES) < 10:
        FAILURES[key] = FAILURES.get(key, 0) + 1


async def sequential(call: Call, user: str, n: int) -> tuple[list[float], int]:
    out, errors = [], 0
    for i in range(n):
        t0 = time.perf_counter()
        try:
            result = await call(user, {"i": i})
            if result != {"i": i}:
                errors += 1
        except Exception as exc:  # noqa: BLE001 - counted and reported
            _failed(exc)
            errors += 1
        out.append(time.perf_counter() - t0)
    return out, errors


async def load(call: Call, users: list[str], callers: int, seconds: float):
    samples: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def one(k: int) -> None:
        nonlocal errors
        user = users[k % len(users)]
        i = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                result = await call(user, {"k": k, "i": i})
                if result != {"k": k, "i": i}:
                    errors += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                _failed(exc)
                errors += 1
            samples.append(time.perf_counter() - t0)
            i += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for k in range(callers):
            tg.start_soon(one, k)
    return samples, errors, time.perf_counter() - t0


def monitor_split(
    lines: list[str], caller_ports: set[int], hub_ports: set[int]
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Classify MONITOR lines: commands sent by the caller process, by the hub process,
    and run inside scripts (``[0 lua]``). Also counts *steps* per sender: a command, or
    a whole MULTI ... EXEC block of one client, is one step (a script is one step; its
    inner commands are under ``lua``). A pipeline without MULTI cannot be seen in
    MONITOR, so steps are an upper bound on round trips."""
    out: dict[str, dict[str, int]] = {"caller": {}, "hub": {}, "lua": {}, "other": {}}
    steps: dict[str, int] = {"caller": 0, "hub": 0, "other": 0}
    in_multi: set[str] = set()
    for line in lines:
        try:
            _, rest = line.split(" [", 1)
            where, rest = rest.split("] ", 1)
            name = rest.split(" ", 1)[0].strip('"').lower()
        except ValueError:
            continue
        if name in ("info", "monitor"):
            continue
        if where.endswith("lua"):
            role = "lua"
        else:
            port = int(where.rsplit(":", 1)[1])
            role = "caller" if port in caller_ports else "hub" if port in hub_ports else "other"
            if name == "multi":
                in_multi.add(where)
                steps[role] += 1
            elif name in ("exec", "discard"):
                in_multi.discard(where)
            elif where not in in_multi:
                steps[role] += 1
        out[role][name] = out[role].get(name, 0) + 1
    return out, steps


def last_call_timeline(lines: list[str], caller_ports: set[int], hub_ports: set[int]) -> list:
    """The MONITOR lines of the last call, from the caller's first command after its
    previous wait (BLPOP...) to the end, as (ms since that command, sender, command and
    first argument). MONITOR logs a blocking command when it is issued, not when it
    returns."""
    rows = []
    for line in lines:
        try:
            stamp, rest = line.split(" [", 1)
            where, rest = rest.split("] ", 1)
        except ValueError:
            continue
        if where.endswith("lua"):
            role = "lua"
        else:
            port = int(where.rsplit(":", 1)[1])
            role = "caller" if port in caller_ports else "hub" if port in hub_ports else "other"
        words = rest.split(" ")
        rows.append((float(stamp), role, " ".join(w.strip('"') for w in words[:2])))
    # the last call starts after the second-to-last caller command that waits for a
    # result; a caller that waits with no command (pub/sub: subscribed once) sends one
    # command per call, so its last call starts at its last command
    waits = [
        i
        for i, r in enumerate(rows)
        if r[1] == "caller"
        and r[2].split(" ")[0].lower() in ("blpop", "blmpop", "brpop", "subscribe")
    ]
    if len(waits) < 2:
        callers = [i for i, r in enumerate(rows) if r[1] == "caller"]
        waits = [callers[-1] - 1] * 2 if callers else []
    start = waits[-2] + 1 if len(waits) >= 2 else 0
    start = next((i for i in range(start, len(rows)) if rows[i][1] == "caller"), start)
    rows = rows[start:]
    if not rows:
        return []
    t0 = rows[0][0]
    return [(round((t - t0) * 1000, 3), role, cmd) for t, role, cmd in rows]


async def run_plan(call: Call, plan: dict, meter: Meter, http_call: Call | None) -> dict:
    from bench.lib.measure import group_pids

    users = plan["users"]
    results: dict = {}
    # warm-up: every user once (groups, pools), then a few sequential calls
    for u in users:
        await call(u, {"warm": 1})
    await sequential(call, users[0], 50)
    if http_call is not None:
        await sequential(http_call, users[0], 50)

    meter.start()
    await anyio.sleep(plan["idle_s"])
    idle = meter.stop(0)
    results["idle"] = {
        "redis_commands_per_s": idle["redis_commands"] / idle["elapsed_s"],
        "hub_cpu_pct": idle["hub_cpu_pct"],
        "redis_commands_by_name": idle["redis_commands_by_name"],
        "users": len(users),
    }

    meter.start()
    samples, errors = await sequential(call, users[0], plan["sequential"])
    results["sequential"] = {**latency(samples), "errors": errors, **meter.stop(len(samples))}

    if http_call is not None:
        meter.start()
        samples, errors = await sequential(http_call, users[0], plan["sequential"])
        results["sequential_http"] = {
            **latency(samples),
            "errors": errors,
            **meter.stop(len(samples)),
        }

    for u_count, c_count in plan["shapes"]:
        meter.start()
        samples, errors, elapsed = await load(call, users[:u_count], c_count, plan["load_s"])
        m = meter.stop(len(samples))
        results[f"load_{u_count}x{c_count}"] = {
            **latency(samples),
            "errors": errors,
            "jobs_per_s": len(samples) / elapsed,
            "caller_redis_connections_held": connections_to([os.getpid()], meter.info.port),
            **m,
        }

    if plan.get("monitor_calls"):
        from tests.procs import RedisMonitor

        hub_pids = group_pids(meter.hub_pgid)
        port = meter.info.port
        with RedisMonitor(f"redis://127.0.0.1:{port}/0") as mon:
            await anyio.sleep(0.2)
            mark = mon.mark()
            t0 = time.perf_counter()
            await sequential(call, users[0], plan["monitor_calls"])
            monitored_s = time.perf_counter() - t0 + 0.2 + 0.2  # the lines' window
            await anyio.sleep(0.2)
            lines = mon.lines(mark)
        caller_ports = local_ports_to([os.getpid()], port)
        hub_ports = local_ports_to(hub_pids, port)
        split, steps = monitor_split(lines, caller_ports, hub_ports)
        n = plan["monitor_calls"]
        results["monitor"] = {
            "calls": n,
            "seconds": monitored_s,
            "steps_per_call": {role: round(v / n, 2) for role, v in steps.items()},
            "last_call": last_call_timeline(lines, caller_ports, hub_ports),
            "per_call": {
                role: {k: round(v / n, 2) for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])}
                for role, cmds in split.items()
            },
            "per_call_total": {role: round(sum(c.values()) / n, 2) for role, c in split.items()},
        }
    results["failures"] = FAILURES
    return results


def deskbridge_main(args: argparse.Namespace, plan: dict, meter: Meter) -> dict:
    import httpx
    import trio
    from deskbridge_hub import Bridge, RedisSubstrate

    async def main() -> dict:
        async with RedisSubstrate.from_url(args.redis_url) as substrate:
            bridge = Bridge(substrate)

            async def call(user: str, payload: dict) -> object:
                return await bridge.call(user, "echo", payload, timeout_s=10)

            async with httpx.AsyncClient(
                headers={"Authorization": f"Bearer {os.environ['DESKBRIDGE_API_KEY']}"},
                timeout=30.0,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            ) as client:

                async def http_call(user: str, payload: dict) -> object:
                    r = await client.post(
                        f"{args.hub_http}/v1/users/{user}/jobs",
                        json={"name": "echo", "args": payload, "timeout_s": 10},
                    )
                    body = r.json()
                    if r.status_code != 200:
                        raise RuntimeError(body)
                    return body["result"]

                return await run_plan(call, plan, meter, http_call)

    return trio.run(main)


def peer_main(args: argparse.Namespace, plan: dict, meter: Meter) -> dict:
    import asyncio

    import redis.asyncio as aioredis

    from bench.lib.streams_hub import MAX_CONNECTIONS

    async def main() -> dict:
        redis = aioredis.Redis.from_url(
            args.redis_url, socket_timeout=None, max_connections=MAX_CONNECTIONS
        )
        if args.system == "pubsub":
            from bench.lib.pubsub_hub import PubSubCaller

            caller = PubSubCaller(redis)
        else:
            from bench.lib.streams_hub import StreamsCaller

            caller = StreamsCaller(redis)
        await caller.start()

        async def call(user: str, payload: dict) -> object:
            return await caller.call(user, "echo", payload, timeout_s=10)

        try:
            return await run_plan(call, plan, meter, None)
        finally:
            await caller.close()
            await redis.aclose()

    return asyncio.run(main())


def trio_peer_main(args: argparse.Namespace, plan: dict, meter: Meter) -> dict:
    import trio

    from bench.lib.trio_hub import TrioCaller, client

    async def main() -> dict:
        async with client(args.redis_url) as redis:
            caller = TrioCaller(redis)

            async def call(user: str, payload: dict) -> object:
                return await caller.call(user, "echo", payload, timeout_s=10)

            return await run_plan(call, plan, meter, None)

    return trio.run(main)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--system", choices=("deskbridge", "pubsub", "streams", "trio"), required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--redis-pid", type=int, required=True)
    p.add_argument("--hub-pgid", type=int, required=True)
    p.add_argument("--hub-http", default="")
    p.add_argument("--plan", required=True, help="JSON")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    plan = json.loads(args.plan)
    port = int(args.redis_url.rsplit(":", 1)[1].split("/")[0])
    info = RedisInfo(port)
    meter = Meter(info=info, hub_pgid=args.hub_pgid, redis_pid=args.redis_pid)
    if args.system == "deskbridge":
        results = deskbridge_main(args, plan, meter)
    elif args.system == "trio":
        results = trio_peer_main(args, plan, meter)
    else:
        results = peer_main(args, plan, meter)
    info.close()
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
