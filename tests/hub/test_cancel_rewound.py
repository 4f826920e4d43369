"""A cancel of a job in flight on its holder whose stored state a store rewound to
``queued`` (a failover that lost the last writes: the delivery's mark and claim epoch
among them).

The holder's cancel notice (``_cancel_notice``) sent the ``cancel`` frame and left the
state ``queued``: if that holder then died, the desktop's next session (on another
process) read the job's entry, found the cancel flag and no delivery (``queued``, claim
epoch 0) and answered ``cancelled``, about a tool that ran. Now the notice writes the
delivery back (``restore_delivery``: only over ``queued``, only with an epoch not below
the stored one), so the next reader knows the job was forwarded and asks the desktop's
ledger (``in_doubt``, not ``elsewhere``: ``_delivery`` asks it). A real hub session and
process reader on ``MemorySubstrate``, a fake sidecar whose tool a cancel cannot stop (a
sync tool), MockClock."""

from __future__ import annotations

from typing import Any

import trio
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge, MemorySubstrate
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._session import HubState

from tests.hub.test_outcomes import connect, sidecar
from tests.hub.test_session import wall

TOOL_S = 300.0


async def test_a_rewound_job_s_cancel_notice_writes_its_delivery_back(
    autojump_clock: Any,
) -> None:
    sub = MemorySubstrate(clock=wall)
    state = HubState(substrate=sub, timings=Timings(), consumer="hub-1", wall_clock=wall)
    bridge = Bridge(sub, state.timings, wall_clock=wall)
    started, cancels = trio.Event(), []
    outcome: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, daemon_id="d1")

        async def sync_tool(frame: Any) -> None:  # a cancel frame cannot stop it
            if isinstance(frame, Job):
                started.set()
                await trio.sleep(TOOL_S)
                await peer.send(JobResult(frame.id, True, {"ran": True}))
            else:
                cancels.append(frame)

        async def call() -> None:
            outcome["job"] = await bridge.dispatch("u1", "w", {}, job_id="job-a", timeout_s=600)

        nursery.start_soon(sidecar, peer, sync_tool)
        nursery.start_soon(call)
        with trio.fail_after(30):
            await started.wait()
        # the rewind: the state back to "queued", the claim epoch gone
        stored = await sub.get_job_state("u1", "job-a")
        assert stored is not None and stored.stage is Stage.DELIVERED
        queued = JobState(Stage.QUEUED, "u1", at=wall(), reply_to=stored.reply_to)
        assert await sub.unmark_delivered("u1", "job-a", queued, epoch=1, ttl_s=600)
        assert await bridge.cancel("job-a") == "queued"  # 202: left to the live holder
        with trio.fail_after(5):
            while not cancels:  # noqa: ASYNC110 - the fake sidecar sets no event
                await trio.sleep(0.01)
        # the holder dies now (its tool runs on, on the desktop): what does the job's
        # next reader, a session on another process, find?
        now = await sub.get_job_state("u1", "job-a")
        assert now is not None and now.stage is Stage.DELIVERED, now  # was: queued
        nursery.cancel_scope.cancel()
    again = JobState(Stage.DELIVERED, "u1", at=wall(), session_id="s2", daemon_id="d1")
    marked = await sub.mark_delivered("u1", "job-a", again, ttl_s=600)
    assert marked.verdict == "in_doubt", marked  # was: "cancelled" about a tool that ran
    assert not marked.elsewhere  # the same desktop: its ledger answers
    assert "job" not in outcome
