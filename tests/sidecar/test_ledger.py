"""The durable ledger on a real SQLite file: restart, recovery to in_doubt, corruption,
one daemon per file, retention and the size cap."""

from __future__ import annotations

import logging
import sqlite3

import pytest
import trio
import trio.lowlevel
import trio.testing
from deskbridge_sidecar import Outcome
from deskbridge_sidecar._ledger import (
    LEDGER_FILE,
    Ledger,
    LedgerError,
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


def test_the_args_digest_is_sha256_of_sorted_compact_unescaped_json():
    """The digest is stored on disk: a ledger written by one version must match the same
    request after an upgrade, so its text is fixed: sorted keys, no spaces, UTF-8 as is."""
    import hashlib

    text = '{"a":{"x":null},"b":[1,"é"]}'
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert args_digest({"b": [1, "é"], "a": {"x": None}}) == expected


def test_a_failure_outcome_reads_back_equal_to_what_was_written():
    from deskbridge_sidecar._ledger import outcome_from_json, outcome_to_json

    for outcome in (Outcome.failure("tool_error", "no such button"), Outcome.success([1, "a"])):
        assert outcome_from_json(outcome_to_json(outcome)) == outcome


async def test_a_row_reads_back_whole_while_running_and_once_finished(path):
    from deskbridge_sidecar._ledger import LedgerEntry

    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, min_keep_s=300)
    started = clock.now
    await ledger.begin("k", "submit", "d1", keep_until=started + 900)
    running = LedgerEntry("k", "submit", "d1", started, None, None, started + 900)
    assert await ledger.get("k") == running
    clock.now += 7
    await ledger.finish("k", Outcome.success({"n": 1}))
    assert await ledger.get("k") == LedgerEntry(
        "k", "submit", "d1", started, started + 7, Outcome.success({"n": 1}), started + 900
    )
    ledger.close()


async def test_an_outcome_given_no_tool_is_stored_with_an_empty_tool_and_digest(path):
    ledger = Ledger.open(path)
    await ledger.finish("k", Outcome.success(None))
    row = await ledger.get("k")
    assert row is not None and (row.tool, row.args_digest) == ("", "")
    ledger.close()


async def test_prune_returns_expired_and_evicted_rows_together(path):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, max_entries=2, min_keep_s=10)
    for n in range(4):
        clock.now += 1
        keep = clock.now + (5 if n == 0 else 10_000)
        await ledger.begin(f"k{n}", "t", "d", keep_until=keep)
        await ledger.finish(f"k{n}", Outcome.success(n))
    clock.now += 100  # k0 expired; k1..k3 are one over the cap of 2
    assert await ledger.prune() == 2
    assert sorted(await ledger.keys()) == ["k2", "k3"]
    ledger.close()


async def test_at_its_cap_exactly_the_ledger_evicts_nothing_and_says_nothing(path, caplog):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, max_entries=2)
    for n in range(2):
        await ledger.begin(f"k{n}", "t", "d", keep_until=clock.now + 10_000)
        await ledger.finish(f"k{n}", Outcome.success(n))
    with caplog.at_level(logging.WARNING):
        assert await ledger.prune() == 0
    assert "over its cap" not in caplog.text
    await ledger.begin("k2", "t", "d", keep_until=clock.now + 10_000)
    assert await ledger.prune() == 1  # one over: one goes
    ledger.close()


def test_the_in_doubt_answer_names_the_tool_and_its_start_in_utc(path, monkeypatch):
    """The start is written in UTC whatever the desktop's time zone (here UTC+9)."""
    import os
    import time

    start = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    ledger = Ledger.open(path, wall_clock=lambda: start)
    trio.run(ledger.begin, "k", "click", "d", start + 600)
    ledger._conn.close()  # dies mid-job
    old = os.environ.get("TZ")
    os.environ["TZ"] = "XYZ-9"
    time.tzset()
    try:
        again = Ledger.open(path, wall_clock=lambda: start + 60)
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
    entry = trio.run(again.get, "k")
    assert entry.outcome == Outcome.failure(
        "in_doubt",
        "click started at 2023-11-14T22:13:20Z and the sidecar stopped before it finished; "
        "it may have acted. Not run again: check, then retry with a new idempotency key if "
        "it should run",
    )
    again.close()


