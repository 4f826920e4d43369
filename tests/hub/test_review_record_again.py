"""Review: fix-loss's RECORD step (``take_over(again=True)``) against fix-desk's drain rule
(``ProcessReader._same_daemon``): after the daemon record and presence are lost (an
eviction) while another daemon's job is pending on this process's consumer, the beat that
writes presence back records the consumer as the *current* daemon's, so when this
process dies that daemon takes the gone desktop's job over at once on another process,
the double run fix-desk closed (the job it withholds from its own drain). Fixed: the
step runs ``again`` only when this process handed the user's entries to no other daemon."""

from __future__ import annotations

import pytest
import trio
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge
from deskbridge_hub._keys import presence_key
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState

from tests.hub.test_outcomes import connect, running_job, sidecar
from tests.hub.test_session import wall


@pytest.mark.parametrize("lost", [False, True])
async def test_a_gone_desktops_job_is_not_taken_over_by_another_daemon_after_a_record_loss(
    autojump_clock, lost
):
    substrate = MemorySubstrate(clock=wall)
    timings = Timings()
    one = HubState(substrate=substrate, timings=timings, consumer="hub-1", wall_clock=wall)
    two = HubState(substrate=substrate, timings=timings, consumer="hub-2", wall_clock=wall)
    bridge = Bridge(substrate, timings, wall_clock=wall)
    seen: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        # d1 runs it and never answers: gone mid-job
        old = await running_job(nursery, one, bridge, seen, "d1", daemon_id="d1", job_id="job-g")
        delivered_at = trio.current_time()
        await old.disconnect()
        await trio.sleep(1)
        here = await connect(nursery, one, daemon_id="d2")  # another machine, same process

        async def idle(frame) -> None:
            pass

        nursery.start_soon(sidecar, here, idle)
        await trio.sleep(5)
        # the store loses presence and the daemon record (evicted); the beat writes
        # presence back and runs the takeover step again (RECORD)
        if lost:
            substrate._kv.pop(presence_key("u1"), None)
            substrate._daemon_records.pop("u1", None)
        await trio.sleep(timings.heartbeat_s * 2 + 1)
        # process one dies; d2 reconnects to process two
        elsewhere = await connect(nursery, two, daemon_id="d2")
        again = trio.Event()

        async def answer(frame):
            if isinstance(frame, Job):
                seen.append(("d2", trio.current_time()))
                again.set()
                await elsewhere.send(JobResult(frame.id, True, {"ran": 2}))

        nursery.start_soon(sidecar, elsewhere, answer)
        with trio.move_on_after(10):
            await again.wait()
        nursery.cancel_scope.cancel()
    ran_again = [t for who, t in seen if who == "d2"]
    assert not ran_again or ran_again[0] - delivered_at >= timings.reclaim_idle_s, seen
