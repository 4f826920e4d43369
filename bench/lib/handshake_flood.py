"""A client hammering the sidecar handshake: raw sockets, one asyncio process.

Each attempt opens a TCP connection to ``/v1/sidecar``, sends the WebSocket upgrade with
``--token`` and reads the answer's head. With ``--hello`` an accepted upgrade (101) also
sends the real ``hello`` (one ``echo`` tool; masked with a zero key, which leaves the
payload as it is), reads the hub's first frame (``welcome``, or a close) and closes: a
sidecar in a crash loop, at ``--rate`` attempts a second (``--concurrency`` at most in
flight). No backoff and no ``Retry-After``: the worst client, not the real sidecar.

Runs ``--seconds``, then prints one JSON line: attempts, answers by kind (HTTP status,
``welcome``, ``close <code>``, or the exception's name) and the attempts a second.

Usage (started by bench/handshake_storm.py):
  python bench/lib/handshake_flood.py --port P --token T [--hello] [--rate 300]
      [--concurrency 32] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.procs import upgrade_request  # noqa: E402

HELLO = json.dumps(
    {
        "type": "hello",
        "protocol_version": 1,
        "sidecar_version": "bench-handshake-flood",
        "tools": [
            {
                "name": "echo",
                "description": "Return the args.",
                "args_schema": {"type": "object"},
                "side_effects": False,
            }
        ],
    }
).encode()


def masked_text_frame(payload: bytes) -> bytes:
    """One final text frame from a client (mask bit set, key 0: payload unchanged)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    return head + b"\0\0\0\0" + payload


CLOSE_FRAME = struct.pack("!BB", 0x88, 0x82) + b"\0\0\0\0" + struct.pack("!H", 1000)


async def attempt(port: int, token: str, hello: bool) -> str:
    """One handshake; returns what it met (see the module docstring)."""
    request = upgrade_request(port, token)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 101 or not hello:
            return str(status)
        writer.write(masked_text_frame(HELLO))
        b0, b1 = await reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await reader.readexactly(8))
        payload = await reader.readexactly(n)
        writer.write(CLOSE_FRAME)
        if b0 & 0x0F == 0x8:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            return f"close {code}"
        kind = json.loads(payload).get("type", "?")
        return str(kind)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def main(args: argparse.Namespace) -> None:
    tally: Counter[str] = Counter()
    gate = asyncio.Semaphore(args.concurrency)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            tally[await asyncio.wait_for(attempt(args.port, args.token, args.hello), 10)] += 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            tally[type(exc).__name__] += 1
        finally:
            gate.release()

    start = time.monotonic()
    end = start + args.seconds
    sent = 0
    while time.monotonic() < end:
        due = start + sent / args.rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        await gate.acquire()
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    await asyncio.gather(*tasks)
    took = time.monotonic() - start
    print(json.dumps({"attempts": sent, "per_s": round(sent / took, 1), "answers": tally}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--hello", action="store_true")
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args()))
