"""The finishing step on Redis beyond the shared contract: which keys it writes, and
how it trims the job's progress stream. Run on
a single Redis in both command layouts: the single-Redis one (the script writes the
progress stream and the mailbox too) and the Cluster one (the script stays in the user's
slot, the progress stream and the mailbox follow in a second round trip), which a single
Redis runs as well. Real Redis (``DESKBRIDGE_TEST_REDIS_URL``), unique ids, every wait
bounded, keys deleted afterwards."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import (
    jobs_key,
    mailbox_key,
    progress_key,
    result_key,
    state_key,
)

from ..conftest import REDIS_URL, RawRedis


@pytest.fixture(params=["single", "cluster-layout"])
async def substrate(request: pytest.FixtureRequest) -> AsyncIterator[RedisSubstrate]:
    s = RedisSubstrate.from_url(REDIS_URL)
    # the Cluster's command layout, on one node (every key is on it, so no slot errors)
    s._cluster = request.param == "cluster-layout"
    async with s:
        yield s


async def _keys(raw: RawRedis) -> set[str]:
    found: set[str] = set()
    cursor = "0"
    for _ in range(100_000):  # bounded: SCAN ends when the cursor comes back to 0
        cursor, batch = await raw("SCAN", cursor, "COUNT", 1000)
        found.update(batch)
        if cursor == "0":
            return found
    raise AssertionError("SCAN never finished")


_READ = {
    "string": ("GET",),
    "list": ("LRANGE", 0, -1),
    "hash": ("HGETALL",),
    "stream": ("XRANGE", "-", "+"),
    "set": ("SMEMBERS",),
    "zset": ("ZRANGE", 0, -1, "WITHSCORES"),
}


async def _snapshot(raw: RawRedis) -> dict[str, Any]:
    """Every key of the test Redis with its value (a key written by an earlier test or
    run counts as written again when its value changes)."""
    values: dict[str, Any] = {}
    for key in await _keys(raw):
        kind = await raw("TYPE", key)
        if kind in _READ:
            command, *args = _READ[kind]
            values[key] = (kind, repr(await raw(command, key, *args)))
    return values


def _written(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {key for key, value in after.items() if before.get(key) != value}


@pytest.mark.parametrize("notify", [None, "box"])
@pytest.mark.parametrize("step", ["finish", "publish_result"])
async def test_finishing_writes_the_job_s_keys_and_only_the_mailbox_it_is_given(
    substrate: RedisSubstrate, raw_redis: RawRedis, step: str, notify: str | None
) -> None:
    """No caller to notify (``notify`` None), no mailbox written: not one named ``None``,
    not one named by a placeholder."""
    user, job = f"test-{secrets.token_hex(6)}", f"job-{secrets.token_hex(6)}"
    box = None if notify is None else f"box-{secrets.token_hex(4)}"
    state = JobState(Stage.FINISHED, user, at=1.0, session_id="s1")
    with trio.fail_after(10):
        await substrate.enqueue(user, {"job_id": job}, maxlen=100)
        (entry,) = await substrate.read_new(user, "c1", count=10, block_ms=None)
        before = await _snapshot(raw_redis)
        try:
            if step == "finish":
                await substrate.finish(
                    user, job, '{"status":"completed"}', state, ttl_s=60,
                    entry_id=entry.entry_id, notify=box,
                )  # fmt: skip
                written = {result_key(user, job), state_key(user, job)}
            else:
                await substrate.publish_result(
                    user, job, '{"status":"completed"}', ttl_s=60, notify=box
                )
                written = {result_key(user, job)}
            if box is not None:
                written.add(mailbox_key(box))
            assert _written(before, await _snapshot(raw_redis)) == written
        finally:
            new = (await _keys(raw_redis)) - set(before)
            await raw_redis("DEL", jobs_key(user), *new)


@pytest.mark.parametrize("step", ["finish", "publish_result"])
async def test_the_outcome_trims_the_progress_stream_as_progress_does(
    substrate: RedisSubstrate, raw_redis: RawRedis, step: str
) -> None:
    """The outcome's ``XADD ... MAXLEN ~ 64``, as ``publish_progress``'s default: whole
    stream nodes go, so with one node's worth of entries more than 64 exactly 64 stay
    (a bound of 65 would keep them all)."""
    user, job = f"test-{secrets.token_hex(6)}", f"job-{secrets.token_hex(6)}"
    _, node = await raw_redis("CONFIG", "GET", "stream-node-max-entries")
    state = JobState(Stage.FINISHED, user, at=1.0, session_id="s1")
    try:
        with trio.fail_after(20):
            for i in range(int(node) + 63):
                await substrate.publish_progress(job, str(i), ttl_s=30, maxlen=1000)
            if step == "finish":
                await substrate.finish(user, job, '{"status":"completed"}', state, ttl_s=30)
            else:
                await substrate.publish_result(user, job, '{"status":"completed"}', ttl_s=30)
        assert await raw_redis("XLEN", progress_key(job)) == 64
    finally:
        await raw_redis("DEL", progress_key(job), result_key(user, job), state_key(user, job))
