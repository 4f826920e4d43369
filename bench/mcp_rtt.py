"""MCP round trip for `echo` next to the HTTP API's, in the same run (issue 13).

Starts Redis-backed `deskbridge-hub serve --workers 1` and a real sidecar process, then
times N `echo` calls each way and prints median / p90 / max in milliseconds:

  http-keep   POST /v1/users/{u}/jobs on one keep-alive connection (httpx)
  mcp-modern  tools/call through the SDK's client, default mode (2026-07-28 wire: one
              POST per call, answered as a JSON-RPC result)
  mcp-legacy  tools/call through the SDK's client, mode="legacy" (2025 wire: an
              initialized Streamable HTTP session, the answer on the POST's SSE stream)

One hub worker so every MCP request reaches the process holding the MCP session (the SDK
keeps sessions in process memory; see docs/mcp.md). The MCP clients run on asyncio.

Usage: .venv/bin/python bench/mcp_rtt.py [--calls N]   (Redis at 127.0.0.1:6379)
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.procs import API_KEY, Hub, Sidecar, api, issue, running, wait_until  # noqa: E402


def summary(label: str, samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p90 = ms[max(int(len(ms) * 0.9) - 1, 0)]
    return (
        f"{label:<11} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   "
        f"p90 {p90:7.2f} ms   max {ms[-1]:7.2f} ms"
    )


async def mcp_calls(url: str, n: int, mode: str) -> list[float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    out = []
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        await client.list_tools()
        for i in range(n):
            t0 = time.perf_counter()
            result = await client.call_tool("echo", {"i": i})
            out.append(time.perf_counter() - t0)
            assert not result.is_error and json.loads(result.content[0].text) == {"i": i}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    n = parser.parse_known_args()[0].calls
    user = "bench-mcp-" + secrets.token_hex(4)
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp), workers=1)
        with running(hub):
            hub.wait_healthy()
            sidecar = Sidecar(Path(tmp), hub.ws, issue(user))
            with running(sidecar), api() as client:
                url = f"{hub.http}/v1/users/{user}"
                wait_until(lambda: client.get(url + "/presence").json()["online"], timeout_s=15)
                for i in range(5):  # warm-up
                    client.post(url + "/jobs", json={"name": "echo", "args": {"i": i}})
                keep = []
                for i in range(n):
                    t0 = time.perf_counter()
                    r = client.post(url + "/jobs", json={"name": "echo", "args": {"i": i}})
                    keep.append(time.perf_counter() - t0)
                    assert r.json()["result"] == {"i": i}, r.text
                modern = anyio.run(mcp_calls, url + "/mcp", n, "auto", backend="asyncio")
                legacy = anyio.run(mcp_calls, url + "/mcp", n, "legacy", backend="asyncio")
                print(f"echo round trip, 1 Hypercorn worker + Redis + 1 sidecar ({n} calls each)")
                print(summary("http-keep", keep))
                print(summary("mcp-modern", modern))
                print(summary("mcp-legacy", legacy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
