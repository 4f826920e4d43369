"""Progress streams on both substrates: publish, read after an entry ID, block, and the
outcome appended by publish_result only when the stream exists (XADD NOMKSTREAM)."""

from __future__ import annotations

import json
import os
import secrets

import pytest
import trio
from deskbridge_common import Progress
from deskbridge_hub import MemorySubstrate, RedisSubstrate
from deskbridge_hub._progress import ProgressRelay, parse_progress

REDIS_URL = os.environ.get("DESKBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(params=["memory", "redis"])
async def substrate(request):
    if request.param == "memory":
        yield MemorySubstrate()
    else:
        async with RedisSubstrate.from_url(REDIS_URL) as sub:
            yield sub


async def test_progress_stream_and_outcome(substrate):
    job = "p-" + secrets.token_hex(4)
    assert await substrate.read_progress(job, "0", block_ms=1) == []
    # no stream: the result does not create one
    await substrate.publish_result("u1", job, '{"status": "completed"}', ttl_s=5)
    assert await substrate.read_progress(job, "0", block_ms=1) == []

    job = "p-" + secrets.token_hex(4)
    await substrate.publish_progress(job, '{"progress": 1}', ttl_s=5)
    await substrate.publish_progress(job, '{"progress": 2}', ttl_s=5)
    first = await substrate.read_progress(job, "0", block_ms=1)
    assert [p for _, p in first] == ['{"progress": 1}', '{"progress": 2}']
    assert await substrate.read_progress(job, first[-1][0], block_ms=1) == []

    async def later() -> None:
        await trio.sleep(0.05)
        await substrate.publish_result("u1", job, '{"status": "completed", "result": 7}', ttl_s=5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        with trio.fail_after(5):
            (entry,) = await substrate.read_progress(job, first[-1][0], block_ms=3000)
    assert json.loads(entry[1]) == {"outcome": {"status": "completed", "result": 7}}
    assert await substrate.wait_result("u1", job, timeout_s=0.01) is not None  # result intact


async def test_relay_coalesces_and_bridge_reports(autojump_clock):
    substrate = MemorySubstrate()
    relay = ProgressRelay(substrate, ttl_s=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        for i in range(100):
            relay.offer("j1", Progress(id="d", progress=i, total=100))
        await trio.sleep(0.1)
        entries = await substrate.read_progress("j1", "0", block_ms=1)
        assert [parse_progress(p).progress for _, p in entries] == [99.0]  # coalesced
        nursery.cancel_scope.cancel()
    assert parse_progress('{"watching": true}') is None
    assert parse_progress('{"outcome": {}}') is None and parse_progress("nope") is None


async def test_relay_replaces_a_lone_surrogate_in_a_message(autojump_clock):
    # an older sidecar's file name that is not UTF-8: it reached SSE watchers as
    # "\udce9", which MCP's progress notifications cannot serialise
    substrate = MemorySubstrate()
    relay = ProgressRelay(substrate, ttl_s=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        relay.offer("j1", Progress(id="d", progress=1, message="reading caf\udce9.txt"))
        await trio.sleep(0.1)
        ((_, payload),) = await substrate.read_progress("j1", "0", block_ms=1)
        nursery.cancel_scope.cancel()
    report = parse_progress(payload)
    assert report is not None and report.message == "reading caf\ufffd.txt"
