"""A submit Redis answered with an error reply that proves it wrote nothing: the
answer, ``GET /v1/jobs/{id}`` and a retry agree with what the hub knows.

Redis (>= 7.0) fails a script without flags (the submit script) on a refusing server
state (out of memory under noeviction: OOM; too few replicas: NOREPLICAS; a replica:
READONLY; a failed snapshot: MISCONF) only at its *first write*, and once a script has
written it is never failed on that state (``scriptVerifyWriteCommandAllow`` and
``scriptVerifyOOM`` in Redis' script.c). The submit script reads everything first
(including whether its own job is already there: ``Submission.own``), so such a reply
proves the job was not enqueued. Before: the call was answered 503 naming a job id the
hub had minted, "stage unknown", and ``GET /v1/jobs/{that id}`` said 404. A private
redis-server per test (the refusals are server-wide). A claim whose reply was lost:
tests/hub/test_lost_claim_reply.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from deskbridge_hub import Bridge, SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import jobs_key, owner_key, presence_key, proc_key

from ..procs import RedisServer

pytestmark = pytest.mark.integration

#: (what, how to make Redis refuse writes, how to undo it)
REFUSALS = [
    ("OOM", ("CONFIG", "SET", "maxmemory", "1"), ("CONFIG", "SET", "maxmemory", "0")),
    (
        "NOREPLICAS",
        ("CONFIG", "SET", "min-replicas-to-write", "1"),
        ("CONFIG", "SET", "min-replicas-to-write", "0"),
    ),
    ("READONLY", ("REPLICAOF", "127.0.0.1", "1"), ("REPLICAOF", "NO", "ONE")),
]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, name="refused")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


async def _online(redis: RedisServer, user: str) -> None:
    redis.command("SET", presence_key(user), f"h-{user}.s1", "PX", 60_000)
    redis.command("SET", proc_key(f"h-{user}"), "c1 32", "PX", 60_000)


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_a_submit_refused_before_its_first_write_names_no_job(
    redis_server: RedisServer, refusal: tuple[str, tuple[str, ...], tuple[str, ...]]
) -> None:
    code, bad, good = refusal
    user = f"refused-{secrets.token_hex(4)}"
    await _online(redis_server, user)
    with trio.fail_after(20):
        async with RedisSubstrate.from_url(redis_server.url) as s:
            bridge = Bridge(s)
            assert await s.get_presence(user) is not None
            redis_server.command(*bad)
            try:
                with pytest.raises(SubstrateUnavailable) as info:
                    await bridge.dispatch(user, "echo", {}, timeout_s=2)
            finally:
                redis_server.command(*good)
    assert code in str(info.value)
    # was: the hub-minted id, answered "stage unknown", which GET then did not find
    assert info.value.job_id is None, info.value.job_id
    assert info.value.refused
    assert "nothing was enqueued" in str(info.value)
    assert redis_server.command("EXISTS", jobs_key(user)) == 0


async def test_a_claimed_id_whose_submit_was_refused_is_free_again(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's id was claimed, then Redis refused the submit (out of memory): the
    short answer (no "stage unknown"), and the id is free for the retry."""
    user = f"refused-{secrets.token_hex(4)}"
    await _online(redis_server, user)
    with trio.fail_after(20):
        async with RedisSubstrate.from_url(redis_server.url) as s:
            bridge = Bridge(s)
            claim = s.claim_job_id

            async def claim_then_refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
                claimed = await claim(*args, **kwargs)
                redis_server.command(*REFUSALS[0][1])
                return claimed

            monkeypatch.setattr(s, "claim_job_id", claim_then_refuse)
            try:
                with pytest.raises(SubstrateUnavailable) as info:
                    await bridge.dispatch(user, "echo", {}, job_id="order-9", timeout_s=2)
            finally:
                redis_server.command(*REFUSALS[0][2])
            assert info.value.job_id is None  # was "order-9": look it up (404)
            assert redis_server.command("EXISTS", owner_key("order-9")) == 0  # was claimed
            monkeypatch.undo()
            again = await bridge.dispatch(user, "echo", {}, job_id="order-9", timeout_s=0.5)
            assert (again.job_id, again.status) == ("order-9", "timeout")  # queued, no desktop
