"""RedisSubstrate on a real local Redis Cluster (issue 10 item 5): 3 primaries on free
loopback ports in 7100-7199 (``redis-server --cluster-enabled yes``, joined with
``redis-cli --cluster create ... --cluster-yes``), started by this module. The substrate
contract suite runs against ``redis+cluster://``; a user's slot is resharded by hand
(CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE) while the substrate is in
use, so it meets MOVED (and ASK while the slot migrates). The oracle is a RESP client
that follows MOVED itself; it shares no code with the substrate."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_slots import CrossSlot, batch_slot, key_slot
from deskbridge_hub._substrate import (
    index_key,
    jobs_key,
    presence_key,
    tools_key,
)
from deskbridge_hub.testing import CHECKS, SubstrateHarness, check_substrate

from ..conftest import RawRedis
from ..procs import Proc, wait_until

pytestmark = pytest.mark.integration


def test_key_slots_match_the_cluster_specification() -> None:
    from coredis._utils import hash_slot  # an independent implementation

    for key in ["foo", "bridge:jobs:{alice}", "{user1000}.following", "a{}b", "{}{x}", "é"]:
        assert key_slot(key) == hash_slot(key.encode())
    assert key_slot("bridge:jobs:{alice}") == key_slot("bridge:presence:{alice}")


def test_a_batch_across_slots_is_refused() -> None:
    one = (b"EVAL", "return 1", 2, jobs_key("alice"), index_key("alice"))
    assert batch_slot((one, (b"MULTI",), (b"GET", tools_key("alice")))) == key_slot("{alice}")
    with pytest.raises(CrossSlot, match="slot"):
        batch_slot(((b"GET", presence_key("alice")), (b"GET", presence_key("bob"))))
    with pytest.raises(CrossSlot):
        batch_slot(((b"EVAL", "return 1", 2, jobs_key("alice"), index_key("bob")),))


def _port_range() -> tuple[int, int]:
    """The ports the Cluster tests may use: ``$DESKBRIDGE_TEST_CLUSTER_PORTS``
    (``LOW-HIGH``, both included; for runs beside another suite), else 7100-7199."""
    low, _, high = os.environ.get("DESKBRIDGE_TEST_CLUSTER_PORTS", "7100-7199").partition("-")
    return int(low), int(high)


def _ports(n: int) -> list[int]:
    """``n`` ports of ``_port_range()`` free together with their cluster bus port
    (+10000)."""
    low, high = _port_range()
    size = high - low + 1
    found: list[int] = []
    start = low + secrets.randbelow(size)
    for i in range(size):
        port = low + (start - low + i) % size
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise RuntimeError(f"not enough free ports in {low}-{high}")


class ClusterRaw:
    """One command, following MOVED / ASK (a test oracle independent of the substrate)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    async def __call__(self, *command: Any, port: int | None = None) -> Any:
        port = port or self.ports[0]
        asking = False
        for _ in range(5):
            raw = RawRedis(f"redis://127.0.0.1:{port}/0")
            if asking:
                raw._setup.append(("ASKING",))  # same connection, just before the command
            try:
                return await raw(*command)
            except RuntimeError as exc:
                kind, _, rest = str(exc).partition(" ")
                if kind not in ("MOVED", "ASK"):
                    raise
                port, asking = int(rest.split(":")[-1]), kind == "ASK"
        raise AssertionError("too many redirections")

    async def each(self, *command: Any) -> list[Any]:
        return [await RawRedis(f"redis://127.0.0.1:{p}/0")(*command) for p in self.ports]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as (ports, _):
        yield ports


