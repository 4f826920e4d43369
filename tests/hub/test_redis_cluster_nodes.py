"""One Redis Cluster node dead or removed must not break what does not need it: each test
starts its own Cluster (``running_cluster`` of ``test_redis_cluster``, on ports of
``$DESKBRIDGE_TEST_CLUSTER_PORTS``, default 7100-7199), kills or removes one node, and
checks that a user whose slot lives on a healthy node still gets the answer: the
heartbeat that loads its script on every primary, the readiness PING, and a pub/sub
message published through another node."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_slots import key_slot
from deskbridge_hub._substrate import Beat, presence_key

from ..conftest import RawRedis
from ..procs import Proc
from .test_redis_cluster import (
    ClusterRaw,
    _owns,
    running_cluster,
)

pytestmark = pytest.mark.integration

#: Slots of a dead primary stay unserved; the others go on serving theirs.
_PARTIAL = ("--cluster-require-full-coverage", "no")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[list[int], dict[int, Proc]]]:
    with running_cluster(tmp_path, 3, *_PARTIAL) as got:
        yield got


def _seeded(*ports: int) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/0"


async def _user_on(raw: ClusterRaw, ports: list[int]) -> str:
    """A user id whose slot one of ``ports`` serves."""
    while True:
        user = f"u-{secrets.token_hex(4)}"
        for port in ports:
            if await _owns(raw, port, key_slot(presence_key(user))):
                return user


async def test_the_heartbeat_loads_its_script_while_another_primary_is_dead(
    nodes: tuple[list[int], dict[int, Proc]],
) -> None:
    """The heartbeat meets NOSCRIPT (a fresh or restarted Cluster) and loads its script
    on every primary; one primary is dead, not the user's. SCRIPT LOAD raised the dead
    node's connection error, so the beat failed (a hub could not start, a NOSCRIPT
    reload never ended) though the user's node was healthy."""
    ports, procs = nodes
    raw = ClusterRaw(ports)
    user = await _user_on(raw, ports[:2])
    procs[ports[2]].signal_group(signal.SIGKILL)
    for port in ports[:2]:
        await RawRedis(f"redis://127.0.0.1:{port}/0")("SCRIPT", "FLUSH")
    with trio.fail_after(20):
        async with RedisSubstrate.from_url(_seeded(*ports[:2])) as s:
            (reply,) = await s.heartbeat(
                [Beat(user, "s1")], ttl_s=30, consumer="c1", reclaim_idle_ms=60_000
            )
    assert (reply.ours, reply.taken, reply.unavailable) == (True, True, None)
    assert await raw("GET", presence_key(user)) == "s1"


async def test_ping_and_publish_answer_while_the_first_seed_is_dead(
    nodes: tuple[list[int], dict[int, Proc]],
) -> None:
    """Keyless commands (PING for /healthz, PUBLISH) went to the first seed only: with
    that one node dead, readiness failed and every PUBLISH raised, though the other
    seeds serve the cluster."""
    ports, procs = nodes
    procs[ports[0]].signal_group(signal.SIGKILL)
    with trio.fail_after(20):
        async with RedisSubstrate.from_url(_seeded(*ports)) as s:
            await s.ping()
            assert await s.publish("bridge:test:keyless", "x") == 0
            await s.ping()
