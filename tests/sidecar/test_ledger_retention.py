"""The ledger remembers a finished job as long as the hub may redeliver it
(``_jobstate.forwarded_keep_s``: a day + the result TTL after the hub's last write), and
no longer answers a *new* job that reuses the key once the key's window (the job's
deadline + the result TTL, at least ``min_keep_s`` after it finished: the hub's
idempotency record) is over. MockClock, the in-memory ledger on the test's wall clock."""

from __future__ import annotations

import sqlite3

import attrs
import trio
from deskbridge_sidecar import Outcome, _ledger
from deskbridge_sidecar._ledger import Ledger, outcome_to_json
from deskbridge_sidecar.testing import FakeWallClock

from .runner_kit import counting, job, make

HOUR = 3600.0
#: the hub's forwarded keep (a day + the result TTL) + a result TTL of slack
JOB_KEEP_S = 24 * HOUR + 2 * 300


def _runner(nursery, *tools, **kw):
    clock = FakeWallClock()
    ledger = Ledger.memory(wall_clock=clock, **kw)
    return make(nursery, *tools, ledger=ledger, wall_clock=clock), ledger


async def _answer(runner, delivery):
    return runner.admit(delivery) or await runner.execute(delivery)


def _again(delivery):
    """The hub's redelivery of the same job: a fresh delivery id, the same job id."""
    return attrs.evolve(delivery, id=delivery.id + "-again")


async def test_a_finished_job_redelivered_after_its_key_window_is_answered_not_expired(
    autojump_clock, nursery
):
    """The answer was lost with the socket; the desktop comes back an hour later (past
    the deadline + result TTL, past min_keep_s): the hub still holds the job as
    forwarded and redelivers it. The ledger answers what ran (was: pruned, ``expired``)."""
    submit, calls = counting()
    runner, _ = _runner(nursery, submit)
    first = job(key="k1", job_id="job-1", deadline_s=30)
    ran = await _answer(runner, first)
    assert ran.ok
    await trio.sleep(HOUR)
    await runner.prune()  # the daemon's prune pass
    assert await _answer(runner, _again(first)) == ran
    assert calls == ["f"]


async def test_it_is_answered_until_the_hubs_forwarded_keep_and_forgotten_after(
    autojump_clock, nursery
):
    submit, calls = counting()
    runner, ledger = _runner(nursery, submit)
    first = job(key="k1", job_id="job-1", deadline_s=30)
    ran = await _answer(runner, first)
    await trio.sleep(24 * HOUR + 300)  # the hub's forwarded keep from the same moment
    await runner.prune()
    assert await _answer(runner, _again(first)) == ran
    await trio.sleep(JOB_KEEP_S + 1)  # nobody asked again since
    await runner.prune()
    assert await ledger.get("k1") is None
    assert calls == ["f"]


async def test_each_answer_from_the_ledger_keeps_the_row_another_forwarded_keep(
    autojump_clock, nursery
):
    """A redelivery answered from the ledger is written by the hub again (``delivered``,
    a day + TTL); if that answer is lost too, the next redelivery still finds the row."""
    submit, calls = counting()
    runner, _ = _runner(nursery, submit)
    first = job(key="k1", job_id="job-1", deadline_s=30)
    ran = await _answer(runner, first)
    for _ in range(3):
        await trio.sleep(20 * HOUR)
        await runner.prune()
        assert await _answer(runner, _again(first)) == ran
    assert calls == ["f"]


async def test_a_new_job_reusing_the_key_after_its_window_runs_and_is_not_a_replay(
    autojump_clock, nursery
):
    """After the key's window the hub may have forgotten the key: a job with another
    job id under it is a new request. It runs (same arguments) or runs with its own
    arguments (never ``idempotency_key_reused``): no stale replay of the old outcome."""
    submit, calls = counting()
    runner, _ = _runner(nursery, submit)
    assert (await _answer(runner, job(key="k1", job_id="job-1", deadline_s=30))).ok
    await trio.sleep(HOUR)
    await runner.prune()
    same = await _answer(runner, job(key="k1", job_id="job-2", deadline_s=30))
    assert same == Outcome.success({"submitted": "f", "n": 2})
    await trio.sleep(HOUR)
    other = await _answer(runner, job(key="k1", job_id="job-3", args={"form": "g"}))
    assert other == Outcome.success({"submitted": "g", "n": 3})
    assert calls == ["f", "f", "g"]


