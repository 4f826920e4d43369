"""What one Redis command costs the client process, per client library and event loop.

Issue 10 asks for hub CPU <= 0.8 ms per call with the call's Redis round trips, and says:
if coredis blocks a goal, show why with a reproduction. This is that reproduction, without
deskbridge in it: the same `GET` of a 16-byte value against a private ``redis-server`` on
loopback, from a fresh process per client, in two shapes:

  seq    ``--n`` commands one after another on one connection: wall p50 / p99 per command
         (the round trip) and the client process's CPU per command (``time.process_time``:
         user + system of the process, which is single-threaded here; Redis is another
         process and not counted)
  conc   ``--n`` commands from ``--concurrency`` tasks at once: commands/s and CPU per
         command (what a busy hub pays)

Clients (each in its own process, so imports and caches do not mix):

  deskbridge        the hub's own path: ``RedisSubstrate``'s session (coredis connections
                    hosted by deskbridge, ``_redis_session``) under trio, one GET per call
  coredis-trio      coredis (the pinned version) under trio, through ``coredis.Redis``
  coredis-asyncio   the same under asyncio (anyio's asyncio backend)
  redis-py-asyncio  redis-py's asyncio client (``redis.asyncio.Redis``, pure-Python parser)
  raw-trio          a minimal RESP GET over a trio socket: the floor for any trio client
  raw-asyncio       the same over asyncio streams

Usage: ./dev bench client_cost [--n 20000] [--concurrency 64] [--redis-port 6413]
       [--clients a,b,...] [--json FILE]
Prints one line per client and the ratios to redis-py-asyncio. Figures are CPU per command,
so they hold on a loaded machine better than wall times; run twice to see the spread.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.measure import start_private_redis  # noqa: E402

CLIENTS = (
    "deskbridge",
    "coredis-trio",
    "coredis-asyncio",
    "redis-py-asyncio",
    "raw-trio",
    "raw-asyncio",
)
_GET = b"*2\r\n$3\r\nGET\r\n$5\r\nbench\r\n"
_VALUE = b"0123456789abcdef"
_REPLY = b"$16\r\n" + _VALUE + b"\r\n"


async def _measure(
    one: Callable[[], Awaitable[object]],
    spawn: Callable[[int, Callable[[], Awaitable[None]]], Awaitable[None]],
    n: int,
    concurrency: int,
) -> dict[str, float]:
    """Run the two shapes with ``one`` (a single GET) and ``spawn(k, body)`` (k tasks)."""
    for _ in range(500):  # warm-up: connections open, code paths hot
        await one()
    rtts: list[float] = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await one()
        rtts.append(time.perf_counter() - t0)
    seq_cpu = time.process_time() - cpu0
    per_task = n // concurrency

    async def body() -> None:
        for _ in range(per_task):
            await one()

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await spawn(concurrency, body)
    wall = time.perf_counter() - t0
    conc_cpu = time.process_time() - cpu0
    done = per_task * concurrency
    profile = cProfile.Profile()  # Python function calls per command: load-independent
    profile.enable()
    for _ in range(1000):
        await one()
    profile.disable()
    calls = sum(stat[1] for stat in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]
    rtts.sort()
    return {
        "calls_per_cmd": calls / 1000,
        "seq_p50_us": statistics.median(rtts) * 1e6,
        "seq_p99_us": rtts[int(len(rtts) * 0.99)] * 1e6,
        "seq_cpu_us": seq_cpu / n * 1e6,
        "conc_per_s": done / wall,
        "conc_cpu_us": conc_cpu / done * 1e6,
    }


def _child_coredis(backend: str, port: int, n: int, concurrency: int) -> dict[str, float]:
    import anyio
    import coredis

    async def main() -> dict[str, float]:
        client = coredis.Redis(host="127.0.0.1", port=port, max_connections=concurrency)
        async with client:
            await client.set("bench", _VALUE)

            async def one() -> object:
                return await client.get("bench")

            async def spawn(k: int, body: Callable[[], Awaitable[None]]) -> None:
                async with anyio.create_task_group() as tg:
                    for _ in range(k):
                        tg.start_soon(body)

            return await _measure(one, spawn, n, concurrency)

    result: dict[str, float] = anyio.run(main, backend=backend)
    return result


def _child_deskbridge(port: int, n: int, concurrency: int) -> dict[str, float]:
    import trio
    from deskbridge_hub._redis import RedisSubstrate

    async def main() -> dict[str, float]:
        substrate = RedisSubstrate(f"redis://127.0.0.1:{port}/0")
        async with substrate:

            async def one() -> object:
                async with substrate._session("GET") as s:
                    return await substrate._call(s, b"GET", b"bench")

            async def spawn(k: int, body: Callable[[], Awaitable[None]]) -> None:
                async with trio.open_nursery() as nursery:
                    for _ in range(k):
                        nursery.start_soon(body)

            return await _measure(one, spawn, n, concurrency)

    result: dict[str, float] = trio.run(main)
    return result


def _child_redis_py(port: int, n: int, concurrency: int) -> dict[str, float]:
    import asyncio

    import redis.asyncio as aredis

    async def main() -> dict[str, float]:
        client = aredis.Redis(host="127.0.0.1", port=port, max_connections=concurrency)
        await client.set("bench", _VALUE)

        async def one() -> object:
            return await client.get("bench")

        async def spawn(k: int, body: Callable[[], Awaitable[None]]) -> None:
            await asyncio.gather(*(body() for _ in range(k)))

        try:
            return await _measure(one, spawn, n, concurrency)
        finally:
            await client.aclose()

    return asyncio.run(main())


def _child_raw_trio(port: int, n: int, concurrency: int) -> dict[str, float]:
    import trio

    async def main() -> dict[str, float]:
        socks: list[trio.SocketStream] = []
        for _ in range(concurrency + 1):
            socks.append(await trio.open_tcp_stream("127.0.0.1", port))
        await socks[0].send_all(b"*3\r\n$3\r\nSET\r\n$5\r\nbench\r\n$16\r\n" + _VALUE + b"\r\n")
        await socks[0].receive_some(64)
        free = socks[1:]

        async def get(sock: trio.SocketStream) -> bytes:
            await sock.send_all(_GET)
            data = b""
            while len(data) < len(_REPLY):
                data += await sock.receive_some(4096)
            return data

        async def one() -> object:
            return await get(socks[0])

        async def spawn(k: int, body: Callable[[], Awaitable[None]]) -> None:
            async def each(sock: trio.SocketStream) -> None:
                for _ in range(n // concurrency):
                    await get(sock)

            async with trio.open_nursery() as nursery:
                for i in range(k):
                    nursery.start_soon(each, free[i])

        try:
            return await _measure(one, spawn, n, concurrency)
        finally:
            for s in socks:
                await s.aclose()

    result: dict[str, float] = trio.run(main)
    return result


def _child_raw_asyncio(port: int, n: int, concurrency: int) -> dict[str, float]:
    import asyncio

    async def main() -> dict[str, float]:
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency + 1)]
        reader0, writer0 = conns[0]
        writer0.write(b"*3\r\n$3\r\nSET\r\n$5\r\nbench\r\n$16\r\n" + _VALUE + b"\r\n")
        await reader0.readline()

        async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            writer.write(_GET)
            return await reader.readexactly(len(_REPLY))

        async def one() -> object:
            return await get(reader0, writer0)

        async def spawn(k: int, body: Callable[[], Awaitable[None]]) -> None:
            async def each(i: int) -> None:
                r, w = conns[1 + i]
                for _ in range(n // concurrency):
                    await get(r, w)

            await asyncio.gather(*(each(i) for i in range(k)))

        try:
            return await _measure(one, spawn, n, concurrency)
        finally:
            for _, w in conns:
                w.close()

    return asyncio.run(main())


def _child(name: str, port: int, n: int, concurrency: int) -> dict[str, float]:
    if name == "deskbridge":
        return _child_deskbridge(port, n, concurrency)
    if name == "coredis-trio":
        return _child_coredis("trio", port, n, concurrency)
    if name == "coredis-asyncio":
        return _child_coredis("asyncio", port, n, concurrency)
    if name == "redis-py-asyncio":
        return _child_redis_py(port, n, concurrency)
    if name == "raw-trio":
        return _child_raw_trio(port, n, concurrency)
    if name == "raw-asyncio":
        return _child_raw_asyncio(port, n, concurrency)
    raise SystemExit(f"unknown client {name!r}; one of {', '.join(CLIENTS)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="commands per shape (default 20000)")
    p.add_argument("--concurrency", type=int, default=64, help="tasks in the conc shape")
    p.add_argument("--redis-port", type=int, default=6413)
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset")
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.redis_port, args.n, args.concurrency)))
        return 0
    names = [c for c in args.clients.split(",") if c]
    for name in names:
        if name not in CLIENTS:
            p.error(f"--clients: unknown client {name!r}; one of {', '.join(CLIENTS)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="client-cost-") as tmp:
        redis = start_private_redis(Path(tmp), args.redis_port, "client-cost")
        try:
            for name in names:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        name,
                        "--redis-port",
                        str(args.redis_port),
                        "--n",
                        str(args.n),
                        "--concurrency",
                        str(args.concurrency),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            redis.stop()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(
        f"Redis GET from the client's process, n={args.n}, concurrency={args.concurrency}, "
        f"load {load}"
    )
    print(
        f"{'client':<18} {'seq p50 us':>10} {'seq p99 us':>10} {'seq CPU us/cmd':>15} "
        f"{'conc cmd/s':>11} {'conc CPU us/cmd':>16} {'calls/cmd':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:<18} {r['seq_p50_us']:>10.0f} {r['seq_p99_us']:>10.0f} "
            f"{r['seq_cpu_us']:>15.1f} {r['conc_per_s']:>11.0f} {r['conc_cpu_us']:>16.1f} "
            f"{r['calls_per_cmd']:>10.0f}"
        )
    base = results.get("redis-py-asyncio")
    if base:
        print("ratios to redis-py-asyncio (CPU per command, seq / conc):")
        for name, r in results.items():
            print(
                f"  {name:<18} {r['seq_cpu_us'] / base['seq_cpu_us']:.2f}x / "
                f"{r['conc_cpu_us'] / base['conc_cpu_us']:.2f}x"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
