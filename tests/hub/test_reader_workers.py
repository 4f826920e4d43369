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


class _CountingSubstrate(MemorySubstrate):
    """Counts the reads a session start makes after its takeover step."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    async def read_pending(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.reads.append("read_pending")
        return await super().read_pending(*args, **kwargs)

    async def autoclaim(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.reads.append("autoclaim")
        return await super().autoclaim(*args, **kwargs)

    async def read_new(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.reads.append("read_new")
        return await super().read_new(*args, **kwargs)


async def test_an_idle_desktops_attach_is_one_step_and_a_waiting_entry_is_still_read(
    autojump_clock,
):
    """Issue 10: a session start whose takeover step says ``quiet`` reads nothing more
    (at a reconnect storm the full drain/reclaim/read pass of every idle user queued
    jobs behind thousands of empty reads); a user with an entry waiting gets it."""
    from deskbridge_hub._beats import Listener

    sub = _CountingSubstrate()
    reader = ProcessReader(sub, Timings(), consumer="c1", holder_id="h1", inflight={})
    got: dict[str, list[str]] = {"idle": [], "busy": []}

    def listener(user: str) -> Listener:
        async def dispatch(entry):  # type: ignore[no-untyped-def]
            got[user].append(entry.entry_id)

        async def on_deleted(ids):  # type: ignore[no-untyped-def]
            pass

        return Listener(
            user, f"h1.{user}", "[]", dispatch=dispatch, on_deleted=on_deleted,
            on_superseded=lambda: None, capacity=lambda: 8,
        )  # fmt: skip

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            await sub.set_presence("idle", "h1.idle", 90)
            reader.attach(listener("idle"))
            await trio.testing.wait_all_tasks_blocked()
            assert sub.reads == [] and got["idle"] == []

            entry_id = await sub.enqueue("busy", {"job_id": "j1"}, maxlen=100)
            await sub.set_presence("busy", "h1.busy", 90)
            reader.attach(listener("busy"))
            await trio.testing.wait_all_tasks_blocked()
            assert got["busy"] == [entry_id]
            assert "read_new" in sub.reads
            nursery.cancel_scope.cancel()