async def test_a_recovered_row_is_kept_min_keep_s_after_the_restart_that_found_it(path):
    """Its window may have passed while the sidecar was down: the in_doubt answer still
    stays min_keep_s, for the redelivery the restart is about to get."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("k", "t", "d", keep_until=clock.now + 10)
    ledger._conn.close()
    restart = clock.now + 3600
    again = Ledger.open(path, wall_clock=clock, min_keep_s=120, now=restart)
    entry = await again.get("k")
    assert entry is not None and entry.outcome.code == "in_doubt"
    assert (entry.finished_at, entry.keep_until) == (restart, restart + 120)
    again.close()


async def test_open_prunes_what_expired_while_the_sidecar_was_down(path):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock, min_keep_s=300)
    await ledger.begin("old", "t", "d", keep_until=clock.now + 100)
    await ledger.finish("old", Outcome.success(1))
    await ledger.begin("new", "t", "d", keep_until=clock.now + 10_000)
    await ledger.finish("new", Outcome.success(2))
    ledger.close()
    clock.now += 1000
    again = Ledger.open(path, wall_clock=clock)
    assert sorted(await again.keys()) == ["new"]
    again.close()


async def test_by_default_a_finished_row_is_kept_300_s(path):
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.finish("k", Outcome.success(1), "t", "d")
    clock.now += 300
    assert await ledger.prune() == 0
    clock.now += 0.5
    assert await ledger.prune() == 1
    ledger.close()


async def test_file_ledger_sql_runs_in_a_worker_thread_one_call_at_a_time(path):
    """Every statement runs off the event loop's thread, and a call waits for the one
    before it (a limiter of one), so two writes never interleave on the connection."""
    import threading

    ledger = Ledger.open(path)
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class Recording:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, *args):
            threads.append(threading.get_ident())
            return self.conn.execute(*args)

    real = ledger._conn
    ledger._conn = Recording(real)
    await ledger.begin("k", "t", "d", keep_until=2e9)
    await ledger.get("k")
    assert threads and loop_thread not in threads

    first_in, release = threading.Event(), threading.Event()

    def first() -> None:
        first_in.set()
        assert release.wait(10)

    async with trio.open_nursery() as nursery:
        try:
            nursery.start_soon(ledger._call, first)
            await trio.to_thread.run_sync(first_in.wait, 10)
            nursery.start_soon(ledger.get, "k")
            await trio.testing.wait_all_tasks_blocked()
            stats = ledger._limiter.statistics()
            assert (stats.borrowed_tokens, stats.tasks_waiting) == (1, 1)  # the read waits
        finally:
            release.set()
    ledger._conn = real
    ledger.close()


async def test_a_memory_ledger_keeps_its_cap():
    ledger = Ledger.memory(max_entries=1)
    for n in range(2):
        await ledger.finish(f"k{n}", Outcome.success(n), "t", "d")
    assert await ledger.prune() == 1 and list(await ledger.keys()) == ["k1"]


async def test_memory_ledgers_share_nothing_and_leave_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one, two = Ledger.memory(), Ledger.memory()
    await one.finish("k", Outcome.success(1), "t", "d")
    assert await two.get("k") is None and list(tmp_path.iterdir()) == []


async def test_a_memory_ledger_built_in_one_thread_serves_another():
    """An embedder may build it before (or outside) the thread its daemon runs in."""
    ledger = await trio.to_thread.run_sync(Ledger.memory)
    await ledger.finish("k", Outcome.success(1), "t", "d")
    assert (await ledger.get("k")).outcome == Outcome.success(1)


@pytest.mark.parametrize("how", ["file", "folder", "replaced"])
async def test_a_ledger_file_deleted_or_replaced_under_it_refuses_every_write(path, how):
    """Before: SQLite kept writing into the unlinked file, so a start "recorded" there was
    lost at the next open (the tool ran again) and the exclusive lock no longer kept a
    second daemon off the data directory."""
    import shutil

    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("k1", "submit", args_digest({}), keep_until=clock.now + 600)
    if how == "folder":
        shutil.rmtree(path.parent)
    else:
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        if how == "replaced":
            path.write_bytes(b"")
    with pytest.raises(LedgerError, match="deleted or replaced"):
        await ledger.begin("k2", "submit", args_digest({}), keep_until=clock.now + 600)
    with pytest.raises(LedgerError, match="deleted or replaced"):
        await ledger.finish("k1", Outcome.success({}))
    assert (await ledger.get("k1")).outcome is None  # reads still answer from the open file
    ledger.close()


async def test_the_acknowledged_catalogue_outlives_the_process(path):
    ledger = Ledger.open(path)
    assert await ledger.catalogue() == {}
    await ledger.record_catalogue({"a": ("1", 0.0), "b": ("2", 1_700_000_000.5)})
    ledger.close()
    again = Ledger.open(path)
    assert await again.catalogue() == {"a": ("1", 0.0), "b": ("2", 1_700_000_000.5)}
    again.close()


async def test_a_catalogue_in_the_earlier_form_reads_as_fingerprints_with_no_change_known(path):
    ledger = Ledger.open(path)
    ledger._conn.execute(
        "INSERT OR REPLACE INTO meta VALUES ('catalogue', ?)", ('{"a": "1", "b": "2"}',)
    )
    assert await ledger.catalogue() == {"a": ("1", 0.0), "b": ("2", 0.0)}
    ledger.close()


def test_a_tools_fingerprint_covers_its_entry_and_its_configuration(tmp_path):
    from deskbridge_sidecar.toolsets.files import FilesToolset

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = {t.name: t.fingerprint() for t in FilesToolset([tmp_path / "a"]).tools()}
    b = {t.name: t.fingerprint() for t in FilesToolset([tmp_path / "b"]).tools()}
    a2 = {t.name: t.fingerprint() for t in FilesToolset([tmp_path / "a"]).tools()}
    assert a == a2 and all(a[n] != b[n] for n in a)


# -- which jobs a row speaks for (its job ids: answered past the key's window) -----------


async def test_a_job_running_when_the_process_died_is_still_its_rows_job(path):
    """begin records the job id: after a crash the recovered in_doubt row answers that
    job's redelivery past the key's window too (it may have acted), never "new"."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("k", "click", args_digest({}), keep_until=clock.now + 60, job_id="j1")
    ledger._conn.close()  # the process dies mid-job
    again = Ledger.open(path, wall_clock=clock)
    entry = await again.get("k")
    assert entry.job_ids == ("j1",) and entry.outcome.code == "in_doubt"
    assert entry.answers("j1", entry.keep_until + 1)
    assert not entry.answers("j2", entry.keep_until + 1)
    again.close()


async def test_a_job_finished_without_a_begin_is_its_rows_job(path):
    """A delivery cancelled before it started has its row written by finish alone: that
    row answers the job past the key's window."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.finish("k", Outcome.success(None), "t", args_digest({}), job_id="j1")
    entry = await ledger.get("k")
    assert entry.job_ids == ("j1",) and entry.job_keep_until == clock.now + ledger.job_keep_s
    ledger.close()


async def test_finish_adds_its_job_to_those_the_row_already_answers(path):
    """finish keeps the jobs begin (or earlier answers) named and adds its own, whether
    or not begin named one."""
    clock = Clock()
    ledger = Ledger.open(path, wall_clock=clock)
    await ledger.begin("a", "t", args_digest({}), keep_until=clock.now + 60)
    await ledger.finish("a", Outcome.success(None), job_id="j1")
    await ledger.begin("b", "t", args_digest({}), keep_until=clock.now + 60, job_id="j1")
    await ledger.finish("b", Outcome.success(None), job_id="j2")
    assert (await ledger.get("a")).job_ids == ("j1",)
    assert (await ledger.get("b")).job_ids == ("j1", "j2")
    ledger.close()
