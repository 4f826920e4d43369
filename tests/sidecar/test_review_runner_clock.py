"""Review: the monotonic deadline noted at admission must live as long as the run, not as
long as the first waiter's ``execute`` call."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_sidecar.testing import FakeWallClock

from .runner_kit import counting, job, make


async def test_a_queued_job_whose_waiter_dropped_still_expires_on_the_steady_clock(
    autojump_clock, nursery
):
    """The session drops while kb queues (its ``execute`` wait is cancelled; the run
    carries on in the daemon's nursery) and the wall clock steps back: ``execute``'s
    ``finally`` popped kb's monotonic note, so the run's start check fell back to the wall
    clock alone and kb ran 20 s after its caller was told ``timeout``."""
    wall = FakeWallClock()
    submit, calls = counting(seconds=30)
    runner = make(nursery, submit, wall_clock=wall)
    first = job(key="ka", deadline_s=600)
    assert runner.admit(first) is None
    nursery.start_soon(runner.execute, first)
    await trio.testing.wait_all_tasks_blocked()
    queued = job(key="kb", deadline_s=10)
    assert runner.admit(queued) is None
    with trio.move_on_after(1):  # the session drops: only the wait ends
        await runner.execute(queued)
    wall.jump(-3600)  # the wall clock steps back an hour while kb waits for the lock
    await trio.sleep(60)  # ka finishes at 30 s; kb's 10 s are long gone
    await trio.testing.wait_all_tasks_blocked()
    assert calls == ["f"], "kb started after its deadline on the monotonic clock"
