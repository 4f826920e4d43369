"""Helpers for the ToolRunner tests: deliveries, a counting tool, runners on the in-memory
ledger, and ledgers that fail or wait on purpose."""

from __future__ import annotations

import itertools

import trio
import trio.testing
from deskbridge_common import Job
from deskbridge_sidecar import ToolRegistry, tool
from deskbridge_sidecar._dedupe import DedupeCache
from deskbridge_sidecar._ledger import Ledger, LedgerError
from deskbridge_sidecar._runner import ToolRunner
from deskbridge_sidecar.testing import FakeWallClock

_ids = itertools.count(1)


def job(
    name: str = "submit",
    args: dict | None = None,
    key: str = "k",
    deadline_s: float = 60,
    job_id: str = "job-1",
) -> Job:
    """A delivery (fresh id) with its deadline on FakeWallClock's time."""
    return Job(
        id=f"d-{next(_ids)}",
        job_id=job_id,
        name=name,
        args={"form": "f"} if args is None else args,
        idempotency_key=key,
        deadline=FakeWallClock()() + deadline_s,
    )


def counting(seconds: float = 0.0, name: str = "submit"):
    calls: list[str] = []

    @tool(name=name, side_effects=True)
    async def submit(form: str) -> dict:
        calls.append(form)
        await trio.sleep(seconds)
        return {"submitted": form, "n": len(calls)}

    return submit, calls


class FailingReads(Ledger):
    """A ledger whose reads fail (the disk went away); writes still work."""

    async def get(self, key: str):  # type: ignore[override]
        raise LedgerError("ledger read failed: disk I/O error")


def make(nursery, *tools, ledger: Ledger | None = None, size: int = 256, **kw) -> ToolRunner:
    return ToolRunner(
        registry=ToolRegistry(tools),
        cache=DedupeCache(size=size),
        nursery=nursery,
        wall_clock=kw.pop("wall_clock", FakeWallClock()),
        ledger=ledger or Ledger.memory(),
        **kw,
    )


def failing_reads() -> Ledger:
    plain = Ledger.memory()
    return FailingReads(None, plain._conn)


class Gated(Ledger):
    """A memory ledger whose begin / finish wait for the test before they write."""

    def __init__(self) -> None:
        plain = Ledger.memory()
        super().__init__(None, plain._conn)
        self.begin_entered, self.finish_entered = trio.Event(), trio.Event()
        self.release = trio.Event()

    async def begin(self, *args, **kw) -> None:  # type: ignore[override]
        self.begin_entered.set()
        await self.release.wait()
        await super().begin(*args, **kw)

    async def finish(self, *args, **kw) -> None:  # type: ignore[override]
        self.finish_entered.set()
        await self.release.wait()
        await super().finish(*args, **kw)


class FailingWrites(Ledger):
    def __init__(self, fail: str) -> None:
        plain = Ledger.memory()
        super().__init__(None, plain._conn)
        self.fail = fail

    async def begin(self, *args, **kw) -> None:  # type: ignore[override]
        if self.fail == "begin":
            raise LedgerError("ledger write failed: disk full")
        await super().begin(*args, **kw)

    async def finish(self, *args, **kw) -> None:  # type: ignore[override]
        if self.fail == "finish":
            raise LedgerError("ledger write failed: disk full")
        await super().finish(*args, **kw)


async def running_and_queued(nursery, runner: ToolRunner) -> tuple[Job, Job]:
    """Deliveries ``ka`` (running: it holds the tool lock) and ``kb`` (queued behind it)."""
    a, b = job(key="ka"), job(key="kb")
    for delivery in (a, b):
        assert runner.admit(delivery) is None
        nursery.start_soon(runner.execute, delivery)
        await trio.testing.wait_all_tasks_blocked()  # ka takes the lock, then kb queues
    return a, b
