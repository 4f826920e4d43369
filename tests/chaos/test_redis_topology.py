"""Redis's topology changes under the hub's connections, one connection kind at a time
(the whole-hub cases are ``test_redis_failover.py``): two real redis-servers, the
substrate (or a hub) reaching them through an endpoint that follows the primary
(``_trio_proxy``: new connections go where ``upstream_port`` says, open ones stay).

* The pub/sub subscriber: after a failover moved the endpoint, its connection still
  reaches the demoted node. When that node does not replicate the new primary (its link
  down: Sentinel reconfigured a node it cannot yet reach), nothing published on the new
  primary reached the subscriber, for as long as its connection lived.
* The caller's wait (the mailbox ``BLMPOP`` on a dedicated connection) across a failover
  with Sentinel's ``CLIENT KILL``: a caller waiting on a running job is answered
  ``completed`` promptly, not by its slow check of the result list.
* Presence lost with the failover (asynchronous replication: the new primary never got
  the newest handshake's write): how long the desktop, connected all along, reads
  ``offline`` on a hub process that does not hold it.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_pubsub import Message

from tests.chaos._harness import TIMINGS, headers
from tests.chaos._trio_proxy import BlackholeProxy, serve
from tests.procs import (
    Hub,
    Ledger,
    RedisPoller,
    RedisServer,
    Sidecar,
    issue,
    presence_key,
    running,
)

pytestmark = pytest.mark.chaos



def _synced(replica: RedisServer) -> bool:
    return "master_link_status:up" in replica.command("INFO", "replication")


async def _pair(a: RedisServer, b: RedisServer) -> None:
    """A primary, B its replica, in sync."""
    await trio.to_thread.run_sync(a.wait_ready)
    await trio.to_thread.run_sync(b.wait_ready)
    b.command("REPLICAOF", "127.0.0.1", str(a.port))
    with trio.fail_after(15):
        while not await trio.to_thread.run_sync(_synced, b):  # noqa: ASYNC110 - polls a real process
            await trio.sleep(0.1)


@pytest.mark.parametrize("stale", ["yes", "no"], ids=["readonly", "masterdown"])
async def test_the_subscriber_follows_an_endpoint_moved_to_the_new_primary(
    tmp_path: Path, stale: str
) -> None:
    """B promoted, A demoted without a link to B (``READONLY`` on writes, or
    ``MASTERDOWN`` with ``replica-serve-stale-data no``), the endpoint moved to B: once a
    command of the substrate has met the demoted node (the hub writes every second: its
    liveness key), the subscriber reconnects through the endpoint, its subscription is
    told of the gap and hears what is published on B."""
    a = RedisServer(tmp_path, name="primary", port=None)
    b = RedisServer(tmp_path, name="replica", port=None)
    channel = f"bridge:test:{secrets.token_hex(4)}"
    with running(a, b):
        await _pair(a, b)
        async with serve(a.port) as proxy:
            s = RedisSubstrate.from_url(proxy.url(), connect_timeout_s=1, command_timeout_s=2)
            with trio.fail_after(30):
                async with s, s.subscribe(channel) as messages:
                    assert await s.publish(channel, "before") == 1
                    assert await messages.__anext__() == Message(channel, "before")
                    b.command("REPLICAOF", "NO", "ONE")
                    a.command("CONFIG", "SET", "replica-serve-stale-data", stale)
                    a.command("REPLICAOF", "127.0.0.1", "1")  # nothing listens there
                    proxy.upstream_port = b.port
                    heard = 0
                    with trio.move_on_after(10):
                        while not heard:
                            with contextlib.suppress(SubstrateUnavailable):  # READONLY
                                await s.set_catalogue("topo-user", "{}")
                            await trio.sleep(0.25)
                            heard = b.command("PUBLISH", channel, "after")
                    assert heard == 1, "the subscriber stayed on the demoted node"
                    got = [await messages.__anext__(), await messages.__anext__()]
                    assert got == [Message(channel, None), Message(channel, "after")], got


@attrs.define
class HubRig:
    a: RedisServer
    b: RedisServer
    proxy: BlackholeProxy
    holder: Hub  # holds the desktop's socket
    other: Hub  # holds none: answers from presence alone
    user: str
    ledger: Ledger
    client: httpx.AsyncClient

    async def online(self, hub: Hub) -> bool | None:
        """What ``hub`` says of the desktop: True / False, None for a 503."""
        r = await self.client.get(f"{hub.http}/v1/users/{self.user}/presence", timeout=10)
        return r.json()["online"] if r.status_code == 200 else None

    async def call(
        self, key: str, *, seconds: float = 0.0, timeout_s: float = 8.0
    ) -> dict[str, Any]:
        body = {"name": "record", "args": {"key": key, "seconds": seconds}, "idempotency_key": key}
        r = await self.client.post(
            f"{self.holder.http}/v1/users/{self.user}/jobs",
            json={**body, "timeout_s": timeout_s},
            timeout=timeout_s + 20,
        )
        return {"http": r.status_code, **r.json()}

    async def fail_over(self) -> None:
        """What Sentinel does: B promoted, the endpoint moved to B, then on A in one
        transaction ``REPLICAOF`` B, ``CLIENT KILL TYPE normal`` and ``pubsub`` (so a
        blocked command's ``-UNBLOCKED`` never reaches the hub: its connection dies)."""
        self.b.command("REPLICAOF", "NO", "ONE")
        self.proxy.upstream_port = self.b.port
        with RedisPoller(self.a.url) as a:
            a.command("MULTI")
            a.command("REPLICAOF", "127.0.0.1", str(self.b.port))
            a.command("CLIENT", "KILL", "TYPE", "normal")
            a.command("CLIENT", "KILL", "TYPE", "pubsub")
            a.command("EXEC")


@contextlib.asynccontextmanager
async def hub_rig(
    tmp_path: Path,
    env: dict[str, str],
) -> AsyncIterator[HubRig]:
    """A primary, B its replica; two hub processes through an endpoint in front of A; a
    sidecar on the first, online. Every port is a free one."""
    a = RedisServer(tmp_path, name="primary", port=None)
    b = RedisServer(tmp_path, name="replica", port=None)
    with running(a, b):
        await _pair(a, b)
        async with serve(a.port) as proxy:
            user = "topo-" + secrets.token_hex(4)
            ledger = Ledger(tmp_path / "ledger.jsonl")
            hub_env = {**TIMINGS, **env, "DESKBRIDGE_REDIS_URL": proxy.url()}
            holder = Hub(tmp_path, workers=1, port=None, env=hub_env, name="holder")
            other = Hub(tmp_path, workers=1, port=None, env=hub_env, name="other")
            sidecar = Sidecar(
                tmp_path, holder.ws, issue(user), tools=["counting_tools"],
                env={**TIMINGS, **env, **ledger.env()},
            )  # fmt: skip
            with running(sidecar, holder, other):
                await trio.to_thread.run_sync(holder.wait_healthy)
                await trio.to_thread.run_sync(other.wait_healthy)
                async with httpx.AsyncClient(headers=headers()) as client:
                    r = HubRig(a, b, proxy, holder, other, user, ledger, client)
                    with trio.fail_after(30):
                        while not await r.online(other):  # noqa: ASYNC110 - a real process
                            await trio.sleep(0.1)
                    yield r


async def test_a_caller_waiting_across_a_failover_is_answered_promptly(tmp_path: Path) -> None:
    """A job runs 3 s; a second into it Redis fails over (the endpoint moves, Sentinel
    kills the old primary's clients). The caller's mailbox read reconnects through the
    endpoint and the holder's finishing write lands on the new primary: the caller is
    answered ``completed`` within a second of the tool's end (not after its result-list
    check, 2 s then 4 s apart), and the tool ran once."""
    async with hub_rig(tmp_path, {}) as r:
        assert (await r.call("warm-" + secrets.token_hex(3)))["status"] == "completed"
        key = "across-" + secrets.token_hex(3)
        got: dict[str, Any] = {}

        async def caller() -> None:
            got["answer"] = await r.call(key, seconds=3.0, timeout_s=15)
            got["at"] = trio.current_time()

        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                with trio.fail_after(10):
                    while not r.ledger.starts(key):  # noqa: ASYNC110 - a real process
                        await trio.sleep(0.05)
                await trio.sleep(1.0)
                await r.fail_over()
        assert got["answer"]["status"] == "completed", got
        (end,) = r.ledger.ends(key)
        print(got, end)
        assert r.ledger.counts()[key] == 1, r.ledger.events()
        ended_at = trio.current_time() - (time.time() - end["t"])
        assert got["at"] - ended_at < 1.0, (got, end)


async def test_presence_lost_with_a_failover_is_rewritten_within_seconds(tmp_path: Path) -> None:
    """The failover lost the desktop's presence (written last on the old primary, never
    replicated: here deleted on B as it is promoted). The holder keeps the socket; the
    other process answers from presence alone. It must read online again within 3 s of
    the failover, not a heartbeat later (10 s here), and a call completes."""
    env = {"DESKBRIDGE_HEARTBEAT_S": "10", "DESKBRIDGE_PRESENCE_TTL_S": "30"}
    async with hub_rig(tmp_path, env) as r:
        assert (await r.call("warm-" + secrets.token_hex(3)))["status"] == "completed"
        r.b.command("REPLICAOF", "NO", "ONE")
        r.b.command("DEL", presence_key(r.user))  # the write the failover lost
        await r.fail_over()
        start = trio.current_time()
        said: list[tuple[float, bool | None]] = []
        with trio.fail_after(20):
            while True:
                online = await r.online(r.other)
                said.append((round(trio.current_time() - start, 2), online))
                if online:
                    break
                await trio.sleep(0.2)
        print(said)
        assert said[-1][0] < 3.0, said
        key = "after-" + secrets.token_hex(3)
        assert (await r.call(key))["status"] == "completed"
        assert r.ledger.counts()[key] == 1
