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
from deskbridge_hub._redis_pubsub import Message, Subscription
from deskbridge_hub._redis_slots import key_slot
from deskbridge_hub._substrate import Beat, presence_key

from ..conftest import RawRedis
from ..procs import Proc
from .test_redis_cluster import (
    ClusterRaw,
    _finish_migration,
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


async def _until_message(s: RedisSubstrate, sub: Subscription, publish_port: int) -> list[Message]:
    """Publish on ``publish_port`` every 0.2 s until ``sub`` gets a message with data;
    returns what ``sub`` got (gaps included)."""
    got: list[Message] = []
    publisher = RawRedis(f"redis://127.0.0.1:{publish_port}/0")
    async with trio.open_nursery() as nursery:

        async def publish() -> None:
            n = 0
            while True:
                n += 1
                await publisher("PUBLISH", sub.name, f"m{n}")
                await trio.sleep(0.2)

        nursery.start_soon(publish)
        async for message in sub:
            got.append(message)
            if message.data is not None:
                break
        nursery.cancel_scope.cancel()
    return got


async def test_a_subscription_follows_the_cluster_when_its_node_dies(
    nodes: tuple[list[int], dict[int, Proc]],
) -> None:
    """The subscriber was the first seed's and reconnected only there: with that node
    dead, messages published through the others never arrived. Now it reconnects to
    another node, and the subscription gets a gap (re-read the durable state) before
    the messages."""
    ports, procs = nodes
    channel = f"bridge:test:{secrets.token_hex(4)}"
    with trio.fail_after(30):
        async with (
            RedisSubstrate.from_url(_seeded(*ports)) as s,
            s.subscribe(channel) as sub,
        ):
            assert (await _until_message(s, sub, ports[1]))[-1].data is not None
            procs[ports[0]].signal_group(signal.SIGKILL)
            got = await _until_message(s, sub, ports[1])
    assert got[0].data is None  # the gap: what was published meanwhile is lost
    assert got[-1].data is not None


async def test_a_subscription_leaves_a_node_removed_from_the_cluster(tmp_path: Path) -> None:
    """The subscriber's node gives its slots away and the others forget it (CLUSTER
    FORGET, as ``--cluster del-node`` does before it shuts the node down): the node
    still runs and the connection stays open, but it hears nothing published through
    the others. The subscriber stayed there; now the map read every few seconds moves
    it to a node that serves slots."""
    # an empty primary stays a primary (it would become a replica of the node that
    # took its last slot, and SETSLOT is for primaries)
    options = (*_PARTIAL, "--cluster-allow-replica-migration", "no")
    with running_cluster(tmp_path, 3, *options, spare=1) as (ports, _):
        raw = ClusterRaw(ports[:3])
        spare = ports[3]
        ids = {p: await raw("CLUSTER", "MYID", port=p) for p in ports}
        source = [p for p in ports[:3] if await _owns(raw, p, 0)][0]
        # the spare takes slot 0, the first of the map: the subscriber's node
        await _give_slot(raw, 0, source, spare, ids, ports)
        channel = f"bridge:test:{secrets.token_hex(4)}"
        with trio.fail_after(60):
            async with (
                RedisSubstrate.from_url(_seeded(spare, ports[0])) as s,
                s.subscribe(channel) as sub,
            ):
                assert (await _until_message(s, sub, ports[1]))[-1].data is not None
                await _give_slot(raw, 0, spare, source, ids, ports)
                for port in ports[:3]:
                    await raw("CLUSTER", "FORGET", ids[spare], port=port)
                got = await _until_message(s, sub, ports[1])
        assert got[0].data is None
        assert got[-1].data is not None


async def _give_slot(
    raw: ClusterRaw, slot: int, source: int, target: int, ids: dict[int, str], ports: list[int]
) -> None:
    """Move the empty ``slot`` from ``source`` to ``target`` (every node told)."""
    await raw("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source], port=target)
    await raw("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target], port=source)
    await _finish_migration(raw, slot, ids, source, target, ports)


async def _clients_named(port: int, name: str) -> int:
    listing = await RawRedis(f"redis://127.0.0.1:{port}/0")("CLIENT", "LIST")
    return sum(f" name={name} " in f" {line} " for line in listing.splitlines())


async def _slot_on_spare(
    raw: ClusterRaw, ports: list[int], key: str
) -> tuple[int, dict[int, str], int]:
    """Give ``key``'s slot to the spare node (``ports[3]``); its slot, the nodes' ids and
    the primary that served it (``source``)."""
    slot = key_slot(key)
    ids = {p: await raw("CLUSTER", "MYID", port=p) for p in ports}
    source = [p for p in ports[:3] if await _owns(raw, p, slot)][0]
    await _give_slot(raw, slot, source, ports[3], ids, ports)
    return slot, ids, source


async def _remove_spare(
    raw: ClusterRaw, ports: list[int], slot: int, ids: dict[int, str], source: int
) -> None:
    """The spare gives the slot back to ``source`` and the others forget it (it runs on)."""
    await _give_slot(raw, slot, ports[3], source, ids, ports)
    for port in ports[:3]:
        await raw("CLUSTER", "FORGET", ids[ports[3]], port=port)


async def test_connections_to_a_node_removed_from_the_cluster_are_closed(tmp_path: Path) -> None:
    """A node that served a user's slot gives it away and is forgotten by the others (it
    still runs): the hub's connections to it stayed open for the life of the process
    (and the node was still asked for maps). Now the MOVED that follows makes the hub
    read the whole map, and the sessions of nodes it no longer names are closed."""
    options = (*_PARTIAL, "--cluster-allow-replica-migration", "no")
    with running_cluster(tmp_path, 3, *options, spare=1) as (ports, _):
        raw = ClusterRaw(ports[:3])
        spare = ports[3]
        key = f"test:{{{secrets.token_hex(4)}}}:k"
        slot, ids, source = await _slot_on_spare(raw, ports, key)
        name = f"deskbridge-test-{secrets.token_hex(4)}"
        with trio.fail_after(30):
            async with (
                RedisSubstrate.from_url(_seeded(*ports[:2]), client_name=name) as s,
                s._session("t") as session,
            ):
                assert await session.execute((b"SET", key, "v"), timeout_s=5) == ["OK"]
                assert await _clients_named(spare, name) > 0
                await _remove_spare(raw, ports, slot, ids, source)
                assert await session.execute((b"GET", key), timeout_s=5) == ["v"]
                while await _clients_named(spare, name) > 0:  # noqa: ASYNC110 - Redis' view
                    await trio.sleep(0.1)
                assert await session.execute((b"GET", key), timeout_s=5) == ["v"]
        await raw("DEL", key)


async def test_keyless_commands_leave_a_first_seed_removed_from_the_cluster(tmp_path: Path) -> None:
    """Found by review: a first seed that gave its slots away and was forgotten (it still
    runs) kept every keyless batch (PING for /healthz, PUBLISH): /healthz passed and a
    PUBLISH reached nobody in the cluster. Keyless batches move to a primary of the map."""
    options = (*_PARTIAL, "--cluster-allow-replica-migration", "no")
    with running_cluster(tmp_path, 3, *options, spare=1) as (ports, _):
        raw = ClusterRaw(ports[:3])
        spare = ports[3]
        key = f"test:{{{secrets.token_hex(4)}}}:k"
        slot, ids, source = await _slot_on_spare(raw, ports, key)
        with trio.fail_after(30):
            async with (
                RedisSubstrate.from_url(_seeded(spare, ports[0])) as s,
                s._session("t") as session,
            ):
                assert await session.execute((b"SET", key, "v"), timeout_s=5) == ["OK"]
                assert await session.execute((b"CLUSTER", b"MYID"), timeout_s=5) == [ids[spare]]
                await _remove_spare(raw, ports, slot, ids, source)
                assert await session.execute((b"GET", key), timeout_s=5) == ["v"]  # MOVED
                while True:  # the MOVED's map read runs in the background
                    (answered,) = await session.execute((b"CLUSTER", b"MYID"), timeout_s=5)
                    if answered != ids[spare]:
                        break
                    await trio.sleep(0.1)
                assert answered in {ids[p] for p in ports[:3]}
        await raw("DEL", key)
