"""Redis cost of idle desktops on one hub process (issue 10: idle costs almost nothing).

Starts ``deskbridge-hub serve --workers 1`` against the Redis at ``--redis`` (use a private
one: the figures are Redis-wide), connects N lightweight fake sidecars in this process
(real protocol over real WebSockets: hello, then answer pings), waits until all are
welcomed, then over ``--window-s`` seconds counts Redis commands (INFO commandstats delta)
and the connections the hub holds (CLIENT LIST, by the hub's address).

    .venv/bin/python bench/idle_cost.py --redis redis://127.0.0.1:6401/0 -n 500 --window-s 60

Prints: desktops welcomed, present (presence keys), Redis commands/s in total and per idle
desktop, the commands by name, and the hub's Redis connections.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import trio
from trio_websocket import ConnectionClosed, open_websocket_url

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def redis_cli(url: str, *args: str) -> str:
    parts = urlsplit(url)
    cmd = ["redis-cli", "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, check=True).stdout


def commandstats(url: str) -> dict[str, int]:
    out = {}
    for line in redis_cli(url, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_") :].split(":", 1)
            fields = dict(kv.split("=") for kv in rest.split(","))
            out[name] = int(fields["calls"])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def fake_sidecar(
    url: str, token: str, welcomed: list[str], failed: list[str], stop: trio.Event
) -> None:
    try:
        await _fake_sidecar(url, token, welcomed, stop)
    except (ConnectionClosed, OSError, trio.TooSlowError) as exc:
        failed.append(repr(exc)[:120])


async def _fake_sidecar(url: str, token: str, welcomed: list[str], stop: trio.Event) -> None:
    headers = [("Authorization", f"Bearer {token}")]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        hello = {"type": "hello", "protocol_version": 1, "sidecar_version": "bench", "tools": []}
        await ws.send_message(json.dumps(hello))
        welcome = json.loads(await ws.get_message())
        welcomed.append(welcome["session_id"])
        try:
            while not stop.is_set():
                frame = json.loads(await ws.get_message())
                if frame["type"] == "ping":
                    await ws.send_message(json.dumps({"type": "pong", "nonce": frame["nonce"]}))
        except ConnectionClosed:
            return


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--redis", required=True)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--ramp-ms", type=float, default=5.0, help="pause between connects")
    args = ap.parse_args()
    port = free_port()
    secret = os.urandom(32).hex()
    env = {**os.environ, "DESKBRIDGE_REDIS_URL": args.redis, "DESKBRIDGE_SECRET": secret}
    log = open(f"/tmp/idle-cost-hub-{port}.log", "w")  # noqa: SIM115, ASYNC230
    hub = subprocess.Popen(  # noqa: ASYNC220 - started once, before any concurrency
        [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        from deskbridge_hub import issue_token

        await trio.sleep(2.0)
        welcomed: list[str] = []
        failed: list[str] = []
        stop = trio.Event()
        users = [f"idle-{port}-{i}" for i in range(args.n)]
        async with trio.open_nursery() as nursery:
            for user in users:
                token = issue_token(secret, user)
                nursery.start_soon(
                    fake_sidecar, f"ws://127.0.0.1:{port}/v1/sidecar", token, welcomed, failed, stop
                )
                await trio.sleep(args.ramp_ms / 1000)
            with trio.fail_after(120):
                while len(welcomed) + len(failed) < args.n:  # noqa: ASYNC110 - bounded poll
                    await trio.sleep(0.1)
            await trio.sleep(12)  # settle: the first heartbeat after the connects
            before = await trio.to_thread.run_sync(commandstats, args.redis)
            t0 = time.monotonic()
            await trio.sleep(args.window_s)
            after = await trio.to_thread.run_sync(commandstats, args.redis)
            elapsed = time.monotonic() - t0
            keys = await trio.to_thread.run_sync(
                redis_cli, args.redis, "--scan", "--pattern", f"bridge:presence:{{idle-{port}-*}}"
            )
            present = len(keys.split())
            clients = (
                await trio.to_thread.run_sync(redis_cli, args.redis, "CLIENT", "LIST")
            ).splitlines()
            stop.set()
            nursery.cancel_scope.cancel()
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        delta = {
            k: v for k, v in delta.items() if v > 0 and k not in ("info", "client|list", "exists")
        }
        total = sum(delta.values())
        print(
            f"desktops welcomed {len(welcomed)}/{args.n}, present {present} at the end, "
            f"failed {len(failed)} {failed[:2]}"
        )
        print(
            f"window {elapsed:.1f} s: {total} Redis commands = {total / elapsed:.2f}/s, "
            f"{total / elapsed / args.n:.4f}/s per idle desktop"
        )
        print("by command:", dict(sorted(delta.items(), key=lambda kv: -kv[1])))
        print(f"Redis connections open (all clients, incl. this probe): {len(clients)}")
    finally:
        os.killpg(hub.pid, 15)
        hub.wait(timeout=30)


if __name__ == "__main__":
    trio.run(main)
