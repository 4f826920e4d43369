"""A record that lapses (TTL) while the truth about its job is still unknown must not turn
into an untrue answer (MockClock, the memory substrate, the real hub session; the Redis
side of the same lifetimes is the contract suite's)."""

from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager

import trio
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge, RedisSubstrate
from deskbridge_hub._session import HubState

from tests.hub.test_outcomes import bridge, connect, sidecar, state  # noqa: F401 - fixtures

#: How long the desktop stays away: longer than the result TTL (300 s) and the job's
#: deadline (30 s) + that TTL.
AWAY_S = 400.0


async def test_a_desktop_back_after_the_result_ttl_is_asked_not_answered_expired(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    """The lid closes while the job runs (``interrupted`` is written), and the desktop
    comes back after the state's result TTL and the job's deadline. The job may have run:
    it goes to the desktop again, whose ledger answers it (here: from its record, the run
    is not repeated). Was: the state had lapsed, so the mark saw a job never forwarded,
    past its deadline, and answered it ``expired`` although it had run."""
    assert AWAY_S > 30 + state.timings.result_ttl_s
    await _away_and_back(state, bridge, "u1", timeout_s=30, away_s=AWAY_S)


@asynccontextmanager
async def _on_redis(redis_url, prefix):
    """A hub state and a Bridge on a real Redis with short timings (result TTL 1.5 s),
    and a fresh user named ``prefix-...``; the body is bounded to 30 s."""
    timings = Timings(
        heartbeat_s=0.5, presence_ttl_s=1.5, reclaim_idle_s=3.0, result_ttl_s=1.5, grace_s=0.5
    )
    user = f"{prefix}-{uuid.uuid4().hex[:8]}"
    async with RedisSubstrate.from_url(redis_url) as substrate:
        hub = HubState(substrate=substrate, timings=timings, consumer="hub-1", wall_clock=time.time)
        with trio.fail_after(30):
            yield hub, Bridge(substrate, timings, wall_clock=time.time), user


async def test_on_redis_a_desktop_back_after_the_result_ttl_is_asked(redis_url):
    """The same on a real Redis (the mark's script, the finish's), real time and short
    timings: result TTL 1.5 s, deadline 1 s, away 4 s."""
    async with _on_redis(redis_url, "lapse") as (hub, redis_bridge, user):
        await _away_and_back(hub, redis_bridge, user, timeout_s=1, away_s=4.0)


async def _away_and_back(state, bridge, user, *, timeout_s, away_s):  # noqa: F811
    executed: list[str] = []
    delivered: list[str] = []
    async with trio.open_nursery() as nursery:
        first = await connect(nursery, state, user=user, daemon_id="d1")

        async def run_then_vanish(frame):
            if isinstance(frame, Job):
                delivered.append(frame.job_id)
                executed.append(frame.job_id)  # it ran; the lid closes before the answer
                await first.disconnect()

        nursery.start_soon(sidecar, first, run_then_vanish)
        job_id = f"job-away-{user}"
        outcome = await bridge.dispatch(user, "click", {}, job_id=job_id, timeout_s=timeout_s)
        assert outcome.status in ("timeout", "in_doubt"), outcome  # the caller is told
        assert outcome.detail is not None and outcome.detail["stage"] == "interrupted"
        await trio.sleep(away_s)
        back = await connect(nursery, state, user=user, daemon_id="d1")

        async def ledger(frame):  # the same daemon: its ledger answers from the record
            if isinstance(frame, Job):
                delivered.append(frame.job_id)
                if frame.job_id not in executed:
                    executed.append(frame.job_id)
                await back.send(JobResult(frame.id, True, {"ran": 1}))

        nursery.start_soon(sidecar, back, ledger)
        for _ in range(50):  # bounded: the answer lands within a few reads
            await trio.sleep(0.1)
            found = await bridge.job_state(job_id)
            if found is not None and found.stage.terminal:
                break
        assert found is not None and found.stage.value == "finished", found
        answer = await bridge.answer_of(job_id)
        assert answer is not None and json.loads(answer)["status"] == "completed", answer
        assert delivered == [job_id, job_id]
        assert executed == [job_id]  # exactly once
        nursery.cancel_scope.cancel()


async def test_a_retry_with_the_key_of_a_job_its_desktop_took_away_is_never_offline(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    """The lid closes while a keyed job runs (its caller is answered ``in_doubt``
    provisionally, ``interrupted``: "retry with the same key for the real outcome"); the
    retry comes after the job's deadline + the result TTL, while the desktop is still
    away. The key's record must still name the job: the retry attaches to it (the job
    may have run), never ``offline`` ("did it run? no"). Was: the record had lapsed at
    the deadline + result TTL, and the retry was answered ``offline``; with the desktop
    back it enqueued a second job."""
    executed: list[str] = []
    async with trio.open_nursery() as nursery:
        first = await connect(nursery, state, daemon_id="d1")

        async def run_then_vanish(frame):
            if isinstance(frame, Job):
                executed.append(frame.job_id)
                await first.disconnect()

        nursery.start_soon(sidecar, first, run_then_vanish)
        outcome = await bridge.dispatch("u1", "click", {}, idempotency_key="k-away", timeout_s=30)
        assert outcome.detail is not None and outcome.detail["stage"] == "interrupted"
        await trio.sleep(AWAY_S)
        retry = await bridge.dispatch("u1", "click", {}, idempotency_key="k-away", timeout_s=5)
        assert retry.status != "offline", retry
        assert retry.job_id == outcome.job_id, retry  # attached to the job, not a new one
        assert executed == [outcome.job_id]
        nursery.cancel_scope.cancel()


async def test_a_chosen_job_id_is_found_after_its_holder_died_before_writing_interrupted(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    monkeypatch,
):
    """A job with a caller-chosen id is delivered; its holder process dies before it
    writes anything more (no ``interrupted`` mark: here every later finish fails, as a
    dead process's would never come). The mark keeps the job's state a day
    (``forwarded_keep_s``); the id's owner record, in the id's own slot, must live as
    long, or ``GET /v1/jobs/{id}`` on any replica says 404 (unknown) for a job that may
    have run and whose desktop's ledger will still answer it. Was: the owner record
    lapsed at the timeout + result TTL."""
    await _holder_dies(state, bridge, monkeypatch, "u1", timeout_s=30, away_s=AWAY_S)


async def test_on_redis_a_chosen_job_id_is_found_after_its_holder_died(redis_url, monkeypatch):
    """The same on a real Redis (the keep's PEXPIRE GT in the id's slot): result TTL
    1.5 s, deadline 1 s, 4 s after the holder died."""
    async with _on_redis(redis_url, "died") as (hub, redis_bridge, user):
        await _holder_dies(hub, redis_bridge, monkeypatch, user, timeout_s=1, away_s=4.0)


async def test_an_answered_chosen_job_id_is_free_again_after_the_result_ttl(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    """The delivery keeps a chosen id's owner record a day; the answer sets it back to
    the result TTL, so an answered id is free again with its state, as before (not taken
    a day)."""
    async with trio.open_nursery() as nursery:
        desk = await connect(nursery, state, daemon_id="d1")

        async def answer(frame):
            if isinstance(frame, Job):
                await desk.send(JobResult(frame.id, True, {"ok": 1}))

        nursery.start_soon(sidecar, desk, answer)
        outcome = await bridge.dispatch("u1", "click", {}, job_id="chosen-answered", timeout_s=30)
        assert outcome.status == "completed", outcome
        assert await state.substrate.job_owner("chosen-answered") is not None
        await trio.sleep(state.timings.result_ttl_s + 1)
        assert await state.substrate.job_owner("chosen-answered") is None
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def _holder_died(state, bridge, monkeypatch, user, *, timeout_s, away_s, **dispatch):  # noqa: F811
    """A job of ``user`` (``dispatch``: its job id or idempotency key) delivered, run once,
    then its holder dies before writing anything more; yields its first outcome
    ``away_s`` later, with the holder's writes landing again."""
    from deskbridge_hub._errors import SubstrateUnavailable

    executed: list[str] = []
    real_finish = state.substrate.finish

    async def dead(*args, **kwargs):  # the holder is gone: none of its writes land
        raise SubstrateUnavailable("holder died")

    async with trio.open_nursery() as nursery:
        first = await connect(nursery, state, user=user, daemon_id="d1")

        async def run_then_die(frame):
            if isinstance(frame, Job):
                executed.append(frame.job_id)
                monkeypatch.setattr(state.substrate, "finish", dead)
                await first.disconnect()

        nursery.start_soon(sidecar, first, run_then_die)
        outcome = await bridge.dispatch(user, "click", {}, timeout_s=timeout_s, **dispatch)
        assert outcome.status in ("timeout", "in_doubt", "unavailable"), outcome
        assert executed == [outcome.job_id]
        monkeypatch.setattr(state.substrate, "finish", real_finish)
        await trio.sleep(away_s)  # past the deadline + result TTL: the records' lifetime
        assert await state.substrate.get_job_state(user, outcome.job_id) is not None  # a day
        yield outcome
        nursery.cancel_scope.cancel()


async def _holder_dies(state, bridge, monkeypatch, user, *, timeout_s, away_s):  # noqa: F811
    job_id = f"chosen-died-{user}"
    async with _holder_died(
        state, bridge, monkeypatch, user, timeout_s=timeout_s, away_s=away_s, job_id=job_id
    ):
        found = await bridge.job_state(job_id)
        assert found is not None, "GET /v1/jobs/{id} would say 404 for a forwarded job"
        assert not found.stage.terminal, found


async def test_a_retry_with_the_key_of_a_job_whose_holder_died_attaches_to_it(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    monkeypatch,
):
    """A keyed job is delivered and its holder process dies before it writes anything
    more (no ``interrupted`` mark, no keep). The state is kept a day by the mark
    (``forwarded_keep_s``); the key's record must live as long, or a retry after the
    job's deadline + result TTL finds the key free: ``offline`` ("did not run") while
    the desktop is away, a second job once it is back, which the desktop's ledger runs
    again once its key window (deadline + result TTL, 300 s after the finish) ended.
    Was: the record lapsed at the submit's deadline + result TTL (or the last keep +
    result TTL)."""
    await _holder_dies_then_retry(state, bridge, monkeypatch, "u1", timeout_s=30, away_s=AWAY_S)


async def test_on_redis_a_retry_with_the_key_of_a_job_whose_holder_died_attaches(
    redis_url, monkeypatch
):
    """The same on a real Redis (the mark's script): result TTL 1.5 s, deadline 1 s,
    4 s after the holder died."""
    async with _on_redis(redis_url, "died-key") as (hub, redis_bridge, user):
        await _holder_dies_then_retry(hub, redis_bridge, monkeypatch, user, timeout_s=1, away_s=4.0)


async def _holder_dies_then_retry(state, bridge, monkeypatch, user, *, timeout_s, away_s):  # noqa: F811
    key = f"k-died-{user}"
    async with _holder_died(
        state, bridge, monkeypatch, user, timeout_s=timeout_s, away_s=away_s,
        idempotency_key=key,
    ) as outcome:  # fmt: skip
        retry = await bridge.dispatch(user, "click", {}, idempotency_key=key, timeout_s=1)
        assert retry.status != "offline", retry  # "did not run": untrue, it ran
        assert retry.job_id == outcome.job_id, retry  # attached, not a second job
