"""Calls that wait on slow tools: what one waiting HTTP call costs a hub process, and
whether ``DESKBRIDGE_MAX_CALLS`` refuses a healthy process.

Starts a private ``redis-server`` (``--redis-port``), one hub process (``deskbridge-hub
serve --workers 1``) and ``--users`` fake desktops (``bench/lib/desktop.py``; a job
whose args have ``sleep_s`` is answered that many seconds later: a slow tool such as a
browser action), then sends ``--calls`` HTTP calls at once (raw sockets, one connection
each, from one asyncio process), call k to user k mod ``--users``, each asking the tool
to take ``--tool-s`` seconds with ``timeout_s`` ``--tool-s`` + 30. It samples the hub's
RSS, open descriptors and CPU before the calls, once every call has been sent and waited
``--settle-s``, and after the answers; and prints the answers by kind (an ``overloaded``
refusal of this idle process is a false one), the RSS and descriptors per waiting call
(the difference over the calls), and the hub's CPU while they waited.

Usage: ./dev bench waiting_calls [--users 600] [--calls 600] [--tool-s 30]
       [--hub-env NAME=VALUE ...] [--redis-port 6418] [--hub-port P]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.idle import start_swarm, swarm_status  # noqa: E402
from bench.lib.desktop import raise_nofile  # noqa: E402
from bench.lib.http_flood import classify, read_answer, request_bytes  # noqa: E402
from bench.lib.measure import cpu_s, group_pids, rss_bytes, start_private_redis  # noqa: E402
from bench.overload import start_hub  # noqa: E402
from tests.procs import API_KEY, Proc, wait_until  # noqa: E402


def fds(pids: list[int]) -> int:
    """Open descriptors of ``pids``."""
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids if os.path.isdir(f"/proc/{pid}"))


class Sent:
    """How many requests were written; ``all`` is set once ``of`` were."""

    def __init__(self, of: int) -> None:
        self.count, self.of, self.all = 0, of, asyncio.Event()

    def one(self) -> None:
        self.count += 1
        if self.count >= self.of:
            self.all.set()


async def one_call(port: int, user: str, k: int, tool_s: float, sent: Sent) -> str:
    body = json.dumps(
        {"name": "echo", "args": {"k": k, "sleep_s": tool_s}, "timeout_s": tool_s + 30}
    ).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("127.0.0.1", port, API_KEY, user, body))
        await writer.drain()
        sent.one()
        code, headers, raw = await asyncio.wait_for(read_answer(reader), tool_s + 60)
        writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        return f"conn:{type(exc).__name__}"
    kind, _ = classify(code, headers, raw)
    return kind


async def calls(port: int, users: list[str], n: int, tool_s: float, sent: Sent) -> Counter:
    kinds = await asyncio.gather(
        *(one_call(port, users[k % len(users)], k, tool_s, sent) for k in range(n))
    )
    return Counter(kinds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=600)
    p.add_argument("--calls", type=int, default=600)
    p.add_argument("--tool-s", type=float, default=30.0)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--redis-port", type=int, default=6418)
    p.add_argument("--hub-port", type=int, default=0, help="default: a free port")
    p.add_argument("--hub-env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args()
    raise_nofile()
    with tempfile.TemporaryDirectory(prefix="bench-waiting-") as tmp_name:
        tmp = Path(tmp_name)
        redis = start_private_redis(tmp, args.redis_port, "redis-waiting")
        procs: list[Proc] = [redis]
        try:
            hub = start_hub(tmp, redis.url, args.hub_port, args.hub_env, procs)
            swarm, status = start_swarm(tmp, hub.ws, "slow-", args.users, 64)
            procs.append(swarm)
            wait_until(
                lambda: swarm_status(status).get("welcomed", 0) >= args.users,
                timeout_s=600,
                interval_s=0.5,
                what="every fake desktop welcomed",
            )
            users = [f"slow-{i:05d}" for i in range(args.users)]
            time.sleep(3.0)  # the welcomes' work done
            pids = group_pids(hub.pid)
            before = (rss_bytes(pids), fds(pids), cpu_s(pids))

            async def run() -> tuple[Counter, tuple[int, int, float, float]]:
                sent = Sent(args.calls)
                task = asyncio.ensure_future(calls(hub.port, users, args.calls, args.tool_s, sent))
                with contextlib.suppress(TimeoutError):  # (a failed call is not "sent")
                    await asyncio.wait_for(sent.all.wait(), args.tool_s)
                await asyncio.sleep(args.settle_s)
                mid = (rss_bytes(pids), fds(pids), cpu_s(pids), time.monotonic())
                return await task, mid

            t_calls = time.monotonic()
            kinds, mid = asyncio.run(run())
            took_s = time.monotonic() - t_calls
            after = (rss_bytes(pids), fds(pids), cpu_s(pids))
        finally:
            for proc in reversed(procs):
                proc.stop(timeout_s=10)
    n = args.calls
    waited = n - sum(c for kind, c in kinds.items() if kind.startswith(("HTTP 503", "conn:")))
    print(
        f"waiting_calls: {n} HTTP calls at once over {args.users} fake desktops, each tool "
        f"{args.tool_s:g} s, on one hub process; load average {os.getloadavg()[0]:.2f}, "
        f"{os.cpu_count()} CPUs; hub env {args.hub_env or 'defaults'}"
    )
    for kind, count in kinds.most_common():
        print(f"  {count:6d}  {kind}")
    print(f"  all answered after {took_s:.1f} s")
    rss_mib = [x / 2**20 for x in (before[0], mid[0], after[0])]
    print(
        f"  hub RSS MiB before / waiting / after: {rss_mib[0]:.1f} / {rss_mib[1]:.1f} / "
        f"{rss_mib[2]:.1f}; per waiting call ({waited}) "
        f"{(mid[0] - before[0]) / max(1, waited) / 1024:.1f} KiB"
    )
    print(
        f"  hub descriptors before / waiting / after: {before[1]} / {mid[1]} / {after[1]}; "
        f"per waiting call {(mid[1] - before[1]) / max(1, waited):.2f}"
    )
    print(f"  hub CPU from the first call to the waiting sample: {mid[2] - before[2]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
