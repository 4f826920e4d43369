"""Who answers a cancelled queued job, and when nobody can know whether it ran.

* A cancel of a ``queued`` job returns ``queued`` (202) and leaves the answer to the live
  hub process holding the desktop's socket (only it knows whether the job runs). A
  holder that died before answering (killed, its liveness key lapsing 3 s later) left
  the job ``queued``: its caller was answered only at its timeout (``timeout``, stage
  ``queued``) or by the desktop's next session, and ``GET /v1/jobs/{id}`` said
  ``queued`` about a job that can never start. Now the cancel waits for the holder's
  answer, within the liveness key's TTL and its second look, and answers itself when
  that holder is found dead.
* A store that lost its last writes (a failover to a replica that lagged, an older
  snapshot) can rewind a job running on a desktop to ``queued`` and lose the presence or
  the holder's liveness key with it. The cancel then found no live holder and answered
  ``cancelled`` at once, about a job that ran. The process knows when the store changed
  under it (``_own_liveness``: an absent presence proves nothing then, as a call's
  ``offline`` does not); the cancel now uses that same decision (``live_session``) and,
  in doubt, answers nothing itself: ``queued`` (202), the holder or the entry's next
  reader answers.

Memory substrate on MockClock; the holder-gone case also against real Redis (real time,
bounded by ``fail_after``)."""

from __future__ import annotations

import secrets
from typing import Any

import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge, MemorySubstrate
from deskbridge_hub._jobstate import Stage
from deskbridge_hub._own_liveness import own_liveness
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._retry import PROCESS_LIVENESS_TTL_S
from deskbridge_hub._substrate import Substrate

from ..conftest import RawRedis
from .redis_kit import delete_tagged
from .test_session import wall

#: What "promptly" allows: the holder's liveness key lapsing (3 s), a second look (1 s)
#: and a few steps; the caller's timeout is 600 s.
PROMPT_S = 8.0


async def _queued_call(
    sub: Substrate, bridge: Bridge, user: str, job: str, nursery: trio.Nursery
) -> tuple[dict[str, Any], trio.Event]:
    """A call of ``job`` waiting (600 s) on ``user``'s desktop; once its job is queued."""
    got: dict[str, Any] = {}
    answered = trio.Event()

    async def call() -> None:
        got["outcome"] = await bridge.dispatch(user, "echo", {}, job_id=job, timeout_s=600)
        got["at"] = trio.current_time()
        answered.set()

    nursery.start_soon(call)
    with trio.fail_after(10):  # the store is polled: no event tells the enqueue
        while await sub.get_job_state(user, job) is None:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return got, answered


async def _holder_dies_after_the_cancel(sub: Substrate, bridge: Bridge, user: str) -> None:
    job = f"job-{secrets.token_hex(4)}"
    holder = f"hub-{secrets.token_hex(4)}"
    await sub.set_presence(user, f"{holder}.s1", 90)
    # alive when the cancel looks, never refreshed again: the process was killed
    await sub.set_liveness(holder, PROCESS_LIVENESS_TTL_S)
    async with trio.open_nursery() as nursery:
        got, answered = await _queued_call(sub, bridge, user, job, nursery)
        t0 = trio.current_time()
        assert await bridge.cancel(job) == "queued"  # 202: requested
        with trio.fail_after(PROMPT_S * 2):  # was: the caller's 600 s timeout
            await answered.wait()
    assert got["outcome"].status == "cancelled", got
    assert got["at"] - t0 < PROMPT_S
    state = await sub.get_job_state(user, job)
    assert state is not None and state.stage is Stage.CANCELLED  # what GET says


async def test_a_cancel_left_to_a_holder_that_dies_is_answered_cancelled(
    autojump_clock: Any,
) -> None:
    sub = MemorySubstrate(clock=wall)
    await _holder_dies_after_the_cancel(sub, Bridge(sub, Timings(), wall_clock=wall), "u1")


