"""A record that lapses (TTL) while the truth about its job is still unknown must not turn
into an untrue answer (MockClock, the memory substrate, the real hub session; the Redis
side of the same lifetimes is the contract suite's)."""

from __future__ import annotations

import json

import trio
from deskbridge_common import Job, JobResult

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
    executed: list[str] = []
    delivered: list[str] = []
    async with trio.open_nursery() as nursery:
        first = await connect(nursery, state, daemon_id="d1")

        async def run_then_vanish(frame):
            if isinstance(frame, Job):
                delivered.append(frame.job_id)
                executed.append(frame.job_id)  # it ran; the lid closes before the answer
                await first.disconnect()

        nursery.start_soon(sidecar, first, run_then_vanish)
        outcome = await bridge.dispatch("u1", "click", {}, job_id="job-away", timeout_s=30)
        assert outcome.status in ("timeout", "in_doubt"), outcome  # the caller is told
        assert outcome.detail is not None and outcome.detail["stage"] == "interrupted"
        await trio.sleep(AWAY_S)
        back = await connect(nursery, state, daemon_id="d1")

        async def ledger(frame):  # the same daemon: its ledger answers from the record
            if isinstance(frame, Job):
                delivered.append(frame.job_id)
                if frame.job_id not in executed:
                    executed.append(frame.job_id)
                await back.send(JobResult(frame.id, True, {"ran": 1}))

        nursery.start_soon(sidecar, back, ledger)
        await trio.sleep(5)
        found = await bridge.job_state("job-away")
        assert found is not None and found.stage.value == "finished", found
        answer = await bridge.answer_of("job-away")
        assert answer is not None and json.loads(answer)["status"] == "completed", answer
        assert delivered == ["job-away", "job-away"]
        assert executed == ["job-away"]  # exactly once
        nursery.cancel_scope.cancel()
