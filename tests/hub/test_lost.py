"""Issue 11 item 3: "lost" only for work that never ran.

The kind: an entry whose body is gone (trimmed by MAXLEN, deleted) is answered ``lost``
only if no executor can have received it — its job never reached ``delivered``. An entry
delivered and in flight (on this process or another), or one whose delivery ended
without an answer, is never called lost: its holder answers, or the caller's wait ends
with the stage it reached.

The example from the issue, on the memory substrate (which trims to exactly MAXLEN) and
MockClock: MAXLEN 10, one long job running, then 50 short jobs dispatched at once, with a
reclaim idle short enough that a reclaim pass runs while bodies of delivered entries are
being trimmed away.
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

    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(sidecar, peer, executed, {"long": 8.0, "short": 0.5})
        nursery.start_soon(call, "long", "long")
        await trio.sleep(1)
        async with trio.open_nursery() as callers:
            for i in range(50):
                callers.start_soon(call, f"short-{i}", "short")
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
    assert any(s == "lost" for s in outcomes.values())  # the premise: trimming happened


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
