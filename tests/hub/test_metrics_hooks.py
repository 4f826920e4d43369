"""Metrics hooks that the integration scrape cannot provoke cheaply: Redis errors are
counted by operation where the substrate maps them; the dispatch decorator counts an
unavailable substrate as outcome ``unavailable``."""

from __future__ import annotations

import socket

import pytest
from deskbridge_hub import Bridge, SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._redis import RedisSubstrate
from prometheus_client import REGISTRY


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
