"""Shared helpers of the Redis substrate's focused tests (test_redis_caller, _jobs,
_streams): key clean-up by hash tag, a recorder of the substrate's commands, and the
server's XGROUP CREATE count."""

from __future__ import annotations

from typing import Any

import pytest
from deskbridge_hub._redis import RedisSubstrate

from ..conftest import RawRedis


async def delete_tagged(raw: RawRedis, tag: str) -> None:
    """DEL every ``bridge:*{tag}*`` key (SCAN, bounded)."""
    cursor = "0"
    for _ in range(10_000):
        cursor, found = await raw("SCAN", cursor, "MATCH", f"bridge:*{{{tag}}}*")
        if found:
            await raw("DEL", *found)
        if cursor == "0":
            break


def record_calls(
    substrate: RedisSubstrate, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[tuple[Any, ...], float | None]]:
    """Every command ``substrate._call`` sends from now on, with its ``block_s``."""
    calls: list[tuple[tuple[Any, ...], float | None]] = []
    call = substrate._call

    async def recording(session: Any, *command: Any, block_s: float | None = 0.0) -> Any:
        calls.append((command, block_s))
        return await call(session, *command, block_s=block_s)

    monkeypatch.setattr(substrate, "_call", recording)
    return calls


async def xgroup_creates(raw: RawRedis) -> int:
    """How many XGROUP CREATE the server has run (INFO commandstats)."""
    for line in (await raw("INFO", "commandstats")).splitlines():
        if line.startswith("cmdstat_xgroup|create:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0
