"""Redis reachable but unhealthy, behind a real hub (``--workers 1``), a real sidecar and a
real Redis: a black-holed connection (``_trio_proxy``: nothing forwarded, nothing closed),
a Redis that answers late (``DEBUG SLEEP``, ``CLIENT PAUSE``, a long Lua script), one at
``maxclients``, one refusing work (BUSY, MASTERDOWN, READONLY, OOM under noeviction).

For each: every caller gets a terminal, truthful answer within its ``timeout_s`` (never
``offline`` for the connected desktop, never a hang past it); ``/healthz`` answers 503
while it lasts (within its own short timeout: a probe that hangs is not an answer) and
200 after; a short fault keeps the desktop's session; after a long one the hub serves
again by itself; no job runs twice (the counting tool's ledger).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.chaos._harness import TIMINGS, headers
from tests.chaos._trio_proxy import BlackholeProxy, serve
from tests.procs import Hub, Ledger, RedisPoller, RedisServer, Sidecar, issue, running

pytestmark = pytest.mark.chaos

#: A caller's answer may come this long after its ``timeout_s`` (one look at the result
#: list, the stage: ``ANSWER_GRACE_S``, plus HTTP on a loaded machine).
LATE_S = 1.0
#: /healthz must answer within this (a load balancer's probe timeout).
HEALTHZ_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 4.0
ALLOWED = {"completed", "unavailable", "timeout", "online"}  # online: GET presence


@attrs.define
class Rig:
    hub: Hub
    redis: RedisServer
    proxy: BlackholeProxy
    user: str
    ledger: Ledger
    sidecar: Sidecar
    client: httpx.AsyncClient

    async def presence(self) -> dict[str, Any]:
        r = await self.client.get(f"{self.hub.http}/v1/users/{self.user}/presence", timeout=5)
        return r.json() if r.status_code == 200 else {}

    async def call(self, key: str, timeout_s: float = CALL_TIMEOUT_S) -> tuple[str, float]:
        """One call of the counting tool: (status, seconds it took)."""
        start = trio.current_time()
        body = {"name": "record", "args": {"key": key}, "idempotency_key": key}
        r = await self.client.post(
            f"{self.hub.http}/v1/users/{self.user}/jobs",
            json={**body, "timeout_s": timeout_s},
            timeout=timeout_s + 20,
        )
        return r.json().get("status", f"http {r.status_code}"), trio.current_time() - start

    async def healthz(self) -> int | str:
        try:
            r = await self.client.get(f"{self.hub.http}/healthz", timeout=HEALTHZ_TIMEOUT_S)
        except httpx.TimeoutException:
            return "hang"
        return r.status_code


@asynccontextmanager
async def rig(tmp_path: Path, *, redis_extra: tuple[str, ...] = ()) -> AsyncIterator[Rig]:
    redis = RedisServer(
        tmp_path, name="unhealthy", extra=("--enable-debug-command", "local", *redis_extra)
    )
    with running(redis):
        await trio.to_thread.run_sync(redis.wait_ready)
        async with serve(redis.port) as proxy:
            user = "unhealthy-" + secrets.token_hex(4)
            ledger = Ledger(tmp_path / "ledger.jsonl")
            hub = Hub(tmp_path, workers=1, env={**TIMINGS, "DESKBRIDGE_REDIS_URL": proxy.url()})
            sidecar = Sidecar(
                tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                env={**TIMINGS, **ledger.env()},
            )  # fmt: skip
            with running(sidecar, hub):
                await trio.to_thread.run_sync(hub.wait_healthy)
                async with httpx.AsyncClient(headers=headers()) as client:
                    r = Rig(hub, redis, proxy, user, ledger, sidecar, client)
                    with trio.fail_after(30):
                        while not (await r.presence()).get("online"):  # noqa: ASYNC110 - polls a real process
                            await trio.sleep(0.1)
                    yield r


async def _during(r: Rig, fault_s: float, n_calls: int = 3) -> tuple[list, list]:
    """Callers and /healthz probes while a fault of ``fault_s`` lasts."""
    answers: list[tuple[str, str, float]] = []
    health: list[int | str] = []

    async def one(key: str) -> None:
        status, took = await r.call(key)
        answers.append((key, status, took))

    async def probe() -> None:
        with trio.move_on_after(fault_s):
            while True:
                health.append(await r.healthz())
                await trio.sleep(0.25)

    async def look() -> None:  # GET presence: online, or 503, never "offline"
        end = trio.current_time() + fault_s
        while trio.current_time() < end:  # the last one is answered as the fault ends
            got = await r.client.get(
                f"{r.hub.http}/v1/users/{r.user}/presence", timeout=CALL_TIMEOUT_S + 10
            )
            said = {200: "offline", 503: "unavailable"}.get(got.status_code, "?")
            if got.status_code == 200 and got.json()["online"]:
                said = "online"
            answers.append(("presence", said, 0.0))
            await trio.sleep(0.25)

    with trio.fail_after(fault_s + CALL_TIMEOUT_S + 30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            nursery.start_soon(look)
            for i in range(n_calls):
                await trio.sleep(min(1.0, fault_s / (n_calls + 1)))
                nursery.start_soon(one, f"k-{i}-{secrets.token_hex(3)}")
    return answers, health


def _check(r: Rig, answers: list, health: list) -> None:
    counts = r.ledger.counts()
    for key, status, took in answers:
        assert status in ALLOWED, (key, status, took, answers)
        assert took <= CALL_TIMEOUT_S + LATE_S, (key, status, took, answers)
        assert counts.get(key, 0) == (1 if status == "completed" else counts.get(key, 0))
        assert counts.get(key, 0) <= 1, (key, r.ledger.events())
    assert 503 in health, health
    assert "hang" not in health, health


async def _after(r: Rig, session_before: str | None) -> None:
    """Ready again, a call completes, executed once; the session kept if given."""
    with trio.fail_after(20):
        while await r.healthz() != 200:  # noqa: ASYNC110 - polls a real process
            await trio.sleep(0.25)
    key = "after-" + secrets.token_hex(3)
    with trio.fail_after(30):
        while True:
            status, _ = await r.call(key, timeout_s=5)
            if status == "completed":
                break
            await trio.sleep(0.5)
    assert r.ledger.counts().get(key) == 1, r.ledger.events()
    if session_before is not None:
        assert (await r.presence()).get("session_id") == session_before


Fault = Callable[[Rig, float], Awaitable[None]]


async def _blackhole(r: Rig, seconds: float) -> None:
    r.proxy.blackhole()
    await trio.sleep(seconds)
    r.proxy.heal()


async def _debug_sleep(r: Rig, seconds: float) -> None:
    await trio.to_thread.run_sync(
        lambda: r.redis.command("DEBUG", "SLEEP", str(seconds), timeout_s=seconds + 10)
    )


async def _client_pause(r: Rig, seconds: float) -> None:
    r.redis.command("CLIENT", "PAUSE", str(int(seconds * 1000)), "ALL")
    await trio.sleep(seconds)


async def _busy_script(r: Rig, seconds: float) -> None:
    r.redis.command("CONFIG", "SET", "busy-reply-threshold", "200")
    script = (
        "local t0 = tonumber(redis.call('TIME')[1]) "
        "while tonumber(redis.call('TIME')[1]) < t0 + tonumber(ARGV[1]) do end return 1"
    )
    await trio.to_thread.run_sync(
        lambda: r.redis.command("EVAL", script, 0, str(int(seconds)), timeout_s=seconds + 10)
    )


async def _masterdown(r: Rig, seconds: float) -> None:
    r.redis.command("CONFIG", "SET", "replica-serve-stale-data", "no")
    r.redis.command("REPLICAOF", "127.0.0.1", "1")  # nothing listens on port 1
    await trio.sleep(seconds)
    r.redis.command("REPLICAOF", "NO", "ONE")


async def _oom(r: Rig, seconds: float) -> None:
    info = r.redis.command("INFO", "memory")
    used = int(info.split("used_memory:", 1)[1].split()[0])
    r.redis.command("CONFIG", "SET", "maxmemory", str(max(used // 2, 1024 * 1024)))
    r.redis.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    await trio.sleep(seconds)
    r.redis.command("CONFIG", "SET", "maxmemory", "0")


async def _maxclients(r: Rig, seconds: float) -> None:
    with RedisPoller(r.redis.url) as keeper:
        keeper.command("CONFIG", "SET", "maxclients", "1")
        keeper.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        keeper.command("CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes")
        await trio.sleep(seconds)
        keeper.command("CONFIG", "SET", "maxclients", "10000")


async def _loading(r: Rig, seconds: float) -> None:
    """DEBUG RELOAD of a data set loaded one key per 100 us: -LOADING meanwhile."""
    r.redis.command("DEBUG", "POPULATE", str(int(seconds * 10_000)), "filler")
    r.redis.command("CONFIG", "SET", "key-load-delay", "100")
    r.redis.command("CONFIG", "SET", "loading-process-events-interval-bytes", "1024")
    await trio.to_thread.run_sync(
        lambda: r.redis.command("DEBUG", "RELOAD", timeout_s=seconds * 5 + 10)
    )
    r.redis.command("CONFIG", "SET", "key-load-delay", "0")


FAULTS: dict[str, Fault] = {
    "blackhole": _blackhole,
    "debug-sleep": _debug_sleep,
    "client-pause": _client_pause,
    "busy-script": _busy_script,
    "loading": _loading,
    "masterdown": _masterdown,
    "oom": _oom,
    "maxclients": _maxclients,
}


#: Every fault for 3 s (sessions kept); for 12 s (sessions end, the hub recovers by itself)
#: the faults that leave the hub's connections hanging or refused, where recovery is its
#: own work: the others answer errors at once and recover as the short case shows.
CASES = [(name, 3.0) for name in FAULTS] + [
    (name, 12.0) for name in ("blackhole", "client-pause", "maxclients")
]


@pytest.mark.parametrize(
    ("name", "seconds"), CASES, ids=[f"{n}-{'short' if s < 10 else 'long'}" for n, s in CASES]
)
async def test_an_unhealthy_redis_is_answered_truthfully_and_recovered_from(
    tmp_path: Path, name: str, seconds: float
) -> None:
    async with rig(tmp_path) as r:
        assert (await r.call("warm-" + secrets.token_hex(3)))[0] == "completed"
        session = (await r.presence())["session_id"]
        result: dict[str, Any] = {}

        async def watch() -> None:
            result["answers"], result["health"] = await _during(r, seconds)

        with trio.fail_after(seconds + 60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await FAULTS[name](r, seconds)
        print(name, seconds, result)
        _check(r, result["answers"], result["health"])
        await _after(r, session if seconds < 5 else None)