async def test_inside_the_key_window_another_job_under_the_key_is_still_one_request(
    autojump_clock, nursery
):
    """The hub lost its idempotency record (its holder died) and a retry enqueued a
    second job: inside the window the ledger still answers it from the first's row, and
    that second job's own redelivery after the window is answered too."""
    submit, calls = counting()
    runner, _ = _runner(nursery, submit)
    ran = await _answer(runner, job(key="k1", job_id="job-1", deadline_s=30))
    await trio.sleep(301)  # the memory cache let it go; the key's window has not ended
    second = job(key="k1", job_id="job-2", deadline_s=-1)
    assert await _answer(runner, second) == ran
    other = runner.admit(job(key="k1", job_id="job-3", args={"form": "g"}))
    assert other is not None and other.code == "idempotency_key_reused"
    await trio.sleep(HOUR)
    await runner.prune()
    assert await _answer(runner, _again(second)) == ran
    assert calls == ["f"]


async def test_the_rows_job_and_its_keep_survive_a_restart(tmp_path, autojump_clock, nursery):
    clock = FakeWallClock()
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger.open(path, wall_clock=clock)
    submit, calls = counting()
    runner = make(nursery, submit, ledger=ledger, wall_clock=clock)
    first = job(key="k1", job_id="job-1", deadline_s=30)
    ran = await _answer(runner, first)
    ledger.close()
    await trio.sleep(HOUR)
    again = Ledger.open(path, wall_clock=clock)
    restarted = make(nursery, submit, ledger=again, wall_clock=clock)
    await restarted.load()
    assert await _answer(restarted, _again(first)) == ran
    assert calls == ["f"]
    again.close()


async def test_a_ledger_written_before_rows_named_their_job_opens_and_keeps_its_rules(
    tmp_path,
):
    """A file from before this change (no job column): its rows keep their old
    retention, and the file gains the columns."""
    import sqlite3

    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE jobs (key TEXT PRIMARY KEY, tool TEXT NOT NULL, args_digest TEXT NOT "
        "NULL, started_at REAL NOT NULL, finished_at REAL, outcome TEXT, keep_until REAL NOT "
        "NULL); CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
    )
    conn.execute(
        "INSERT INTO jobs VALUES ('old', 't', 'd', 1e9, 1e9, ?, 2e9)",
        ('{"ok": true, "result_json": "1"}',),
    )
    conn.commit()
    conn.close()
    ledger = Ledger.open(path, now=1.5e9)
    entry = await ledger.get("old")
    assert entry is not None and entry.job_ids == () and entry.keep_until == 2e9
    assert entry.answers("any-job", 1.9e9) and not entry.answers("any-job", 2.1e9)
    ledger.close()
    again = Ledger.open(path, now=2e9 + 1)  # pruned at its old keep_until
    assert await again.get("old") is None
    again.close()


def test_the_ledgers_job_keep_is_the_hubs_forwarded_keep_and_a_result_ttl():
    assert _ledger.JOB_KEEP_S == JOB_KEEP_S


async def test_past_its_byte_bound_the_oldest_results_are_dropped_and_answer_in_doubt(
    tmp_path, caplog
):
    """Rows are kept a day, so results are bounded by bytes: the oldest finished rows'
    results are dropped (never the row: the job stays known to have run), and a
    redelivery reads in_doubt saying it ran, not expired and not a second run."""
    now = [1_700_000_000.0]
    ledger = Ledger.open(tmp_path / "ledger.sqlite3", wall_clock=lambda: now[0], max_bytes=10_000)
    for n in range(4):
        now[0] += 1
        await ledger.begin(f"k{n}", "t", "d", keep_until=now[0] + 60, job_id=f"job-{n}")
        await ledger.finish(f"k{n}", Outcome.success("x" * 4000), job_id=f"job-{n}")
    assert await ledger.prune() == 0
    oldest, older = await ledger.get("k0"), await ledger.get("k1")
    for entry in (oldest, older):
        assert entry.outcome.code == "in_doubt"
        assert "t ran and completed at" in entry.outcome.error.message
        assert "result (4035 bytes) was dropped" in entry.outcome.error.message
        assert entry.answers(entry.job_ids[0], now[0] + 3600)
    assert (await ledger.get("k2")).outcome == Outcome.success("x" * 4000)
    # (dropped one by one as the writes went past the bound, not at the prune)
    assert caplog.text.count("dropped the results of the 1 oldest finished jobs") == 2
    (total,) = ledger._conn.execute("SELECT SUM(outcome_bytes) FROM jobs").fetchone()
    assert total <= 10_000
    ledger.close()


