"""Redis's topology changes under a connected hub: the primary named by
``DESKBRIDGE_REDIS_URL`` is demoted (a manual failover: its replica promoted with
``REPLICAOF NO ONE``, the old primary made its replica), so every write the hub sends
is answered ``-READONLY`` while reads still answer (``replica-serve-stale-data yes``,
the default). A real hub (``--workers 1``), a real sidecar and two real redis-servers.

While it lasts: callers are answered ``unavailable`` (or ``completed``), never
``offline`` for the connected desktop; ``GET .../presence`` says online or 503;
``/healthz`` 503; a job accepted before the demotion and running on the desktop
through it is answered once the node is primary again and ran once. After the URL's
node is primary again (the failover undone: what an operator, or Sentinel, does) the
hub serves again by itself: a call completes, ran once; a short demotion keeps the
desktop's session.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.chaos._harness import TIMINGS, headers
from tests.chaos._trio_proxy import serve
from tests.chaos.test_redis_unhealthy import Rig, _after, _check, _during
from tests.procs import Hub, Ledger, RedisServer, Sidecar, issue, running

pytestmark = pytest.mark.chaos



def _replicate(replica: RedisServer, primary: RedisServer) -> None:
    replica.command("REPLICAOF", "127.0.0.1", str(primary.port))


def _synced(replica: RedisServer) -> bool:
    info = replica.command("INFO", "replication")
    return "master_link_status:up" in info


async def _wait_synced(replica: RedisServer) -> None:
    with trio.fail_after(15):
        while not await trio.to_thread.run_sync(_synced, replica):  # noqa: ASYNC110 - polls a real process
            await trio.sleep(0.1)


@asynccontextmanager
async def pair_rig(
    tmp_path: Path, *, endpoint: bool = False
) -> AsyncIterator[tuple[Rig, RedisServer]]:
    """Hub on A (primary), B its replica; yields the rig (``r.redis`` is A) and B.
    ``endpoint``: the hub's URL names a TCP endpoint in front of A (``r.proxy``), which a
    test may point at B for new connections (a DNS name or virtual IP that Sentinel or a
    managed service moves to the new primary); connections already open stay on A."""
    a = RedisServer(tmp_path, name="primary", port=None)
    b = RedisServer(tmp_path, name="replica", port=None)
    with running(a, b):
        await trio.to_thread.run_sync(a.wait_ready)
        await trio.to_thread.run_sync(b.wait_ready)
        _replicate(b, a)
        await _wait_synced(b)
        if endpoint:
            async with serve(a.port) as proxy:
                async with _hub_rig(tmp_path, a, b, proxy.url(), proxy) as got:
                    yield got
        else:
            async with _hub_rig(tmp_path, a, b, a.url, None) as got:
                yield got


@asynccontextmanager
async def _hub_rig(
    tmp_path: Path, a: RedisServer, b: RedisServer, url: str, proxy: Any
) -> AsyncIterator[tuple[Rig, RedisServer]]:
    """A hub on ``url``, a sidecar connected to it, the user online."""
    user = "failover-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = Hub(
        tmp_path, workers=1, port=None,
        env={**TIMINGS, "DESKBRIDGE_REDIS_URL": url},
    )  # fmt: skip
    sidecar = Sidecar(
        tmp_path, hub.ws, issue(user), tools=["counting_tools"],
        env={**TIMINGS, **ledger.env()},
    )  # fmt: skip
    with running(sidecar, hub):
        await trio.to_thread.run_sync(hub.wait_healthy)
        async with httpx.AsyncClient(headers=headers()) as client:
            r = Rig(hub, a, proxy, user, ledger, sidecar, client)
            with trio.fail_after(30):
                while not (await r.presence()).get("online"):  # noqa: ASYNC110 - polls a real process
                    await trio.sleep(0.1)
            yield r, b


async def _demote(a: RedisServer, b: RedisServer) -> None:
    """Manual failover: B promoted, A made B's replica (the hub's URL names A)."""
    b.command("REPLICAOF", "NO", "ONE")
    _replicate(a, b)
    await _wait_synced(a)


async def _undo(a: RedisServer, b: RedisServer) -> None:
    """A primary again (B its replica): what Sentinel or an operator does."""
    a.command("REPLICAOF", "NO", "ONE")
    _replicate(b, a)


async def _slow_call(r: Rig, key: str, seconds: float, timeout_s: float) -> dict[str, Any]:
    body = {"name": "record", "args": {"key": key, "seconds": seconds}, "idempotency_key": key}
    got = await r.client.post(
        f"{r.hub.http}/v1/users/{r.user}/jobs",
        json={**body, "timeout_s": timeout_s},
        timeout=timeout_s + 20,
    )
    return {"http": got.status_code, **got.json()}


@pytest.mark.parametrize("seconds", [3.0, 12.0], ids=["short", "long"])
async def test_a_demoted_primary_is_answered_unavailable_and_recovered_from(
    tmp_path: Path, seconds: float
) -> None:
    async with pair_rig(tmp_path) as (r, b):
        assert (await r.call("warm-" + secrets.token_hex(3)))[0] == "completed"
        session = (await r.presence())["session_id"]
        result: dict[str, Any] = {}
        running_key = "running-" + secrets.token_hex(3)

        async def in_flight() -> None:  # accepted before, answered during the demotion
            result["running"] = await _slow_call(r, running_key, 1.0, seconds + 15)

        async def watch() -> None:
            result["answers"], result["health"] = await _during(r, seconds)

        with trio.fail_after(seconds + 60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_flight)
                with trio.fail_after(10):
                    while not r.ledger.counts().get(running_key):  # noqa: ASYNC110 - a real process
                        await trio.sleep(0.05)
                await _demote(r.redis, b)
                nursery.start_soon(watch)
                await trio.sleep(seconds)
                await _undo(r.redis, b)
        print(seconds, result)
        _check(r, result["answers"], result["health"])
        await _after(r, session if seconds < 5 else None)
        # the job accepted before: its caller was answered (``completed``, or
        # ``unavailable`` naming the job while its mailbox could not be read), and the
        # job is not lost: the same request again is attached to it and answered
        first = result["running"]
        assert first["status"] in ("completed", "unavailable"), first
        assert first["job_id"], first
        with trio.fail_after(20):
            again = await _slow_call(r, running_key, 1.0, 10)
        assert again["status"] == "completed" and again["job_id"] == first["job_id"], again
        assert r.ledger.counts()[running_key] == 1, r.ledger.events()


async def test_an_endpoint_moved_to_the_new_primary_is_followed_without_a_restart(
    tmp_path: Path,
) -> None:
    """The hub's URL names an endpoint (DNS name, virtual IP, TCP proxy) that follows the
    primary. A failover promotes B and the endpoint moves to B for new connections; the
    hub's open connections still reach A, now a replica (READONLY). The hub must serve
    again on the new primary within a bound, by itself (no restart), session kept or
    the sidecar back, every call ran at most once."""
    async with pair_rig(tmp_path, endpoint=True) as (r, b):
        assert (await r.call("warm-" + secrets.token_hex(3)))[0] == "completed"
        await _demote(r.redis, b)
        r.proxy.upstream_port = b.port  # the endpoint now names the new primary
        key = "moved-" + secrets.token_hex(3)
        answers = []
        with trio.fail_after(30):
            while True:
                status, _ = await r.call(key, timeout_s=3)
                answers.append(status)
                if status == "completed":
                    break
                assert status in ("unavailable", "timeout"), answers
                assert len(answers) < 8, answers  # about 15 s: not served again by itself
                await trio.sleep(1)
        assert r.ledger.counts()[key] == 1, r.ledger.events()
        with trio.fail_after(10):
            while await r.healthz() != 200:  # noqa: ASYNC110 - polls a real process
                await trio.sleep(0.25)
