"""Concurrent requests about one job must each get the truth, with one side effect.

* Two cancels of one running job at the same instant: the cancel flag said "send a
  control entry" to both (``request_cancel`` was a SET NX + GET, the "sent" mark a later
  write), so each wrote an indexed ``control: cancel`` entry, taking room meant for
  accepted jobs. Now the flag and its one control entry are one atomic step
  (``Substrate.send_cancel``).
* Two copies of one request naming its own job id (another replica, a retry): the copy
  that claimed the id was refused (``offline``) and deleted its claim, while the other
  copy enqueued the job and claimed the id again (SET NX, refused: the first claim was
  still there); the delete landed after that re-claim, and the running job's id had no
  owner record (``GET``/``DELETE /v1/jobs/{id}`` 404, and the id free for another job).
  Now a claim is dropped only if it is still the one its copy wrote, and a copy that
  enqueued rewrites the claim as its own.

Both substrates: real Redis (``DESKBRIDGE_TEST_REDIS_URL``) and ``MemorySubstrate``.
Real time, every wait bounded by ``fail_after``."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import Bridge, MemorySubstrate
from deskbridge_hub._bridge_jobs import USER_SEPARATOR
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import Substrate, jobs_key

from ..conftest import RawRedis
from .redis_kit import delete_tagged


@contextlib.asynccontextmanager
async def _substrate(kind: str, redis_url: str, user: str) -> AsyncIterator[Substrate]:
    if kind == "memory":
        yield MemorySubstrate()
        return
    raw = RawRedis(redis_url)
    async with RedisSubstrate.from_url(redis_url) as sub:
        try:
            yield sub
        finally:
            await delete_tagged(raw, user)


async def _controls(sub: Substrate, redis_url: str, user: str) -> list[dict[str, str]]:
    """The ``control: cancel`` entries on ``user``'s stream."""
    if isinstance(sub, MemorySubstrate):
        entries = list(sub._streams[user].entries.values()) if user in sub._streams else []
    else:
        flat = await RawRedis(redis_url)("XRANGE", jobs_key(user), "-", "+")
        entries = [dict(zip(f[::2], f[1::2], strict=True)) for _, f in flat]
    return [e for e in entries if e.get("control") == "cancel"]