async def test_past_its_row_cap_the_oldest_finished_rows_go_even_inside_a_jobs_keep(
    caplog,
):
    now = [1_700_000_000.0]
    ledger = Ledger.memory(wall_clock=lambda: now[0], max_entries=2)
    for n in range(3):
        now[0] += 1
        await ledger.finish(f"k{n}", Outcome.success(n), "t", "d", job_id=f"job-{n}")
    now[0] += 3600  # every key window over; every job keep not
    assert await ledger.prune() == 1
    assert sorted(await ledger.keys()) == ["k1", "k2"]
    assert "ledger over its cap of 2 keys" in caplog.text


async def test_a_burst_of_large_results_between_prunes_stays_within_the_byte_bound(
    tmp_path, caplog
):
    """The byte bound holds at every write, not only at the prune (every 60 s): a burst
    of large results between two prunes grew the ledger far past it (here 6 results of
    4 KB against a 10 KB bound, no prune at all: 24 KB). The newest result stays whole;
    the oldest are dropped as at the prune (in_doubt, "it ran")."""
    now = [1_700_000_000.0]
    ledger = Ledger.open(tmp_path / "ledger.sqlite3", wall_clock=lambda: now[0], max_bytes=10_000)
    for n in range(6):
        now[0] += 0.1
        await ledger.finish(f"k{n}", Outcome.success("x" * 4000), "t", "d", job_id=f"job-{n}")
        (total,) = ledger._conn.execute("SELECT SUM(outcome_bytes) FROM jobs").fetchone()
        assert total <= 10_000, f"{total} bytes of results after {n + 1} writes"
    assert (await ledger.get("k5")).outcome == Outcome.success("x" * 4000)
    assert (await ledger.get("k0")).outcome.code == "in_doubt"
    assert "ledger over its size of 10000 bytes" in caplog.text
    ledger.close()


async def test_a_ledger_within_its_byte_bound_does_not_sum_its_results_at_each_write(tmp_path):
    """Writes that keep the running total at or under the bound sum nothing (the total
    is read at open and kept running); a write past the bound sums, then compacts. A
    SUM per write would cost the ledger's whole size at each finish."""
    now = [1_700_000_000.0]
    size = len(outcome_to_json(Outcome.success("x" * 1000)).encode("utf-8"))
    ledger = Ledger.open(
        tmp_path / "ledger.sqlite3", wall_clock=lambda: now[0], max_bytes=2 * size
    )
    sums: list[str] = []
    ledger._conn.set_trace_callback(lambda sql: sums.append(sql) if "SUM(" in sql else None)
    for n in range(2):  # the second write brings the total to exactly the bound
        now[0] += 0.1
        await ledger.finish(f"k{n}", Outcome.success("x" * 1000), "t", "d", job_id=f"job-{n}")
    assert sums == []
    now[0] += 0.1
    await ledger.finish("k2", Outcome.success("x" * 1000), "t", "d", job_id="job-2")
    assert len(sums) == 1, sums  # past the bound: summed, then compacted
    assert (await ledger.get("k0")).outcome.code == "in_doubt"
    ledger.close()


async def test_a_failed_compaction_is_tried_again_at_the_next_write(tmp_path, monkeypatch):
    """A compaction that fails (a locked or full disk) leaves the written outcome and
    is tried again at the next write, which sums afresh: the ledger stays writable."""
    now = [1_700_000_000.0]
    ledger = Ledger.open(tmp_path / "ledger.sqlite3", wall_clock=lambda: now[0], max_bytes=10_000)
    real = Ledger._compact
    calls: list[str] = []

    def failing_once(self: Ledger) -> None:
        calls.append("compact")
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        real(self)

    monkeypatch.setattr(Ledger, "_compact", failing_once)
    for n in range(3):  # the third write passes the bound: its compaction fails
        now[0] += 0.1
        await ledger.finish(f"k{n}", Outcome.success("x" * 4000), "t", "d", job_id=f"job-{n}")
    assert calls == ["compact"]
    assert (await ledger.get("k2")).outcome == Outcome.success("x" * 4000)  # written
    now[0] += 0.1
    await ledger.finish("k3", Outcome.success("x" * 4000), "t", "d", job_id="job-3")
    assert calls == ["compact", "compact"]
    (total,) = ledger._conn.execute("SELECT SUM(outcome_bytes) FROM jobs").fetchone()
    assert total <= 10_000, total
    assert (await ledger.get("k3")).outcome == Outcome.success("x" * 4000)
    ledger.close()
