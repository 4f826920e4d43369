"""Metrics hooks that the integration scrape cannot provoke cheaply: Redis errors are
counted by operation where the substrate maps them; the dispatch decorator counts an
unavailable substrate as outcome ``unavailable``."""

from __future__ import annotations

import secrets
import socket

import pytest
import trio
from deskbridge_hub import Bridge, SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._own_liveness import own_liveness
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_health import Health, HealthMonitor
from prometheus_client import REGISTRY

from tests.conftest import REDIS_URL, RawRedis


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections refused


async def test_redis_errors_are_counted_by_operation() -> None:
    sub = RedisSubstrate(f"redis://127.0.0.1:{closed_port()}/0", connect_timeout_s=1.0)
    before = sample("deskbridge_redis_errors_total", operation="GET presence")
    for _ in range(2):
        with pytest.raises(SubstrateUnavailable):
            await sub.get_presence("u1")
    assert sample("deskbridge_redis_errors_total", operation="GET presence") == before + 2


async def test_unavailable_dispatch_is_counted(autojump_clock) -> None:
    sub = MemorySubstrate()
    sub.set_unavailable(True)
    # (``status``: every desktop's tool, so labelled without a catalogue; a name no
    # catalogue was read for counts under ``other``, test_metrics_tool_labels)
    before = sample("deskbridge_jobs_total", tool="status", outcome="unavailable")
    with pytest.raises(SubstrateUnavailable):
        await Bridge(sub).dispatch("u1", "status", {})
    assert sample("deskbridge_jobs_total", tool="status", outcome="unavailable") == before + 1
    # a bad request is not a job: nothing counted
    with pytest.raises(Exception):  # noqa: B017 - BadRequest
        await Bridge(sub).dispatch("u1", "", {})
    assert sample("deskbridge_jobs_total", tool="", outcome="unavailable") == 0.0


async def test_a_connection_found_dead_is_counted_and_doubts_the_held_presence() -> None:
    """A shared connection killed under the substrate (Sentinel's ``CLIENT KILL``, a
    restart): the command is sent again on a new one, and the replacement is counted
    (``deskbridge_redis_reconnects_total{reason="dead"}``); a desktop held here reads
    in doubt, not offline, while the probe looks at what changed."""
    name = "deskbridge-test-" + secrets.token_hex(4)
    raw = RawRedis(REDIS_URL)
    own_liveness().holding("held-user")
    before = sample("deskbridge_redis_reconnects_total", reason="dead")
    with trio.fail_after(10):
        async with RedisSubstrate.from_url(REDIS_URL, client_name=name) as sub:
            await sub.get_presence("nobody")
            assert not own_liveness().in_doubt("held-user")
            killed = await raw("CLIENT", "LIST")
            ids = [
                line.split(" ", 1)[0].removeprefix("id=")
                for line in str(killed).splitlines()
                if f"name={name}" in line
            ]
            assert ids
            for client_id in ids:
                await raw("CLIENT", "KILL", "ID", client_id)
            assert await sub.get_presence("nobody") is None  # sent again: answered
    assert sample("deskbridge_redis_reconnects_total", reason="dead") == before + 1
    assert own_liveness().in_doubt("held-user") and not own_liveness().in_doubt("other")


async def test_another_replication_history_is_counted_once_per_change(autojump_clock) -> None:
    """``deskbridge_redis_history_changes_total``: a probe that finds another
    ``master_replid`` than the one before (a failover, a restart without persistence)."""
    replids = iter(["a" * 40, "a" * 40, "b" * 40, "b" * 40, "c" * 40])

    async def probe() -> Health:
        await trio.lowlevel.checkpoint()
        return Health(replid=next(replids))

    monitor = HealthMonitor("127.0.0.1:1", probe)
    before = sample("deskbridge_redis_history_changes_total")
    for _ in range(5):
        await monitor.check()
    assert monitor.history_changes == 2
    assert sample("deskbridge_redis_history_changes_total") == before + 2
