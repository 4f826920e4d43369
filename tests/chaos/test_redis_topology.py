"""Redis's topology changes under the hub's connections, one connection kind at a time
(the whole-hub cases are ``test_redis_failover.py``): two real redis-servers, the
substrate (or a hub) reaching them through an endpoint that follows the primary
(``_trio_proxy``: new connections go where ``upstream_port`` says, open ones stay).

* The pub/sub subscriber: after a failover moved the endpoint, its connection still
  reaches the demoted node. When that node does not replicate the new primary (its link
  down: Sentinel reconfigured a node it cannot yet reach), nothing published on the new
  primary reached the subscriber, for as long as its connection lived.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_pubsub import Message

from tests.chaos._trio_proxy import serve
from tests.procs import RedisServer, running

pytestmark = pytest.mark.chaos

#: this suite's own ports (a shared machine)
REDIS_A, REDIS_B = 7334, 7335


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
    a = RedisServer(tmp_path, name="primary", port=REDIS_A)
    b = RedisServer(tmp_path, name="replica", port=REDIS_B)
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
