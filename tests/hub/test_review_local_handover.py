"""Review: a session superseded in the same process by *another* desktop (another daemon
of the user: a second machine) keeps a job running through its grace; at the grace's end
its caller is told ``in_doubt`` (provisional: the entry stays pending, "its redelivery to
the returning desktop is answered from its ledger, never run twice"), and
``ProcessReader.release`` then hands the entry to the new desktop, whose ledger has never
seen it: the job runs a second time. Across processes the same hand-over is final (in_doubt,
acknowledged, never delivered again).

Fixed: ``_handshake`` supersedes with ``local=False`` when both daemon ids are known and
differ, as another process's session is (``tests/hub/test_outcomes.py::
test_the_same_daemon_back_in_this_process_gets_its_job_again_at_once[False]`` now expects
``in_doubt`` and no second run)."""

from __future__ import annotations

import trio
from deskbridge_common import Job, JobResult

from tests.hub.test_outcomes import bridge, connect, sidecar, state  # noqa: F401


async def test_a_job_running_on_a_desktop_superseded_here_by_another_is_not_run_again(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    seen: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        old = await connect(nursery, state, daemon_id="d1")
        first = trio.Event()

        async def running(frame):  # runs long: still running at the end of the grace
            if isinstance(frame, Job):
                seen.append(("d1", trio.current_time()))
                first.set()

        nursery.start_soon(sidecar, old, running)
        outcomes = []

        async def call() -> None:
            outcomes.append(
                await bridge.dispatch("u1", "click", {}, job_id="job-s", timeout_s=3000)
            )

        nursery.start_soon(call)
        await first.wait()
        new = await connect(nursery, state, daemon_id="d2")  # another machine connects

        async def answer(frame):
            if isinstance(frame, Job):
                seen.append(("d2", trio.current_time()))
                await new.send(JobResult(frame.id, True, {"ran": 2}))

        nursery.start_soon(sidecar, new, answer)
        window = state.timings.grace_s + state.timings.reclaim_idle_s
        await trio.sleep(window + 4 * state.timings.heartbeat_s)
        nursery.cancel_scope.cancel()
    assert [who for who, _ in seen] == ["d1"], (seen, outcomes)
    assert [o.status for o in outcomes] == ["in_doubt"], outcomes