async def test_a_cancel_left_to_a_holder_that_dies_is_answered_cancelled_redis(
    redis_url: str,
) -> None:
    user = f"holdergone-{secrets.token_hex(4)}"
    async with RedisSubstrate.from_url(redis_url) as sub:
        try:
            await _holder_dies_after_the_cancel(sub, Bridge(sub, Timings()), user)
        finally:
            await delete_tagged(RawRedis(redis_url), user)


async def test_a_cancel_while_the_store_may_have_lost_the_presence_claims_no_cancelled(
    autojump_clock: Any,
) -> None:
    """The store lost its last writes: the job, running on a desktop, reads ``queued``
    and no presence is left (the session began in the lost writes). This process saw
    it (its liveness key had lapsed: ``_own_liveness``). The cancel must not answer
    ``cancelled`` itself: ``queued`` (202), the job's answer left to its holder."""
    sub = MemorySubstrate(clock=wall)
    bridge = Bridge(sub, Timings(), wall_clock=wall)
    await sub.set_presence("u1", "hub-1.s1", 90)
    await sub.set_liveness("hub-1", 3600)
    async with trio.open_nursery() as nursery:
        got, _ = await _queued_call(sub, bridge, "u1", "job-rw", nursery)
        # the rewind: presence and the holder's liveness key gone with the last writes
        await sub.clear_presence("u1", "hub-1.s1")
        await sub.clear_liveness("hub-1")
        own_liveness().sending()
        own_liveness().answered(kept=False)  # this process's own key had lapsed too
        assert await bridge.cancel("job-rw") == "queued"  # requested, not answered
        state = await sub.get_job_state("u1", "job-rw")
        assert state is not None and state.stage is Stage.QUEUED  # was: cancelled
        assert "outcome" not in got
        nursery.cancel_scope.cancel()


async def _holder_dies_after_the_wait(sub: Substrate, bridge: Bridge, user: str) -> None:
    """The holder lives through the cancel's wait without answering (stalled), then
    dies: the job stayed ``queued`` for ``GET`` (until its TTL) and its caller waited
    for its timeout. ``GET`` (``Bridge.job_state``) now finds the cancel flag and no
    live holder, and answers it as the cancel would have: ``cancelled``."""
    job = f"job-{secrets.token_hex(4)}"
    holder = f"hub-{secrets.token_hex(4)}"
    await sub.set_presence(user, f"{holder}.s1", 90)
    lives_s = PROCESS_LIVENESS_TTL_S + 3  # through the wait and its last look
    await sub.set_liveness(holder, lives_s)
    async with trio.open_nursery() as nursery:
        got, answered = await _queued_call(sub, bridge, user, job, nursery)
        with trio.fail_after(PROMPT_S * 2):
            assert await bridge.cancel(job) == "queued"  # the holder still lives
        state = await bridge.job_state(job)
        assert state is not None and state.stage is Stage.QUEUED  # it may still answer
        await trio.sleep(lives_s + 1)  # it died unanswered
        with trio.fail_after(PROMPT_S):
            state = await bridge.job_state(job)
        assert state is not None and state.stage is Stage.CANCELLED, state  # was: queued
        with trio.fail_after(PROMPT_S):  # was: the caller's 600 s timeout
            await answered.wait()
    assert got["outcome"].status == "cancelled", got


async def test_a_cancel_left_to_a_holder_that_dies_later_is_answered_by_get(
    autojump_clock: Any,
) -> None:
    sub = MemorySubstrate(clock=wall)
    await _holder_dies_after_the_wait(sub, Bridge(sub, Timings(), wall_clock=wall), "u1")


async def test_a_cancel_left_to_a_holder_that_dies_later_is_answered_by_get_redis(
    redis_url: str,
) -> None:
    user = f"holderlater-{secrets.token_hex(4)}"
    async with RedisSubstrate.from_url(redis_url) as sub:
        try:
            await _holder_dies_after_the_wait(sub, Bridge(sub, Timings()), user)
        finally:
            await delete_tagged(RawRedis(redis_url), user)
