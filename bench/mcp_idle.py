"""What idle per-user MCP endpoints cost one hub process (issue 10, thirteenth round).

Starts Redis-backed `deskbridge-hub serve --workers 1`, opens the MCP endpoint of N user
ids (one `tools/list` each on the 2026 wire: no session, nothing left open), then, with
nothing more sent, prints the hub's CPU % of one core (from /proc, over --idle-s) and its
RSS. Each endpoint is kept for 10 idle minutes (``EVICT_IDLE_S``) after its last request,
so the idle window measured here is the state a burst of user ids leaves behind.

Usage: .venv/bin/python bench/mcp_idle.py [--n 4096] [--idle-s 60]
       (Redis at 127.0.0.1:6379; DESKBRIDGE_TEST_REDIS_URL to use another)
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.lib.measure import cpu_s, group_pids, rss_bytes  # noqa: E402
from tests.procs import API_KEY, Hub, running  # noqa: E402

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}}
HEADERS = {
    "Authorization": f"Bearer {API_KEY}",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/list",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="user ids whose endpoint opens")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle window, seconds")
    args = parser.parse_args()
    prefix = "bench-mcp-idle-" + secrets.token_hex(3)
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp), workers=1)
        with running(hub), httpx.Client(headers=HEADERS, timeout=30.0) as client:
            hub.wait_healthy()
            pids = group_pids(hub.pid)
            rss0 = rss_bytes(pids)
            t0 = time.perf_counter()
            statuses: dict[int, int] = {}
            for i in range(args.n):
                r = client.post(f"{hub.http}/v1/users/{prefix}-{i}/mcp", json=LIST)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            opened_s = time.perf_counter() - t0
            time.sleep(5)  # the last requests' tails
            pids = group_pids(hub.pid)
            c0, w0 = cpu_s(pids), time.perf_counter()
            time.sleep(args.idle_s)
            cpu_pct = 100 * (cpu_s(pids) - c0) / (time.perf_counter() - w0)
            rss1 = rss_bytes(pids)
    print(f"endpoints opened   {args.n} in {opened_s:.1f} s, statuses {statuses}")
    print(f"hub CPU idle       {cpu_pct:.1f} % of one core over {args.idle_s:g} s")
    print(f"hub RSS            {rss0 / 2**20:.0f} MB before, {rss1 / 2**20:.0f} MB after")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
