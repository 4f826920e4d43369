"""The bench's fake desktop: many lightweight sidecars in one asyncio process.

Each one speaks the real v1 wire protocol (docs/protocol.md) over its own WebSocket:
``hello`` with one ``echo`` tool, then it answers ``job`` with a ``job_result`` that
returns the args (after ``args["sleep_s"]`` seconds when the args have it: a slow tool,
the socket served meanwhile), and ``ping`` with ``pong``. With ``--own-pings`` each one
also pings as the real sidecar does (every welcome's ``ping_interval_s`` after its last
pong; no pong within ``ping_timeout_s`` drops the socket): ``bench/idle.py`` uses it, so
the idle figures are those of a real population. It sends nothing else (no status),
keeps no dedupe ledger and runs no tools: it is the cheapest thing that a hub must treat
as a connected desktop. The same process serves every system compared (deskbridge's hub
and the peers in this folder speak the same frames; the peers do not answer pings, so
``compare.py`` runs without ``--own-pings``).

Runs until killed; every second it rewrites ``--status-file`` with counters (JSON):
``connected`` (sockets open now), ``welcomed`` (sockets past welcome now),
``welcomes`` (total), ``closes`` (total sockets that ended), ``jobs``, ``pings`` (the
hub's, answered), ``own_pings`` (sent), ``pong_timeouts``,
``failures`` (connect attempts that failed), ``failure_kinds`` (why: exception name
plus HTTP status or close code), ``close_kinds`` (why a welcomed socket ended: the close
code and reason received, ``pong timeout``, or the exception's name), ``cpu_s`` (this
process).

Usage (started by compare.py / idle.py):
  python bench/lib/desktop.py --url ws://127.0.0.1:PORT --prefix u --count N \
      --secret S --status-file F [--connect-concurrency 64] [--reconnect-s 0.5] [--own-pings]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

HELLO = json.dumps(
    {
        "type": "hello",
        "protocol_version": 1,
        "sidecar_version": "bench-fake-desktop",
        "tools": [
            {
                "name": "echo",
                "description": "Return the args.",
                "args_schema": {"type": "object"},
                "side_effects": False,
            }
        ],
    }
)

#: Why connection attempts failed before welcome: exception name + HTTP status / close code.
FAILURE_KINDS: dict[str, int] = {}
CLOSE_KINDS: dict[str, int] = {}
COUNTERS = dict.fromkeys(
    (
        "connected",
        "welcomed",
        "welcomes",
        "closes",
        "jobs",
        "pings",
        "own_pings",
        "pong_timeouts",
        "failures",
    ),
    0,
)


def raise_nofile() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def pinger(ws: ClientConnection, welcome: dict, pongs: dict[str, asyncio.Event]) -> None:
    """Ping as the real sidecar does (``deskbridge_sidecar._session``): sleep an interval,
    ping, wait for the pong (at most the timeout, else drop the socket), again."""
    interval_s, timeout_s = float(welcome["ping_interval_s"]), float(welcome["ping_timeout_s"])
    for n in itertools.count():
        await asyncio.sleep(interval_s)
        nonce = f"s{n}"
        answered = pongs[nonce] = asyncio.Event()
        COUNTERS["own_pings"] += 1
        await ws.send(json.dumps({"type": "ping", "nonce": nonce}))
        try:
            await asyncio.wait_for(answered.wait(), timeout_s)
        except TimeoutError:
            COUNTERS["pong_timeouts"] += 1
            await ws.close()
            return
        finally:
            pongs.pop(nonce, None)


async def answer_later(ws: ClientConnection, answer: str, wait_s: float) -> None:
    """A slow tool: ``answer`` after ``wait_s`` seconds (the socket may have gone)."""
    await asyncio.sleep(wait_s)
    try:
        await ws.send(answer)
    except WebSocketException:
        pass


async def desktop(
    url: str, token: str, reconnect_s: float, gate: asyncio.Semaphore, own_pings: bool
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    while True:
        welcomed = False
        pinging: asyncio.Task[None] | None = None
        try:
            async with gate:
                ws = await connect(
                    url + "/v1/sidecar",
                    additional_headers=headers,
                    ping_interval=None,
                    compression=None,
                    open_timeout=60,
                    close_timeout=2,
                    max_queue=None,
                )
            COUNTERS["connected"] += 1
            try:
                await ws.send(HELLO)
                first = json.loads(await ws.recv())
                if first.get("type") != "welcome":
                    raise ConnectionError(f"expected welcome, got {first!r}")
                welcomed = True
                COUNTERS["welcomed"] += 1
                COUNTERS["welcomes"] += 1
                pongs: dict[str, asyncio.Event] = {}
                slow: set[asyncio.Task[None]] = set()
                if own_pings:
                    pinging = asyncio.create_task(pinger(ws, first, pongs))
                async for raw in ws:
                    frame = json.loads(raw)
                    kind = frame.get("type")
                    if kind == "job":
                        COUNTERS["jobs"] += 1
                        answer = json.dumps(
                            {"type": "job_result", "id": frame["id"], "ok": True,
                             "result": frame["args"]}
                        )  # fmt: skip
                        wait_s = frame["args"].get("sleep_s")
                        if isinstance(wait_s, int | float) and wait_s > 0:  # a slow tool
                            slow.add(asyncio.create_task(answer_later(ws, answer, wait_s)))
                            slow = {t for t in slow if not t.done()}
                        else:
                            await ws.send(answer)
                    elif kind == "ping":
                        COUNTERS["pings"] += 1
                        await ws.send(json.dumps({"type": "pong", "nonce": frame["nonce"]}))
                    elif kind == "pong":
                        answered = pongs.get(frame.get("nonce", ""))
                        if answered is not None:
                            answered.set()
            finally:
                if pinging is not None:
                    if pinging.done() and not pinging.cancelled():
                        why = "pong timeout"  # the pinger closed the socket
                    else:
                        why = None
                    pinging.cancel()
                else:
                    why = None
                COUNTERS["connected"] -= 1
                if welcomed:
                    COUNTERS["welcomed"] -= 1
                    if why is None:
                        rcvd = ws.close_code
                        why = (
                            f"{rcvd} {ws.close_reason or ''}".strip()
                            if rcvd is not None
                            else type(sys.exc_info()[1]).__name__
                        )
                    CLOSE_KINDS[why] = CLOSE_KINDS.get(why, 0) + 1
                COUNTERS["closes"] += 1
                await ws.close()
        except (TimeoutError, OSError, WebSocketException, ConnectionError, ValueError) as exc:
            if not welcomed:
                COUNTERS["failures"] += 1
                kind = type(exc).__name__
                status = getattr(getattr(exc, "response", None), "status_code", None)
                code = getattr(getattr(exc, "rcvd", None), "code", None)
                kind += f" {status}" if status else f" {code}" if code else ""
                FAILURE_KINDS[kind] = FAILURE_KINDS.get(kind, 0) + 1
        # full jitter, so a hub restart does not meet a stampede
        await asyncio.sleep(random.uniform(0, reconnect_s))


async def report(path: str) -> None:
    while True:
        t = os.times()
        data = {
            **COUNTERS,
            "failure_kinds": FAILURE_KINDS,
            "close_kinds": CLOSE_KINDS,
            "cpu_s": t.user + t.system,
            "t": time.time(),
        }
        tmp = path + ".tmp"
        Path(tmp).write_text(json.dumps(data))  # noqa: ASYNC240 - a tiny local file
        os.replace(tmp, path)
        await asyncio.sleep(1.0)


async def main(args: argparse.Namespace) -> None:
    from deskbridge_hub import issue_token

    gate = asyncio.Semaphore(args.connect_concurrency)
    tasks = [asyncio.create_task(report(args.status_file))]
    for i in range(args.count):
        token = issue_token(args.secret, f"{args.prefix}{i:05d}", lifetime_s=24 * 3600)
        tasks.append(
            asyncio.create_task(desktop(args.url, token, args.reconnect_s, gate, args.own_pings))
        )
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--secret", default=os.environ.get("DESKBRIDGE_SECRET", ""))
    p.add_argument("--status-file", required=True)
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--reconnect-s", type=float, default=0.5)
    p.add_argument("--own-pings", action="store_true", help="ping as the real sidecar does")
    a = p.parse_args()
    raise_nofile()
    try:
        asyncio.run(main(a))
    except KeyboardInterrupt:
        sys.exit(0)