@contextlib.contextmanager
def running_cluster(
    tmp: Path, n: int = 3, *options: str, spare: int = 0
) -> Iterator[tuple[list[int], dict[int, Proc]]]:
    """A Cluster of ``n`` primaries (no replicas) on ports of ``_port_range()``, started
    with the extra redis-server ``options``, and ``spare`` more primaries that joined it
    serving no slot (their ports last); yields the ports and each node's process (a test
    may stop one). Stops every node on exit."""
    ports = _ports(n + spare)
    procs: dict[int, Proc] = {}
    try:
        for port in ports:
            workdir = tmp / str(port)
            workdir.mkdir()
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--save", "", "--appendonly", "no", "--dir", str(workdir),
                    *options]  # fmt: skip
            procs[port] = Proc(argv, {}, tmp / f"node-{port}.log")
        for port in ports:
            wait_until(lambda p=port: _ping(p), timeout_s=10, what=f"cluster node {port} up")
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports[:n]),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in ports[n:]:
            _cli(port, "CLUSTER", "MEET", "127.0.0.1", str(ports[0]))
        wait_until(
            lambda: all(_cluster_ok(p) and _knows(p, ports) for p in ports),
            timeout_s=30,
            what="cluster_state:ok, every node known to every node",
        )
        yield ports, procs
    finally:
        for proc in procs.values():
            proc.stop()


def _cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10
    )
    return out.stdout.strip()


def _ping(port: int) -> bool:
    return _cli(port, "PING") == "PONG"


def _cluster_ok(port: int) -> bool:
    return "cluster_state:ok" in _cli(port, "CLUSTER", "INFO")


def _knows(port: int, ports: list[int]) -> bool:
    listing = _cli(port, "CLUSTER", "NODES")
    return all(f"127.0.0.1:{p}@" in listing for p in ports)


def _url(ports: list[int]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:2]) + "/0"


@contextlib.asynccontextmanager
async def cluster_harness(ports: list[int], *, entered: bool) -> AsyncIterator[SubstrateHarness]:
    raw = ClusterRaw(ports)
    name = f"deskbridge-test-{secrets.token_hex(4)}"
    substrate = RedisSubstrate.from_url(_url(ports), client_name=name)

    async def blocked(command: str) -> bool:
        for listing in await raw.each("CLIENT", "LIST"):
            for line in listing.splitlines():
                info = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
                if info.get("name") == name and "b" in info.get("flags", ""):
                    if info.get("cmd") == command:
                        return True
        return False

    async def wait_blocked(command: str) -> None:
        with trio.fail_after(3):
            while not await blocked(command):  # noqa: ASYNC110 - polling Redis' own view
                await trio.sleep(0.005)

    async def delete_stream(user_id: str) -> None:
        assert await raw("DEL", jobs_key(user_id)) == 1

    async def keys_of(user_id: str) -> list[str]:
        found: list[str] = []
        for port in ports:  # the user's keys are on one node; look at every one
            found += await raw("KEYS", f"bridge:*{{{user_id}}}*", port=port)
        return found

    closed = _ports(1)[0]
    harness = SubstrateHarness(
        substrate,
        delete_stream,
        wait_blocked,
        lambda: RedisSubstrate.from_url(f"redis+cluster://:hunter2@127.0.0.1:{closed}/0"),
        is_blocked=blocked,
        unavailable_mentions=f"127.0.0.1:{closed}",
        unavailable_secret="hunter2",
        raw=raw,
        keys_of=keys_of,
    )
    if entered:
        async with substrate:
            yield harness
    else:
        yield harness
        await substrate.aclose()


#: Steps a Cluster does not take, so their checks do not apply: push delivery and the
#: submit script's liveness check read the holder's liveness key and push onto its wake
#: list, which are in the holder's slot, not the user's (docs/architecture.md, "Push
#: delivery"); tests/hub/test_redis_caller.py checks the Cluster's wake-up instead.
SINGLE_REDIS_ONLY = {
    "submit_pushes_the_read_and_marked_entry_to_a_registered_holder",
    "submit_to_a_holder_whose_liveness_is_gone_writes_nothing",
    "submit_pushes_while_the_group_has_fewer_pending_than_the_holder_takes",
}


@pytest.mark.parametrize("name", sorted(set(CHECKS) - SINGLE_REDIS_ONLY))
async def test_substrate_contract_on_a_cluster(name: str, cluster: list[int]) -> None:
    await check_substrate(lambda: cluster_harness(cluster, entered=True), only=[name])


