"""The overload bench's HTTP callers: many concurrent ``POST /v1/users/{u}/jobs`` (echo)
from one asyncio process, on raw keep-alive sockets (no client library: httpx costs
several times the hub's CPU per call, so the callers, not the hub, would be the limit on
a 2-core machine).

Each of ``--callers`` tasks holds one connection and calls in a loop until
``--seconds`` pass: the user ``users[k % len(users)]``, ``timeout_s`` ``--timeout-s``.
A connection that fails or gives no answer within ``--timeout-s`` + ``--slack-s`` is
counted (``conn:<exception>``) and opened again. Every answer is counted under
``HTTP <code> <status>`` (the body's ``status``, or its ``error.code``), a ``timeout``
under its stage as well, with its ``Retry-After`` if any. At the end it writes one JSON
document to ``--out``: the counts, latency percentiles per kind, answers per second, the
users answered ``offline``, and how late the answers came against the asked
``timeout_s`` (``vs_timeout``: answers by ``elapsed - timeout_s`` band, refusals apart,
and the calls given up unanswered; a refusal answered at once counts as in time), and
where an answer's time went (``split_ms``: the TCP connect when the call opened a
connection, the hub's own ``elapsed_ms`` (its dispatch), and the rest: the request waiting
to be accepted, read and handled, the answer on its way back, this process's own loop;
``late_split_ms`` the same over the answers later than T + 1 s).

Usage (started by bench/overload.py):
  python bench/lib/http_flood.py --host 127.0.0.1 --port P --key K --users u1,u2 \
      --callers 1000 --seconds 60 --out F
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections import Counter, defaultdict
from pathlib import Path


def request_bytes(host: str, port: int, key: str, user: str, body: bytes) -> bytes:
    head = (
        f"POST /v1/users/{user}/jobs HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("closed before an answer")
    code = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return code, headers, body


class Tally:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.latency: defaultdict[str, list[float]] = defaultdict(list)
        self.per_second: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self.offline_users: Counter[str] = Counter()
        self.retry_after: Counter[str] = Counter()
        self.vs_timeout: Counter[str] = Counter()
        self.splits: list[tuple[float, float, float, float]] = []  # total, connect, hub, rest
        self.t0 = time.monotonic()

    def add(self, kind: str, elapsed_s: float) -> None:
        self.kinds[kind] += 1
        self.latency[kind].append(elapsed_s)
        self.per_second[int(time.monotonic() - self.t0)][kind] += 1


#: Bands of ``elapsed - timeout_s``, seconds, for ``vs_timeout`` (upper bounds).
LATE_BANDS_S = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)


def late_band(elapsed_s: float, timeout_s: float) -> str:
    """The ``vs_timeout`` band of an answer ``elapsed_s`` after its request."""
    late_s = elapsed_s - timeout_s
    for bound in LATE_BANDS_S:
        if late_s <= bound:
            return "within T" if bound == 0.0 else f"T+{bound:g} s"
    return f"over T+{LATE_BANDS_S[-1]:g} s"


def band_order(item: tuple[str, int]) -> tuple[bool, int, str]:
    """Refusals last; then by band, earliest first."""
    name = item[0]
    bands = ["within T", *(f"T+{b:g} s" for b in LATE_BANDS_S[1:]), "over T+"]
    rank = next((i for i, b in enumerate(bands) if b in name), len(bands))
    return name.startswith("refused"), rank, name


def classify(code: int, headers: dict[str, str], body: bytes) -> tuple[str, float | None]:
    """The answer's kind and the hub's ``elapsed_ms`` in seconds (None if absent)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"HTTP {code} (not JSON)", None
    status = doc.get("status") or (doc.get("error") or {}).get("code", "?")
    kind = f"HTTP {code} {status}"
    if status == "timeout":
        kind += f" stage={(doc.get('detail') or {}).get('stage', '?')}"
    elapsed_ms = doc.get("elapsed_ms")
    return kind, elapsed_ms / 1000 if isinstance(elapsed_ms, int | float) else None


async def caller(k: int, args: argparse.Namespace, users: list[str], tally: Tally, end: float):
    user = users[k % len(users)]
    reader = writer = None
    i = 0
    while time.monotonic() < end:
        body = json.dumps({"name": "echo", "args": {"k": k, "i": i}, "timeout_s": args.timeout_s})
        i += 1
        t0 = time.monotonic()
        connect_s = 0.0
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(args.host, args.port), args.timeout_s + args.slack_s
                )
                connect_s = time.monotonic() - t0
            assert reader is not None
            writer.write(request_bytes(args.host, args.port, args.key, user, body.encode()))
            code, headers, raw = await asyncio.wait_for(
                read_answer(reader), args.timeout_s + args.slack_s
            )
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.add(f"conn:{type(exc).__name__}", time.monotonic() - t0)
            tally.vs_timeout["no answer (gave up or connection failed)"] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.1)
            continue
        kind, dispatch_s = classify(code, headers, raw)
        elapsed_s = time.monotonic() - t0
        tally.add(kind, elapsed_s)
        if dispatch_s is not None:
            rest_s = elapsed_s - connect_s - dispatch_s
            tally.splits.append((elapsed_s, connect_s, dispatch_s, rest_s))
        band = late_band(elapsed_s, args.timeout_s)
        tally.vs_timeout[f"refused {code}, {band}" if code in (429, 503) else band] += 1
        if "offline" in kind:
            tally.offline_users[user] += 1
        if "retry-after" in headers:
            tally.retry_after[f"{kind} Retry-After: {headers['retry-after']}"] += 1
        if headers.get("connection", "").lower() == "close":
            writer.close()
            reader = writer = None
        if code == 429 or code == 503:  # a shed call: honour the hint, as a client should
            hint = headers.get("retry-after", "")
            await asyncio.sleep(min(float(hint), args.seconds) if hint.isdigit() else 1.0)
    if writer is not None:
        writer.close()


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def splits(rows: list[tuple[float, float, float, float]]) -> dict[str, dict[str, float]]:
    """p50 / p99 / max ms of each part of the answers' time (``Tally.splits`` rows)."""
    names = ("total", "connect", "hub dispatch", "rest")
    return {
        name: {"n": len(rows), **{q: pct([r[i] for r in rows], f) for q, f in QUANTILES}}
        for i, name in enumerate(names)
    }


QUANTILES = (("p50", 0.5), ("p99", 0.99), ("max", 1.0))


async def main(args: argparse.Namespace) -> None:
    users = args.users.split(",")
    tally = Tally()
    end = time.monotonic() + args.seconds
    await asyncio.gather(*(caller(k, args, users, tally, end) for k in range(args.callers)))
    out = {
        "callers": args.callers,
        "seconds": time.monotonic() - tally.t0,
        "kinds": dict(tally.kinds.most_common()),
        "latency_ms": {
            kind: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": pct(v, 1.0)}
            for kind, v in tally.latency.items()
        },
        "per_second": {str(s): dict(c) for s, c in sorted(tally.per_second.items())},
        "offline_users": dict(tally.offline_users),
        "retry_after": dict(tally.retry_after),
        "vs_timeout": dict(sorted(tally.vs_timeout.items(), key=band_order)),
        "split_ms": splits(tally.splits),
        "late_split_ms": splits([s for s in tally.splits if s[0] > args.timeout_s + 1.0]),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))  # noqa: ASYNC240 - once, at the end


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--users", required=True)
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--slack-s", type=float, default=20.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(a))
