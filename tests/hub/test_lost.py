"""Issue 11 item 3: "lost" only for work that never ran.

The kind: an entry whose body is gone (trimmed by MAXLEN, deleted) is answered ``lost``
only if no executor can have received it — its job never reached ``delivered``. An entry
delivered and in flight (on this process or another), or one whose delivery ended
without an answer, is never called lost: its holder answers, or the caller's wait ends
with the stage it reached.

The example from the issue, on the memory substrate (which trims to exactly MAXLEN) and
MockClock: MAXLEN 10, one long job running, then 50 short jobs dispatched one after the
other (a full queue refuses new work, so they come as fast as the desktop takes them),
with a reclaim idle short enough that a reclaim pass runs while the body of the long
job's delivered entry is trimmed away by the entries acknowledged after it.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import Job, JobResult, Ping, Pong, decode_frame
from deskbridge_hub import Bridge
from deskbridge_hub._jobstate import JobState, Stage

from tests.hub.test_session import connect, make_state, wall


async def sidecar(peer, executed: list[Job], seconds: dict[str, float]) -> None:
    """Answers pings at once; runs each job (its own task) for ``seconds[name]``."""

    async def run(frame: Job) -> None:
        executed.append(frame)
        await trio.sleep(seconds.get(frame.name, 0.05))
        await peer.send(JobResult(frame.id, True, {"key": frame.idempotency_key}))

    try:
        async with trio.open_nursery() as nursery:
            async for raw in peer._inbox:
                frame = decode_frame(raw)
                if isinstance(frame, Ping):
                    await peer.send(Pong(frame.nonce))
                elif isinstance(frame, Job):
                    nursery.start_soon(run, frame)
    except* (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


async def test_delivered_entries_trimmed_while_running_are_never_answered_lost(autojump_clock):
    state = make_state(jobs_maxlen=10, reclaim_idle_s=5.0, heartbeat_s=1.0, presence_ttl_s=3.0)
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    executed: list[Job] = []
    outcomes: dict[str, str] = {}

    async def call(key: str, name: str) -> None:
        outcome = await bridge.dispatch("u1", name, {}, idempotency_key=key, timeout_s=120)
        outcomes[key] = outcome.status

    trimmed_while_running: list[bool] = []

    async def look_at_the_long_entry(entry_id: tuple[int, int]) -> None:
        await trio.sleep(6)  # the long job runs until about t = 8
        stream = state.substrate._streams["u1"]
        trimmed_while_running.append(entry_id not in stream.entries and "long" not in outcomes)

    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(sidecar, peer, executed, {"long": 8.0, "short": 0.5})
        nursery.start_soon(call, "long", "long")
        await trio.sleep(1)
        (long_entry,) = state.substrate._index["u1"]
        nursery.start_soon(look_at_the_long_entry, long_entry)
        async with trio.open_nursery() as callers:
            for i in range(50):
                callers.start_soon(call, f"short-{i}", "short")
                await trio.sleep(0.15)
        with trio.fail_after(60):
            while len(outcomes) < 51:  # noqa: ASYNC110 - mock clock; the long job's caller
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()

    ran = [j.idempotency_key for j in executed]
    assert len(ran) == len(set(ran)), "a job ran twice"
    assert len(outcomes) == 51, "a caller got no answer"
    for key, status in outcomes.items():
        if key in ran:
            assert status == "completed", (key, status)  # it ran: never "lost"
        else:
            assert status == "lost", (key, status)  # trimmed before anyone read it
    assert outcomes["long"] == "completed"
    assert trimmed_while_running == [True]  # the premise: its body went while it ran


async def test_a_trimmed_entry_whose_job_was_delivered_is_not_lost(autojump_clock):
    """The rule at its root: the job state says whether an executor may have it."""
    from deskbridge_hub._delivery import EntryServer
    from deskbridge_hub._jobs import JobEnvelope

    state = make_state()
    sub = state.substrate
    server = EntryServer(sub, state.timings, "u1", "s1", wall)
    entry_ids = []
    for job_id, stage in [("j-queued", Stage.QUEUED), ("j-delivered", Stage.DELIVERED)]:
        await sub.claim_job("u1", job_id, JobState(stage, "u1"), ttl_s=60)
        env = JobEnvelope(job_id, "echo", {}, job_id, wall() + 60, wall())
        entry_ids.append(await sub.enqueue("u1", env.to_fields(), maxlen=100))
    for i in range(5):
        await sub.enqueue("u1", {"filler": str(i)}, maxlen=2)  # trims both bodies
    await server.answer_deleted([])
    lost = await sub.wait_result("u1", "j-queued", timeout_s=1)
    assert lost is not None and '"lost"' in lost
    assert await sub.wait_result("u1", "j-delivered", timeout_s=1) is None


async def test_a_retry_with_the_key_of_a_lost_job_is_told_lost(autojump_clock):
    """A keyed job trimmed away while ``queued`` is answered ``lost`` by the entry index's
    pass, which has no entry fields left (no key). The key's record lives until the job's
    deadline + the result TTL; the answer must live as long (docs/outcomes.md: "at least
    as long as its answer is kept"), so a retry with the key after the result TTL, while
    the record still names the job, gets that answer. Was: the answer was kept the result
    TTL only, the retry attached to a job with nothing left to read and waited its whole
    ``timeout_s`` for ``timeout`` with the stage ``unknown``."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    after_s = state.timings.result_ttl_s + 5
    await _lost_then_retry(state, bridge, "u1", timeout_s=600, after_s=after_s)


async def test_on_redis_a_retry_with_the_key_of_a_deleted_job_is_told_lost(
    redis_url, raw_redis
):
    """The same on a real Redis, the entry deleted by an operator (XDEL): the finish
    script keeps the answer as long as the record. Real time, result TTL 1.5 s, deadline
    3 s (the record: 4.5 s), the retry 2 s after the answer."""
    import time
    import uuid

    from deskbridge_common import Timings
    from deskbridge_hub import RedisSubstrate
    from deskbridge_hub._session import HubState
    from deskbridge_hub._substrate import jobs_key

    async def xdel(user):
        for entry_id, _ in await raw_redis("XRANGE", jobs_key(user), "-", "+"):
            await raw_redis("XDEL", jobs_key(user), entry_id)

    timings = Timings(heartbeat_s=0.5, presence_ttl_s=1.5, reclaim_idle_s=3.0, result_ttl_s=1.5)
    async with RedisSubstrate.from_url(redis_url) as substrate:
        state = HubState(
            substrate=substrate, timings=timings, consumer="hub-1", wall_clock=time.time
        )
        bridge = Bridge(substrate, timings, wall_clock=time.time)
        user = f"lost-{uuid.uuid4().hex[:8]}"
        await _lost_then_retry(
            state, bridge, user, timeout_s=3, after_s=2.0, trim=xdel, clock=time.time
        )


async def _lost_then_retry(state, bridge, user, *, timeout_s, after_s, trim=None, clock=wall):
    from deskbridge_hub._delivery import EntryServer

    sub = state.substrate
    await sub.set_presence(user, "s1", 3 * (timeout_s + after_s))  # a desktop nobody serves
    server = EntryServer(sub, state.timings, user, "s1", clock)
    key = f"k-lost-{user}"
    got = {}
    async with trio.open_nursery() as nursery:

        async def call():
            got["first"] = await bridge.dispatch(
                user, "echo", {}, idempotency_key=key, timeout_s=timeout_s
            )

        nursery.start_soon(call)
        with trio.fail_after(30):
            while not (await sub.queue_info(user)).length:  # noqa: ASYNC110 - bounded
                await trio.sleep(0.05)
        if trim is None:
            for i in range(3):
                await sub.enqueue(user, {"filler": str(i)}, maxlen=1)  # trims its body
        else:
            await trim(user)
        await server.answer_deleted([])
    first = got["first"]
    assert first.status == "lost", first
    await trio.sleep(after_s)  # past the answer's result TTL, inside the record's lifetime
    with trio.fail_after(timeout_s + 30):
        retry = await bridge.dispatch(user, "echo", {}, idempotency_key=key, timeout_s=timeout_s)
    assert retry.job_id == first.job_id, retry  # attached, not a second job
    assert retry.status == "lost", retry  # the truth, not a timeout on nothing


async def test_a_retry_with_the_key_of_a_job_cancelled_while_queued_is_told_cancelled(
    autojump_clock,
):
    """The other answer written without the entry's fields: a cancel of a ``queued`` job
    (the bridge's, from the job state). Its answer must be kept as long as the key's
    record too. Was: a retry after the result TTL waited for ``timeout``, stage
    ``unknown``."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    sub = state.substrate
    await sub.set_presence("u1", "s1", 3000)  # a desktop nobody serves
    got = {}
    async with trio.open_nursery() as nursery:

        async def call():
            got["first"] = await bridge.dispatch(
                "u1", "echo", {}, idempotency_key="k-cancel", job_id="j-cancel", timeout_s=600
            )

        nursery.start_soon(call)
        with trio.fail_after(30):
            while (await sub.get_job_state("u1", "j-cancel")) is None:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert await bridge.cancel("j-cancel") == "queued"
    assert got["first"].status == "cancelled", got["first"]
    await trio.sleep(state.timings.result_ttl_s + 5)
    with trio.fail_after(630):
        retry = await bridge.dispatch("u1", "echo", {}, idempotency_key="k-cancel", timeout_s=600)
    assert retry.job_id == "j-cancel", retry
    assert retry.status == "cancelled", retry
