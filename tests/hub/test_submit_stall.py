"""A caller's ``timeout_s`` while Redis stalls (a private redis-server frozen with
``DEBUG SLEEP`` or ``CLIENT PAUSE ... WRITE``): the call is answered within its
timeout plus ``ANSWER_GRACE_S``, not after the Redis command timeout (5 s); the answer
says the outcome is unknown and names the job; and the job never runs later (the submit
script, run when Redis wakes up, finds the caller's instant passed and writes nothing).
Every wait bounded with ``fail_after``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge, JobTimeout
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._retry import ANSWER_GRACE_S
from deskbridge_hub._substrate import jobs_key, state_key

from ..conftest import RawRedis
from ..procs import RedisServer

#: What the test allows beyond the call's own bound (a loaded 2-core machine).
SLACK_S = 0.3
USER = "stall-u1"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path, name="stall", extra=("--enable-debug-command", "yes"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


async def _frozen(raw: RawRedis) -> bool:
    with trio.move_on_after(0.1):
        await raw("PING")
        return False
    return True


@pytest.mark.parametrize("freeze", ["DEBUG SLEEP", "CLIENT PAUSE WRITE"])
async def test_a_call_is_answered_by_its_timeout_while_redis_stalls(
    server: RedisServer, freeze: str
) -> None:
    raw = RawRedis(server.url)
    async with RedisSubstrate.from_url(server.url, command_timeout_s=5.0) as substrate:
        bridge = Bridge(substrate, Timings())
        await substrate.set_presence(USER, "s1", 60)
        await substrate.set_catalogue(USER, '[{"name": "echo"}]')
        with trio.fail_after(5):  # caches the catalogue; the substrate reads Redis' clock
            warm = await bridge.dispatch(USER, "echo", {}, timeout_s=0.2)
        assert warm.status == "timeout" and warm.detail["stage"] == "queued"
        calls_before = await _evals(raw)
        async with trio.open_nursery() as nursery:
            if freeze == "DEBUG SLEEP":
                nursery.start_soon(raw, "DEBUG", "SLEEP", "3")
                with trio.fail_after(2):
                    while not await _frozen(raw):
                        pass
            else:
                await raw("CLIENT", "PAUSE", "3000", "WRITE")
            start = trio.current_time()
            with trio.fail_after(3), pytest.raises(JobTimeout) as info:
                await bridge.call(USER, "echo", {}, timeout_s=1)
            took = trio.current_time() - start
        assert took <= 1 + ANSWER_GRACE_S + SLACK_S, took  # was 5 s: the command timeout
        assert info.value.details["stage"] == "unknown"
        assert "outcome unknown" in str(info.value)
        job_id = info.value.job_id
        assert job_id is not None
        # Redis is awake again (the pause ended): the stalled script ran, found the
        # caller's instant passed, and wrote nothing. The job never runs.
        with trio.fail_after(5):
            await raw("SET", "stall-probe", "1")  # a write: waits out CLIENT PAUSE
            assert await _evals(raw) == calls_before + 1, "the stalled submit never ran"
            assert await raw("XLEN", jobs_key(USER)) == 1  # the warm-up's entry only
            assert await raw("EXISTS", state_key(USER, job_id)) == 0
            again = await bridge.dispatch(USER, "echo", {}, timeout_s=0.2)
        assert again.status == "timeout" and again.detail["stage"] == "queued"


async def _evals(raw: RawRedis) -> int:
    """Scripts Redis ran (EVAL + EVALSHA calls)."""
    total = 0
    for line in (await raw("INFO", "commandstats")).splitlines():
        if line.startswith(("cmdstat_eval:", "cmdstat_evalsha:")):
            fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
            total += int(fields["calls"])
    return total
