"""Why ``_redis_conn`` hosts coredis connections itself instead of using coredis's pool:
the two coredis 6.9 behaviours its docstring names, reproduced against real Redis, and the
same scenarios through ``RedisSubstrate``, which must not show them.

The first two tests assert coredis's behaviour as it is. If one of them starts failing
after a coredis upgrade, coredis has changed: read ``_redis_conn``'s docstring again and
consider its own pool."""

from __future__ import annotations

import secrets

import anyio
import coredis
import pytest
from coredis._concurrency import gather
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import result_key

from ..conftest import REDIS_URL, RawRedis

BACKENDS = ["trio", "asyncio"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_coredis_pool_loses_a_slot_per_cancelled_blocking_command(backend: str) -> None:
    outcome: list[str] = []

    async def main() -> None:
        client = coredis.Redis.from_url(REDIS_URL, max_connections=2, decode_responses=True)
        async with client:
            for _ in range(2):
                with anyio.move_on_after(0.1):
                    await client.blpop([f"test-nothing-{secrets.token_hex(4)}"], timeout=10)
            with anyio.move_on_after(2) as scope:
                await client.get("test-anything")
            outcome.append("hangs" if scope.cancelled_caught else "answers")

    anyio.run(main, backend=backend)
    assert outcome == ["hangs"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_coredis_pool_lets_a_cancelled_blpop_take_the_next_value(backend: str) -> None:
    tries, stolen = 30, 0

    async def main() -> None:
        nonlocal stolen
        raw = RawRedis(REDIS_URL)
        client = coredis.Redis.from_url(REDIS_URL, decode_responses=True)
        with anyio.fail_after(30):
            async with client:
                for _ in range(tries):
                    key = f"test-steal-{secrets.token_hex(4)}"
                    # two live connections: BLPOP leases one, RPUSH reuses the other at once
                    await gather(client.blpop(["test-warm"], timeout=0.01), client.ping())
                    with anyio.move_on_after(0.05):
                        await client.blpop([key], timeout=10)
                    await client.rpush(key, ["v"])
                    await anyio.sleep(0.05)
                    if await raw("LLEN", key) == 0:
                        stolen += 1
                    await raw("DEL", key)

    anyio.run(main, backend=backend)
    assert stolen > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_substrate_cancelled_waits_leak_nothing_and_take_nothing(backend: str) -> None:
    tries = 30

    async def main() -> None:
        raw = RawRedis(REDIS_URL)
        s = RedisSubstrate.from_url(REDIS_URL)
        with anyio.fail_after(30):
            async with s:
                for _ in range(tries):
                    job = f"job-{secrets.token_hex(4)}"
                    await gather(s.wait_result("pool-user", "test-warm", timeout_s=0.01), s.ping())
                    with anyio.move_on_after(0.05):
                        await s.wait_result("pool-user", job, timeout_s=10)
                    await s.publish_result("pool-user", job, "v", ttl_s=30)
                    await anyio.sleep(0.05)
                    assert await raw("LLEN", result_key("pool-user", job)) == 1
                    await raw("DEL", result_key("pool-user", job))
                await s.ping()  # no slot was lost to the cancelled waits

    anyio.run(main, backend=backend)
