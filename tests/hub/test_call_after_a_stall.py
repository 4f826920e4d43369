"""A hub process stopped past its caller's time (SIGSTOP, a paused VM, a swap storm)
resumes with every deadline of a waiting call already passed. The job's answer may be in
the store by then (another replica's session took the job over and answered it): the
call looks once, and answers what it finds, not ``timeout`` "outcome unknown" without a
look. Found running three replicas: a 40 s SIGSTOP of one answered two completed jobs
``timeout`` (``GET /v1/jobs/{id}`` said completed). MockClock: the stall is a jump of
the clock with no task running in between."""

from __future__ import annotations

import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge
from deskbridge_hub._jobs import result_payload
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._memory import MemorySubstrate

USER = "stalled-u1"


async def _answer_then_stall(substrate: MemorySubstrate, clock: trio.testing.MockClock) -> None:
    """Answer the first job the way another replica's holder does, its notification
    going to no mailbox here (a lost one), then stop this process for 5 s."""
    while True:
        entries = await substrate.read_new(USER, "other-hub", count=1, block_ms=100)
        if entries:
            entry = entries[0]
            job_id = entry.fields["job_id"]
            payload = result_payload("completed", result={"ok": 1})
            state = JobState(Stage.FINISHED, USER)
            await substrate.finish(
                USER, job_id, payload, state, ttl_s=30, entry_id=entry.entry_id
            )
            clock.jump(5.0)  # no checkpoint: nothing here runs during the stop
            return


async def test_a_call_stalled_past_its_time_answers_the_stored_outcome(autojump_clock) -> None:
    substrate = MemorySubstrate()
    bridge = Bridge(substrate, Timings())
    await substrate.set_presence(USER, "s1", 60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_then_stall, substrate, autojump_clock)
        outcome = await bridge.dispatch(USER, "echo", {}, timeout_s=1)
    assert outcome.status == "completed", outcome
    assert outcome.result == {"ok": 1}


async def test_a_call_not_stalled_is_answered_by_its_time(autojump_clock) -> None:
    """Without a stall nothing changes: no answer, ``timeout`` by ``timeout_s`` + grace."""
    substrate = MemorySubstrate()
    bridge = Bridge(substrate, Timings())
    await substrate.set_presence(USER, "s1", 60)
    start = trio.current_time()
    outcome = await bridge.dispatch(USER, "echo", {}, timeout_s=1)
    assert outcome.status == "timeout"
    assert trio.current_time() - start <= 1.25
