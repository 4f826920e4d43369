"""One contract, three substrates: ``MemorySubstrate``, ``RedisSubstrate`` entered with
``async with`` (the hub's way) and ``RedisSubstrate`` used without it (one connection per
call). The checks themselves ship in the package (``deskbridge_hub.testing.check_substrate``,
the way trio ships its stream checks); this module gives each substrate a harness and runs
every check as its own test. The checks of the caller's path and the finishing step also
run on a single Redis in the Cluster's command layout ("redis-cluster-layout": the scripts
stay in the user's slot, the wake-up, progress and mailbox writes follow them), which a
single Redis serves as well; tests/hub/test_redis_cluster.py runs them on a real Cluster
but is too slow for mutation runs. Real time with tiny durations, every wait bounded by
``fail_after``; Redis is the test Redis, with unique user and job ids per check and their
keys deleted afterwards. Time-travel tests of the memory substrate live in
test_memory_substrate.py."""

from __future__ import annotations

import contextlib
import secrets
import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import jobs_key, mailbox_key, owner_key
from deskbridge_hub.testing import CHECKS, SubstrateHarness, check_substrate

from ..conftest import RawRedis


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def memory_harness() -> AsyncIterator[SubstrateHarness]:
    substrate = MemorySubstrate()

    async def delete_stream(user_id: str) -> None:
        substrate.delete_stream(user_id)

    async def wait_blocked(command: str) -> None:
        await trio.testing.wait_all_tasks_blocked()

    def make_unavailable() -> MemorySubstrate:
        substrate.set_unavailable(True)
        return substrate

    async def keys_of(user_id: str) -> list[str]:
        return substrate.keys_of(user_id)

    async def xdel(user_id: str, entry_id: str) -> None:
        substrate.delete_entry(user_id, entry_id)

    yield SubstrateHarness(
        substrate,
        delete_stream,
        wait_blocked,
        make_unavailable,
        spoil_key=substrate.spoil_key,
        keys_of=keys_of,
        xdel=xdel,
    )


@contextlib.asynccontextmanager
async def redis_harness(
    raw: RawRedis, url: str, *, entered: bool, cluster_layout: bool = False
) -> AsyncIterator[SubstrateHarness]:
    name = f"deskbridge-test-{secrets.token_hex(4)}"
    substrate = RedisSubstrate.from_url(url, client_name=name)
    substrate._cluster = cluster_layout  # one node holds every slot: no CROSSSLOT either way
    keys: list[str] = []
    users: list[str] = []
    port = _closed_port()

    async def blocked(command: str) -> bool:
        for line in (await raw("CLIENT", "LIST")).splitlines():
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
        cursor = "0"
        while True:
            cursor, some = await raw("SCAN", cursor, "MATCH", f"bridge:*{{{user_id}}}*")
            found.extend(some)
            if cursor == "0":
                return found

    harness = SubstrateHarness(
        substrate,
        delete_stream,
        wait_blocked,
        lambda: RedisSubstrate.from_url(f"redis://:hunter2@127.0.0.1:{port}/0"),
        is_blocked=blocked,
        unavailable_mentions=f"127.0.0.1:{port}",
        unavailable_secret="hunter2",
        raw=raw,
        on_user=users.append,
        on_job=lambda j: keys.append(owner_key(j)),
        on_mailbox=lambda m: keys.append(mailbox_key(m)),
        keys_of=keys_of,
    )
    try:
        if entered:
            async with substrate:
                yield harness
        else:
            yield harness
            await substrate.aclose()
    finally:
        for user in users:  # every key of a user and its jobs carries the user's tag
            cursor = "0"
            while True:
                cursor, found = await raw("SCAN", cursor, "MATCH", f"bridge:*{{{user}}}*")
                keys.extend(found)
                if cursor == "0":
                    break
        if keys:
            await raw("DEL", *keys)


#: The checks whose calls take another command layout under Cluster (submit, finish).
LAYOUT_CHECKS = sorted(
    name
    for name, fn in CHECKS.items()
    if fn.__module__.endswith(("._contract_caller", "._contract_finish", "._contract_room"))
)
RUNS = [
    (kind, name)
    for kind in ("memory", "redis", "redis-unentered", "redis-cluster-layout")
    for name in (LAYOUT_CHECKS if kind == "redis-cluster-layout" else sorted(CHECKS))
]


@pytest.mark.parametrize(("kind", "name"), RUNS, ids=[f"{k}-{n}" for k, n in RUNS])
async def test_substrate_contract(kind: str, name: str, raw_redis: RawRedis, redis_url: str):
    if kind == "memory":
        await check_substrate(memory_harness, only=[name])
    else:
        await check_substrate(
            lambda: redis_harness(
                raw_redis, redis_url, entered=kind != "redis-unentered",
                cluster_layout=kind == "redis-cluster-layout",
            ),
            only=[name],
        )  # fmt: skip
