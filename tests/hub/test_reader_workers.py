"""The process reader's worker pool: a due user wakes one idle worker, not all of them
(issue 10, per-call hub CPU: a shared Event woke all ``WORKERS`` per wake-up)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import MemorySubstrate
from deskbridge_hub._reader import NEW, WORKERS, ProcessReader


async def test_one_due_user_wakes_exactly_one_idle_worker(autojump_clock):
    reader = ProcessReader(MemorySubstrate(), Timings(), consumer="c1", holder_id="h1", inflight={})
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            await trio.testing.wait_all_tasks_blocked()
            assert reader._idle.statistics().tasks_waiting == WORKERS

            reader.schedule("nobody-attached", NEW)  # no listener: the worker drops it
            assert reader._idle.statistics().tasks_waiting == WORKERS - 1

            await trio.testing.wait_all_tasks_blocked()
            assert reader._idle.statistics().tasks_waiting == WORKERS  # back, queue empty

            for i in range(3):  # three due users: three workers, the rest stay parked
                reader.schedule(f"u{i}", NEW)
            assert reader._idle.statistics().tasks_waiting == WORKERS - 3
            await trio.testing.wait_all_tasks_blocked()
            assert reader._idle.statistics().tasks_waiting == WORKERS
            nursery.cancel_scope.cancel()