def _barrier(parties: int, bound_s: float) -> Any:
    """An awaitable each caller passes once ``parties`` callers reached it (or after
    ``bound_s``, so a fixed code path that reaches it once does not hang)."""
    arrived = [0]
    all_here = trio.Event()

    async def wait() -> None:
        arrived[0] += 1
        if arrived[0] >= parties:
            all_here.set()
        with trio.move_on_after(bound_s):
            await all_here.wait()

    return wait


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_two_cancels_at_once_of_a_running_job_write_one_control_entry(
    kind: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = f"cancel2-{secrets.token_hex(4)}"
    job = f"{secrets.token_hex(16)}{USER_SEPARATOR}{user}"
    async with _substrate(kind, redis_url, user) as sub:
        bridge = Bridge(sub, Timings())
        await sub.set_presence(user, "ghost", 3600)  # looks online, nobody reads
        await sub.claim_job(user, job, JobState(Stage.DELIVERED, user), ttl_s=600)
        both_read = _barrier(2, 1.0)
        get_state = sub.get_job_state

        async def read_then_meet(user_id: str, job_id: str) -> JobState | None:
            state = await get_state(user_id, job_id)
            await both_read()  # both cancels read "delivered" before either writes
            return state

        monkeypatch.setattr(sub, "get_job_state", read_then_meet)
        stages: list[str] = []

        async def cancel() -> None:
            stages.append(await bridge.cancel(job))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel)
                nursery.start_soon(cancel)
        monkeypatch.undo()
        assert stages == ["delivered", "delivered"]  # both requested: 202 each
        controls = await _controls(sub, redis_url, user)
        assert controls == [{"control": "cancel", "job_id": job}], "one control entry per job"
        # later cancels still write none, and the flag still refuses a delivery
        assert await bridge.cancel(job) == "delivered"
        assert len(await _controls(sub, redis_url, user)) == 1
        marked = await sub.mark_delivered(
            user, job, JobState(Stage.DELIVERED, user), ttl_s=60, deadline=None
        )
        assert marked.verdict == "in_doubt"


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_refused_copy_s_late_claim_delete_leaves_the_other_copy_s_job_its_id(
    kind: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first copy claims the id and is refused ``offline`` (no desktop yet); its
    claim delete is held in flight. The desktop comes; the second copy (same replica,
    so the same mailbox: its owner record reads the same) goes on as the claimer,
    enqueues the job and claims the id again. Then the delete lands. The id must still
    name the running job: a cancel finds it and its caller is answered ``cancelled``."""
    user = f"copies-{secrets.token_hex(4)}"
    job = f"order-{secrets.token_hex(4)}"
    async with _substrate(kind, redis_url, user) as sub:
        bridge = Bridge(sub, Timings())
        forget, claim = sub.forget_job_id, sub.claim_job_id
        deleting, land, reclaimed, first_done = (trio.Event() for _ in range(4))
        claims: list[bool] = []

        async def held_forget(*args: Any, **kwargs: Any) -> None:
            deleting.set()
            await land.wait()
            await forget(*args, **kwargs)

        async def counted_claim(*args: Any, **kwargs: Any) -> bool:
            claimed = await claim(*args, **kwargs)
            claims.append(claimed)
            if len(claims) == 3:  # first's claim, second's claim, its re-claim
                reclaimed.set()
            return claimed

        monkeypatch.setattr(sub, "forget_job_id", held_forget)
        monkeypatch.setattr(sub, "claim_job_id", counted_claim)
        outcomes: dict[str, Any] = {}

        async def copy(name: str) -> None:
            outcomes[name] = await bridge.dispatch(
                user, "echo", {"n": 1}, job_id=job, timeout_s=30
            )
            if name == "first":
                first_done.set()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(copy, "first")
                await deleting.wait()  # refused offline; its delete is in flight
                await sub.set_presence(user, "ghost", 3600)  # the desktop comes
                nursery.start_soon(copy, "second")
                await reclaimed.wait()
                land.set()  # the first copy's delete lands after the re-claim
                await first_done.wait()
                assert outcomes["first"].status == "offline"
                owner = await sub.job_owner(job)
                assert owner is not None and owner.user_id == user, "the job lost its id"
                assert await bridge.cancel(job) == "queued"  # was: UnknownJob (404)
        assert outcomes["second"].status == "cancelled"
        assert outcomes["second"].job_id == job


async def test_a_cancel_of_a_running_job_whose_state_was_rewound_gets_the_desktop_s_answer(
    autojump_clock: Any,
) -> None:
    """A store that lost its last writes (an older snapshot, a replica promoted without
    them) rewinds a job running on the desktop to ``queued`` and drops its claim epoch.
    The cancel read ``queued`` and answered the job's caller ``cancelled`` at once,
    while the tool (a sync one: it cannot be interrupted) ran on and completed; its
    answer was dropped (the job had one). Now, while a live hub process holds the user's
    socket, that holder answers: the job is in flight there, so the cancel frame goes to
    the desktop, and the desktop's answer (``completed``) is the caller's. It ran once;
    the caller and the canceller each got a terminal, true answer. (MemorySubstrate, a
    real hub session and reader, a fake sidecar; MockClock.)"""
    from deskbridge_common import Cancel, Job, JobResult
    from deskbridge_hub._session import HubState
    from deskbridge_hub._substrate import fence_key

    from tests.hub.test_outcomes import connect, sidecar
    from tests.hub.test_session import wall

    sub = MemorySubstrate(clock=wall)
    state = HubState(substrate=sub, timings=Timings(), consumer="hub-1", wall_clock=wall)
    bridge = Bridge(sub, state.timings, wall_clock=wall)
    ran: list[str] = []
    cancels: list[str] = []
    arrived = trio.Event()
    outcomes: list[Any] = []
    answered = trio.Event()
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def sync_tool(frame: Any) -> None:  # a thread: a cancel cannot stop it
            if isinstance(frame, Cancel):
                cancels.append(frame.id)
            elif isinstance(frame, Job):
                ran.append(frame.job_id)
                arrived.set()
                await trio.sleep(20)
                await peer.send(JobResult(frame.id, True, {"done": True}))

        nursery.start_soon(sidecar, peer, sync_tool)

        async def caller() -> None:
            outcomes.append(
                await bridge.dispatch("u1", "click", {}, job_id="job-rw", timeout_s=600)
            )
            answered.set()

        nursery.start_soon(caller)
        with trio.fail_after(30):
            await arrived.wait()
        # the store rewinds: the job's state back to queued, its claim epoch gone
        queued = JobState(Stage.QUEUED, "u1", at=wall(), reply_to=bridge.waiters.mailbox)
        await sub.set_job_state("u1", "job-rw", queued, ttl_s=600)
        sub._kv.pop(fence_key("u1", "job-rw"), None)
        assert await bridge.cancel("job-rw") == "queued"  # 202: requested
        with trio.fail_after(60):
            await answered.wait()
        nursery.cancel_scope.cancel()
    assert [o.status for o in outcomes] == ["completed"], outcomes  # was: cancelled
    assert ran == ["job-rw"]  # executed exactly once
    assert len(cancels) == 1  # the holder sent the cancel frame to the desktop