async def _reshard(raw: ClusterRaw, key: str, ports: list[int], *, pause: Any) -> int:
    """Move ``key``'s slot to another primary by hand; returns the new owner's port.
    ``pause`` runs between the migration steps (the substrate works meanwhile)."""
    slot = key_slot(key)
    ids, source, target = await _start_migration(raw, slot, ports)
    await pause()
    await _finish_migration(raw, slot, ids, source, target, ports)
    return target


async def _start_migration(
    raw: ClusterRaw, slot: int, ports: list[int]
) -> tuple[dict[int, str], int, int]:
    """Set ``slot`` IMPORTING on another primary and MIGRATING on its owner; returns the
    node ids by port, the owner's port and the other's."""
    ids = {p: await raw("CLUSTER", "MYID", port=p) for p in ports}
    source = [p for p in ports if await _owns(raw, p, slot)][0]
    target = next(p for p in ports if p != source)
    await raw("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source], port=target)
    await raw("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target], port=source)
    return ids, source, target


async def _finish_migration(
    raw: ClusterRaw, slot: int, ids: dict[int, str], source: int, target: int, ports: list[int]
) -> None:
    """MIGRATE the keys of ``slot`` left on ``source``, then give the slot to ``target``
    on every node."""
    while keys := await raw("CLUSTER", "GETKEYSINSLOT", slot, 100, port=source):
        await raw("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys, port=source)
    for p in ports:
        await raw("CLUSTER", "SETSLOT", slot, "NODE", ids[target], port=p)


async def _owns(raw: ClusterRaw, port: int, slot: int) -> bool:
    for start, end, primary, *_ in await raw("CLUSTER", "SLOTS", port=port):
        if int(start) <= slot <= int(end) and int(primary[1]) == port:
            return True
    return False


async def test_a_user_keeps_working_while_its_slot_is_resharded(cluster: list[int]) -> None:
    raw = ClusterRaw(cluster)
    user, consumer = f"test-{secrets.token_hex(4)}", "c1"
    s = RedisSubstrate.from_url(_url(cluster))
    with trio.fail_after(30):
        async with s:
            await s.set_presence(user, "session-1", 30)
            first = await s.enqueue(user, {"job_id": "j1", "n": "1"}, maxlen=100)

            async def during_migration() -> None:  # slot MIGRATING: ASK for moved keys
                assert await s.get_presence(user) == "session-1"
                await s.set_catalogue(user, '["echo"]')

            await _reshard(raw, jobs_key(user), cluster, pause=during_migration)
            # the substrate's slot map is stale now: MOVED, then the new owner
            assert await s.get_presence(user) == "session-1"
            second = await s.enqueue(user, {"job_id": "j2", "n": "2"}, maxlen=100)
            got = await s.read_new(user, consumer, count=10, block_ms=1000)
            assert [e.entry_id for e in got] == [first, second]
            assert await s.ack(user, first) == 1 and await s.ack(user, second) == 1
            assert await s.get_catalogue(user) == '["echo"]'
    await raw("DEL", presence_key(user), jobs_key(user), index_key(user), tools_key(user))


async def test_a_redirected_batch_sends_again_only_what_did_not_run(cluster: list[int]) -> None:
    """While a slot migrates, one batch meets a key still on the source (runs there), a
    key already moved (ASK) and a multi-key command over both (TRYAGAIN until the
    migration ends). Every command that ran must have run once: resending the whole
    batch to the ASK node ran the first INCR twice (once per node), and every TRYAGAIN
    pause ran it again."""
    raw = ClusterRaw(cluster)
    tag = secrets.token_hex(4)
    here, moved = f"test:{{{tag}}}:here", f"test:{{{tag}}}:moved"
    slot = key_slot(here)
    await raw("SET", here, 0)
    await raw("SET", moved, 0)
    ids, source, target = await _start_migration(raw, slot, cluster)
    try:
        await raw("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", moved, port=source)
        with trio.fail_after(30):
            async with RedisSubstrate.from_url(_url(cluster)) as s, s._session("test") as session:
                first = await session.execute(
                    (b"INCR", here), (b"INCR", moved), (b"INCR", here), timeout_s=5
                )
                second = await session.execute((b"INCR", here), (b"MGET", here, moved), timeout_s=5)
        assert first == [1, 1, 2]
        assert second[0] == 3
        assert type(second[1]).__name__ == "TryAgainError"
        on_source = RawRedis(f"redis://127.0.0.1:{source}/0")
        assert await on_source("GET", here) == "3"
        on_target = RawRedis(f"redis://127.0.0.1:{target}/0")
        on_target._setup.append(("ASKING",))
        assert await on_target("GET", moved) == "1"
        assert await on_target("EXISTS", here) == 0  # never ran on the ASK node
    finally:
        await _finish_migration(raw, slot, ids, source, target, cluster)
        await raw("DEL", here, moved)


async def test_a_slot_migrating_for_a_second_is_waited_out(cluster: list[int]) -> None:
    """A multi-key command meets TRYAGAIN while its slot migrates key by key for about a
    second, then MOVED to the new owner: it succeeds. The retries used to end after 8 x
    50 ms, and every submit of a migrating user's was a 500 (a fault-injection helper
    saw 189 in five minutes)."""
    raw = ClusterRaw(cluster)
    tag = secrets.token_hex(4)
    here, moved = f"test:{{{tag}}}:here", f"test:{{{tag}}}:moved"
    slot = key_slot(here)
    await raw("SET", here, "1")
    await raw("SET", moved, "2")
    ids, source, target = await _start_migration(raw, slot, cluster)
    await raw("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", moved, port=source)

    async def finish_migration() -> None:
        await trio.sleep(1.0)
        await _finish_migration(raw, slot, ids, source, target, cluster)

    try:
        with trio.fail_after(30):
            async with RedisSubstrate.from_url(_url(cluster)) as s, s._session("t") as session:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(finish_migration)
                    got = await session.execute((b"MGET", here, moved), timeout_s=5)
        assert got == [["1", "2"]]
    finally:
        await raw("DEL", here, moved)


async def test_a_node_that_cannot_be_reached_is_passed_over_and_the_map_read_again(
    cluster: list[int],
) -> None:
    """A dead seed listed first, and a slot the map still gives to a dead node (a primary
    killed and replaced): a refused connect raised out of the slot-map read and out of
    the command, so the map was never read again and every command of that slot failed
    until the hub restarted (a review found it). Now the dead node is passed over, its
    commands answer its error as a value, and the map is read again within a second."""
    from coredis.exceptions import ConnectionError as RedisConnectionError

    raw = ClusterRaw(cluster)
    dead = ("127.0.0.1", _ports(1)[0])
    url = f"redis+cluster://{dead[0]}:{dead[1]}," + _url(cluster).split("://", 1)[1]
    key = f"test:{{{secrets.token_hex(4)}}}:k"
    await raw("SET", key, "v")
    try:
        with trio.fail_after(30):
            async with RedisSubstrate.from_url(url) as s, s._session("t") as session:
                assert await session.execute((b"GET", key), timeout_s=5) == ["v"]
                slot = key_slot(key)
                live_owner = session._slots[slot]
                session._slots[slot] = dead  # the map still names a node that is gone
                (failed,) = await session.execute((b"GET", key), timeout_s=5)
                assert isinstance(failed, RedisConnectionError | OSError), failed
                while session._slots[slot] == dead:  # noqa: ASYNC110 - the background read
                    await trio.sleep(0.05)
                assert session._slots[slot] == live_owner
                assert await session.execute((b"GET", key), timeout_s=5) == ["v"]
    finally:
        await raw("DEL", key)


async def test_one_node_that_forgot_the_heartbeat_script_costs_no_other_nodes_reply(
    cluster: list[int],
) -> None:
    """One primary restarted (or failed over) and forgot its scripts while the others
    kept theirs: the heartbeat resends only the calls that answered NOSCRIPT. Resending
    the whole write ran the other nodes' scripts twice, and their second answer lost
    ``taken`` (presence had been absent), so those sessions never rewrote their
    catalogue."""
    from deskbridge_hub._substrate import Beat

    raw = ClusterRaw(cluster)
    users = [f"forgot-{secrets.token_hex(4)}" for _ in range(24)]
    slots = {key_slot(presence_key(u)) for u in users}
    assert len(slots) > 3  # spread over slots, so over the three primaries
    with trio.fail_after(30):
        async with RedisSubstrate.from_url(_url(cluster)) as s:
            await s.heartbeat(
                [Beat(f"warm-{n}", "s") for n in range(12)], ttl_s=30, consumer="c1",
                reclaim_idle_ms=60_000,
            )  # fmt: skip
            await RawRedis(f"redis://127.0.0.1:{cluster[1]}/0")("SCRIPT", "FLUSH")
            replies = await s.heartbeat(
                [Beat(u, "s1") for u in users], ttl_s=30, consumer="c1", reclaim_idle_ms=60_000
            )
    assert [(r.ours, r.taken) for r in replies] == [(True, True)] * len(users)
    for user in users:
        assert await raw("GET", presence_key(user)) == "s1"
        await raw("DEL", presence_key(user))


async def test_a_beat_call_that_outlives_its_retries_fails_only_its_users(
    cluster: list[int],
) -> None:
    """One user's slot stays mid-migration (its keys split over two nodes: TRYAGAIN past
    the retries): the heartbeat answers ``unavailable`` for that user and the others'
    replies as they are (``taken`` included). It raised, losing the answers of the calls
    that ran (a fault-injection helper saw a whole batch of 9 sessions fail)."""
    from deskbridge_hub._substrate import Beat

    raw = ClusterRaw(cluster)
    users = [f"part-{secrets.token_hex(4)}" for _ in range(12)]
    victim = users[0]
    slot = key_slot(presence_key(victim))
    assert all(key_slot(presence_key(u)) != slot for u in users[1:])
    await raw("SET", presence_key(victim), "s0")
    await raw("SET", tools_key(victim), "[]")
    ids, source, target = await _start_migration(raw, slot, cluster)
    try:
        await raw(
            "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", tools_key(victim), port=source
        )
        with trio.fail_after(30):
            async with RedisSubstrate.from_url(_url(cluster)) as s:
                replies = await s.heartbeat(
                    [Beat(u, "s0") for u in users], ttl_s=30, consumer="c1",
                    reclaim_idle_ms=60_000,
                )  # fmt: skip
        assert replies[0].unavailable is not None and "rehashing" in replies[0].unavailable
        assert not replies[0].ours
        assert [(r.ours, r.taken, r.unavailable) for r in replies[1:]] == [(True, True, None)] * 11
    finally:
        await _finish_migration(raw, slot, ids, source, target, cluster)
        for user in users:
            await raw("DEL", presence_key(user), tools_key(user))


def test_a_job_runs_through_a_hub_on_the_cluster(
    cluster: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A real hub process and a real sidecar process, the hub on ``redis+cluster://``."""
    from ..procs import Hub, Sidecar, api, issue, running

    tmp = tmp_path_factory.mktemp("cluster-job")
    user = f"cluster-{secrets.token_hex(4)}"
    hub = Hub(tmp, workers=1, env={"DESKBRIDGE_REDIS_URL": _url(cluster)})
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp, hub.ws, issue(user))
        with running(sidecar), api() as client:

            def present() -> bool:
                r = client.get(f"{hub.http}/v1/users/{user}/presence")
                return r.status_code == 200 and r.json()["online"]

            wait_until(present, timeout_s=20, what="sidecar present")
            for n in range(5):
                r = client.post(
                    f"{hub.http}/v1/users/{user}/jobs",
                    json={"name": "echo", "args": {"n": n}, "timeout_s": 10},
                )
                assert r.status_code == 200, (r.text, hub.output()[-3000:])
                assert r.json()["result"] == {"n": n}


def test_the_single_redis_only_checks_exist() -> None:
    assert SINGLE_REDIS_ONLY <= set(CHECKS)
