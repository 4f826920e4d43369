"""Redis's topology or connections change under a running hub, the cases
``test_redis_topology.py`` leaves (its rig):

* A bare ``REPLICAOF`` (no ``CLIENT KILL``): a blocked command is answered
  ``-UNBLOCKED ... instance state changed (master -> replica?)`` on a connection that
  stays open to the demoted node.
* The process holding the desktop's socket, after a failover that lost its presence:
  what it tells its own callers until its rewrite lands.
* ``CLIENT KILL TYPE pubsub`` / ``TYPE normal`` alone (no failover), under traffic.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._keys import wake_key
from deskbridge_hub._redis import RedisSubstrate
from prometheus_client import REGISTRY

from tests.chaos._trio_proxy import serve
from tests.chaos.test_redis_topology import _pair, hub_rig
from tests.procs import RedisServer, presence_key, running

pytestmark = pytest.mark.chaos



def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _blocked_on(server: RedisServer, command: str, *, unless: list[object]) -> None:
    """Until a client of ``server`` is blocked in ``command`` (or ``unless`` is not
    empty: the command was answered)."""
    with trio.fail_after(10):
        while not unless and f"cmd={command}" not in await trio.to_thread.run_sync(  # noqa: ASYNC110 - a real process
            server.command, "CLIENT", "LIST"
        ):
            await trio.sleep(0.05)


async def test_a_wake_up_wait_unblocked_by_a_demotion_goes_on_at_the_new_primary(
    tmp_path: Path,
) -> None:
    """The process's wake-up ``BLMPOP`` is blocked on A when B is promoted, the endpoint
    moved to B and A made B's replica by a bare ``REPLICAOF`` (no ``CLIENT KILL``): A
    answers it ``-UNBLOCKED``. Nothing was popped, so the wait goes on at once on a new
    connection through the endpoint, which reaches B, and pops the wake-up pushed there.
    The process's other connections reached A too: the next write goes to B. Was: the
    wait failed (the reader backs off), its connection, kept, answered the next wait
    ``READONLY`` (another failure, another back-off) before it was replaced, and the
    shared connection answered the next write ``READONLY`` (a caller's ``unavailable``)."""
    a = RedisServer(tmp_path, name="primary", port=None)
    b = RedisServer(tmp_path, name="replica", port=None)
    holder = "topo2-" + secrets.token_hex(4)
    with running(a, b):
        await _pair(a, b)
        async with serve(a.port) as proxy:
            s = RedisSubstrate.from_url(proxy.url(), connect_timeout_s=1, command_timeout_s=2)
            got: list[object] = []
            demoted = sample("deskbridge_redis_reconnects_total", reason="demoted")
            with trio.fail_after(30):
                async with s, trio.open_nursery() as nursery:

                    async def wait() -> None:
                        try:
                            got.append(await s.wait_wakes(holder, timeout_s=6, count=10))
                        except SubstrateUnavailable as exc:
                            got.append(exc)

                    await s.set_catalogue("topo2-user", "{}")  # a shared connection, on A
                    await trio.sleep(1.0)  # old enough to be retired on READONLY too
                    nursery.start_soon(wait)
                    await _blocked_on(a, "blmpop", unless=got)
                    b.command("REPLICAOF", "NO", "ONE")
                    proxy.upstream_port = b.port
                    a.command("REPLICAOF", "127.0.0.1", str(b.port))
                    await _blocked_on(b, "blmpop", unless=got)
                    b.command("RPUSH", wake_key(holder), "u1")
                # the other connections reached A too: closed, not kept for a READONLY
                await s.set_catalogue("topo2-user", "{}")
            assert got == [["u1"]], got
            # counted once: the one blocked command the demotion ended
            assert sample("deskbridge_redis_reconnects_total", reason="demoted") == demoted + 1
            assert s.history_changes() == 0  # not probed in the background here


async def test_the_holder_never_tells_its_own_callers_offline_after_a_failover(
    tmp_path: Path,
) -> None:
    """The failover lost the desktop's presence (written last on the old primary, never
    replicated: deleted on B as it is promoted). Until its rewrite lands, the process
    holding the socket answers its own callers from what Redis says: it must look again
    (its own writes may be lost: it has just seen another replication history), never
    say ``offline`` for a desktop connected to it. A call made at once completes (or is
    ``unavailable``); ``GET .../presence`` reads online (or 503)."""
    env = {"DESKBRIDGE_HEARTBEAT_S": "10", "DESKBRIDGE_PRESENCE_TTL_S": "30"}
    async with hub_rig(tmp_path, env) as r:
        assert (await r.call("warm-" + secrets.token_hex(3)))["status"] == "completed"
        r.b.command("REPLICAOF", "NO", "ONE")
        r.b.command("DEL", presence_key(r.user))  # the write the failover lost
        await r.fail_over()
        said: list[bool | None] = []
        answers: list[dict[str, Any]] = []

        async def call() -> None:
            answers.append(await r.call("at-once-" + secrets.token_hex(3)))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                for _ in range(15):
                    said.append(await r.online(r.holder))
                    await trio.sleep(0.2)
        print(said, answers)
        assert False not in said, said
        assert answers[0]["status"] in ("completed", "unavailable"), answers
        metrics = (await r.client.get(f"{r.holder.http}/metrics", timeout=10)).text
        assert "deskbridge_redis_history_changes_total 1.0" in metrics, metrics
        assert 'deskbridge_redis_reconnects_total{reason="dead"}' in metrics, metrics


@pytest.mark.parametrize("kind", ["pubsub", "normal"])
async def test_client_kill_alone_under_traffic_answers_every_call_once_and_promptly(
    tmp_path: Path, kind: str
) -> None:
    """No failover: ``CLIENT KILL TYPE pubsub`` (the processes' subscribers) or ``TYPE
    normal`` (every command and blocking connection) three times while three callers
    each make calls of 0.3 s jobs through the holder. Every call completes, within a
    second and a half of its job (a subscriber not restored would leave callers to
    their result-list check, 2 s then 4 s apart), each job runs once, and the desktop
    stays online on the other process."""
    async with hub_rig(tmp_path, {}) as r:
        assert (await r.call("warm-" + secrets.token_hex(3)))["status"] == "completed"
        answers: list[tuple[str, dict[str, Any], float]] = []

        async def caller(i: int) -> None:
            for j in range(8):
                key = f"kill-{i}-{j}-" + secrets.token_hex(3)
                start = trio.current_time()
                answer = await r.call(key, seconds=0.3, timeout_s=10)
                answers.append((key, answer, trio.current_time() - start))

        kills: list[int] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(caller, i)
                for _ in range(3):
                    await trio.sleep(0.7)
                    kills.append(
                        await trio.to_thread.run_sync(r.a.command, "CLIENT", "KILL", "TYPE", kind)
                    )
        print(kills, sorted(round(s, 2) for _, _, s in answers))
        # the hub holds no pub/sub connection (callers' notifications are a list, read
        # with BLMPOP: docs/operations.md "Failover"), so TYPE pubsub kills nothing
        assert all(kills) if kind == "normal" else kills == [0, 0, 0], kills
        late = [(k, a, round(s, 2)) for k, a, s in answers if s > 1.8]
        assert [a for _, a, _ in answers if a["status"] != "completed"] == []
        assert late == [], late
        counts = r.ledger.counts()
        assert {k: counts.get(k) for k, _, _ in answers} == {k: 1 for k, _, _ in answers}
        assert await r.online(r.other)
        # the subscribers are back: a call after the kills is answered by notification
        start = trio.current_time()
        assert (await r.call("after-" + secrets.token_hex(3), seconds=0.3))["status"] == (
            "completed"
        )
        assert trio.current_time() - start < 1.3
