"""The admin directory at 10,000 desktops (issue 14 item 3's "scales to 10,000").

Writes 10,000 directory records (as 10,000 session starts would) into a Redis database of
its own (14 by default), 2,000 of them with a presence key, then times, through
``RedisSubstrate``: one page of 100 (ZRANGE + the page's pipelined GETs), a walk over every
page, and for comparison a SCAN over ``bridge:presence:*`` (what a listing without the index
would cost). Prints median / max per page in milliseconds and the walk's total.

Usage: .venv/bin/python bench/admin_directory.py [--desktops N] [--redis URL]
(default redis://127.0.0.1:6379/14; the database is flushed first)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import trio


async def main(url: str, desktops: int, online: int) -> None:
    from deskbridge_hub._redis import RedisSubstrate

    sub = RedisSubstrate(url)
    async with sub:
        async with sub._session("bench setup") as s:
            await s.execute((b"FLUSHDB",), timeout_s=30)
        t0 = time.perf_counter()
        for i in range(desktops):
            info = json.dumps({"session_id": f"s{i}", "connected_at": 1.8e9 + i, "tools": []})
            await sub.record_desktop(f"user-{i:05d}", info, at_s=1.8e9 + i)
            if i < online:
                await sub.set_presence(f"user-{i:05d}", f"s{i}", 600.0)
        setup_s = time.perf_counter() - t0
        pages = []
        t0 = time.perf_counter()
        offset = 0
        while True:
            p0 = time.perf_counter()
            page = await sub.list_desktops(offset=offset, limit=100)
            await sub.desktops_info([u for u, _ in page.rows])
            pages.append(time.perf_counter() - p0)
            offset += len(page.rows)
            if not page.rows or offset >= page.total:
                break
        walk_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cursor, found = b"0", 0
        async with sub._session("bench scan") as s:
            while True:
                ((cursor, keys),) = await s.execute(
                    (b"SCAN", cursor, b"MATCH", b"bridge:presence:*", b"COUNT", 1000), timeout_s=30
                )
                found += len(keys)
                if cursor in (b"0", "0", 0):
                    break
        scan_s = time.perf_counter() - t0
    ms = sorted(p * 1000 for p in pages)
    print(f"directory: {desktops} desktops ({online} online), written in {setup_s:.1f} s")
    print(
        f"page of 100 (ZRANGE + 300 pipelined GETs): median {statistics.median(ms):.2f} ms, "
        f"max {ms[-1]:.2f} ms over {len(ms)} pages; full walk {walk_s * 1000:.0f} ms"
    )
    print(
        f"for comparison, SCAN bridge:presence:* over the keyspace: {scan_s * 1000:.0f} ms "
        f"({found} keys found, no paging by activity, no offline desktops)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--desktops", type=int, default=10_000)
    parser.add_argument("--online", type=int, default=2_000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    args, _ = parser.parse_known_args()
    trio.run(main, args.redis, args.desktops, args.online)
