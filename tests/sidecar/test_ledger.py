"""The durable ledger on a real SQLite file: restart, recovery to in_doubt, corruption,
one daemon per file, retention and the size cap."""

from __future__ import annotations

import logging
import sqlite3

import pytest
import trio
import trio.lowlevel
from deskbridge_sidecar import Outcome
from deskbridge_sidecar._ledger import (
    LEDGER_FILE,
    Ledger,
    LedgerLocked,
    args_digest,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path):
    return tmp_path / "data" / LEDGER_FILE


def test_args_digest_is_canonical():
    assert args_digest({"a": 1, "b": [1, 2]}) == args_digest({"b": [1, 2], "a": 1})
    assert args_digest({"a": 1}) != args_digest({"a": "1"})


async def test_a_finished_key_survives_a_restart(path):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("k", "submit", args_digest({"f": 1}), keep_until=clock.now + 600)
    await ledger.finish("k", Outcome.success({"n": 1}))
    ledger.close()
    again = Ledger.open(path, wall_clock=clock)
    entry = await again.get("k")
    assert entry.outcome == Outcome.success({"n": 1}) and entry.tool == "submit"
    assert entry.matches("submit", args_digest({"f": 1}))
    assert again.recovered == []
    again.close()


async def test_a_key_started_by_a_dead_process_is_in_doubt(path, caplog):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("k-mid", "click", args_digest({}), keep_until=clock.now + 600)
    ledger._conn.close()  # the process dies: no finish, no clean close
    again = Ledger.open(path, wall_clock=clock)
    entry = await again.get("k-mid")
    assert entry.outcome.code == "in_doubt" and "may have acted" in entry.outcome.error.message
    assert again.recovered == ["k-mid"]
    assert "1 job(s) were running when the sidecar last stopped" in caplog.text
    again.close()


def test_a_corrupt_file_is_moved_aside_with_one_line(path, caplog):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database, it is a lid-closed disk" * 100)
    with caplog.at_level(logging.ERROR):
        ledger = Ledger.open(path)
    assert ledger.moved_aside is not None and ledger.moved_aside.exists()
    assert ledger.moved_aside.read_bytes().startswith(b"this is not a database")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "is corrupt" in errors[0].getMessage()
    assert "history of earlier jobs is lost" in errors[0].getMessage()
    ledger.close()
    Ledger.open(path).close()  # the fresh one opens cleanly next time: no loop


def test_a_second_daemon_on_one_file_is_refused(path):
    first = Ledger.open(path)
    with pytest.raises(LedgerLocked, match="another sidecar is using the ledger"):
        Ledger.open(path)
    first.close()
    Ledger.open(path).close()  # released with the first


async def test_rows_are_kept_until_keep_until_then_pruned(path):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, min_keep_s=300)
    await ledger.begin("k", "t", "d", keep_until=clock.now + 3900)
    await ledger.finish("k", Outcome.success(1))
    clock.now += 3899
    assert await ledger.prune() == 0 and await ledger.get("k") is not None
    clock.now += 2
    assert await ledger.prune() == 1 and await ledger.get("k") is None
    ledger.close()


async def test_the_cap_evicts_the_oldest_finished_never_a_running_one(path, caplog):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, max_entries=3)
    await ledger.begin("running", "t", "d", keep_until=clock.now + 10_000)
    for n in range(4):
        clock.now += 1
        await ledger.begin(f"k{n}", "t", "d", keep_until=clock.now + 10_000)
        await ledger.finish(f"k{n}", Outcome.success(n))
    assert await ledger.prune() == 2
    assert sorted(await ledger.keys()) == ["k2", "k3", "running"]
    assert "ledger over its cap of 3 keys: evicted the 2 oldest finished" in caplog.text
    ledger.close()


async def test_writes_run_off_the_event_loop(path):
    """A file ledger writes in a worker thread: the loop keeps ticking meanwhile."""
    ledger = Ledger.open(path)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        for n in range(20):
            await ledger.begin(f"k{n}", "t", "d", keep_until=2e9)
            await ledger.finish(f"k{n}", Outcome.success(n))
        nursery.cancel_scope.cancel()
    assert ticks > 20
    ledger.close()
    raw = sqlite3.connect(path)  # the file is a plain SQLite database
    try:
        assert raw.execute("SELECT COUNT(*) FROM jobs").fetchone() == (20,)
    finally:
        raw.close()


def test_one_key_is_one_request_same_tool_and_same_args_only():
    """A key matches only the same tool with the same arguments: another tool, or the same
    tool with other arguments, is a reused key (refused), never the stored outcome."""
    from deskbridge_sidecar._ledger import LedgerEntry

    entry = LedgerEntry("k", "click", args_digest({"x": 1}), 1.0, None, None, 2.0)
    assert entry.matches("click", args_digest({"x": 1}))
    assert not entry.matches("click", args_digest({"x": 2}))
    assert not entry.matches("type", args_digest({"x": 1}))


async def test_a_finished_row_is_kept_at_least_min_keep_s_after_it_finished(path):
    """Finishing never shortens a row's life: even a key begun with a keep_until in the
    past (its deadline already gone) stays min_keep_s after its outcome was recorded."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, min_keep_s=300)
    await ledger.begin("k", "t", "d", keep_until=clock.now - 10)
    clock.now += 100
    await ledger.finish("k", Outcome.success(1))
    clock.now += 299
    assert await ledger.prune() == 0
    row = await ledger.get("k")
    assert row is not None and row.finished_at == clock.now - 299
    clock.now += 2
    assert await ledger.prune() == 1 and await ledger.get("k") is None
    ledger.close()


async def test_an_outcome_for_a_key_never_begun_gets_a_row_of_its_own(path):
    """A delivery answered before it started (cancelled, refused) is still recorded, with
    its tool and digest, and kept min_keep_s, so a redelivery gets the same answer."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, min_keep_s=300)
    await ledger.finish("k", Outcome.success("early"), "t", "d")
    row = await ledger.get("k")
    assert row is not None
    assert (row.tool, row.args_digest, row.started_at, row.finished_at) == (
        "t", "d", clock.now, clock.now
    )
    assert row.outcome is not None and row.outcome.result == "early"
    assert row.keep_until == clock.now + 300
    ledger.close()
