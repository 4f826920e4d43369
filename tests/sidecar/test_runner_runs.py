"""The ToolRunner on its own: which runs count as started, giving up on shutdown, and one
run's start and outcome in the ledger (shielded writes, failing writes, what is remembered).
MockClock and the in-memory ledger (helpers in runner_kit)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from deskbridge_common import Job
from deskbridge_sidecar import Outcome, Progress, tool
from deskbridge_sidecar._ledger import Ledger, args_digest

from .runner_kit import FailingWrites, Gated, counting, job, make, running_and_queued

TOOLS_DIR = str(Path(__file__).resolve().parents[1] / "tools")

# -- runs: one at a time, which ones count ------------------------------------------


async def test_only_the_run_holding_the_lock_counts_as_started(autojump_clock, nursery):
    submit, calls = counting(seconds=10)
    runner = make(nursery, submit)
    await running_and_queued(nursery, runner)
    assert runner.busy and runner.started_keys() == {"ka"} and calls == ["f"]
    assert runner.in_flight("ka") and runner.in_flight("kb")


async def test_interrupt_gives_up_on_the_started_run_only_and_once(autojump_clock, nursery):
    submit, calls = counting(seconds=100)
    ledger = Ledger.memory()
    runner = make(nursery, submit, ledger=ledger)
    answers: dict[str, Outcome] = {}

    async def deliver(d: Job) -> None:
        answers[d.idempotency_key] = await runner.execute(d)

    nursery.start_soon(deliver, job(key="ka"))
    await trio.testing.wait_all_tasks_blocked()
    nursery.start_soon(deliver, job(key="kb"))  # queued behind ka
    await trio.testing.wait_all_tasks_blocked()
    runner.close()  # as the daemon does before giving up: kb will never start
    assert runner.interrupt("the sidecar was stopped (SIGTERM)") == [("ka", "submit")]
    assert runner.interrupt("again") == []  # given up already
    await runner.wait_idle()
    await trio.testing.wait_all_tasks_blocked()
    expected = Outcome.failure(
        "in_doubt",
        "submit was running when the sidecar was stopped (SIGTERM); it may have acted. Not "
        "run again under this idempotency key: check, then retry with a new key",
    )
    assert answers == {"ka": expected}  # kb never started: left to the hub, unanswered
    assert (await ledger.get("ka")).outcome == expected and await ledger.get("kb") is None
    assert calls == ["f"] and trio.current_time() == 0


async def test_interrupt_answers_a_tool_that_ignores_cancellation_at_once(autojump_clock, nursery):
    """Before: the in_doubt answer and its record waited for the tool to give in, so a
    tool that ignored cancellation left its caller unanswered and the daemon waiting."""
    release = trio.Event()
    calls: list[str] = []

    @tool(side_effects=True)
    async def stubborn(form: str) -> dict:
        calls.append(form)
        with trio.CancelScope(shield=True):  # ignores every cancellation
            await release.wait()
        return {"late": form}

    ledger = Ledger.memory()
    runner = make(nursery, stubborn, ledger=ledger)
    answers: list[Outcome] = []

    async def deliver() -> None:
        answers.append(await runner.execute(job("stubborn", key="ks")))

    nursery.start_soon(deliver)
    await trio.testing.wait_all_tasks_blocked()
    runner.close()
    try:
        assert runner.interrupt("the sidecar was stopped (SIGTERM)") == [("ks", "stubborn")]
        with trio.move_on_after(1):
            await runner.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert answers and answers[0].code == "in_doubt" and not runner.busy
        assert (await ledger.get("ks")).outcome == answers[0] == runner.cached("ks")
        assert runner.interrupt("again") == [] and not runner.in_flight("ks")
    finally:
        release.set()  # the tool gives in at last: its late result changes nothing
    await trio.testing.wait_all_tasks_blocked()
    assert (await ledger.get("ks")).outcome == answers[0] and calls == ["f"]
    assert trio.current_time() < 1


async def test_wait_idle_does_not_wait_for_a_run_that_has_not_started(autojump_clock, nursery):
    """A run awaiting the person's approval has not started (it holds the tool lock but
    the tool has not run): stopping need not wait for a decision that may never come."""
    from deskbridge_sidecar import needs_approval
    from deskbridge_sidecar._consent import MemoryDesk

    @needs_approval
    @tool(side_effects=True)
    async def pay(invoice: str) -> str:
        return invoice

    desk = MemoryDesk()
    runner = make(nursery, pay, approvals=desk)
    nursery.start_soon(runner.execute, job("pay", {"invoice": "i"}, key="kp", deadline_s=600))
    await desk.wait_requested("job-1")
    assert runner.in_flight("kp") and not runner.busy and runner.started_keys() == set()
    await runner.wait_idle()
    assert trio.current_time() == 0


# -- one run: the start and the outcome in the ledger ----------------------------------


async def test_a_run_is_recorded_started_until_its_deadline_plus_the_result_ttl(
    autojump_clock, nursery
):
    submit, _ = counting(seconds=3)
    ledger = Ledger.memory()
    runner = make(nursery, submit, ledger=ledger, result_ttl_s=300)
    delivery = job(key="k1", deadline_s=600)
    nursery.start_soon(runner.execute, delivery)
    await trio.testing.wait_all_tasks_blocked()
    row = await ledger.get("k1")
    assert (row.tool, row.args_digest, row.outcome) == ("submit", args_digest({"form": "f"}), None)
    assert row.keep_until == delivery.deadline + 300
    assert runner.running == "submit" and runner.executions == {"submit": 1}
    await trio.sleep(3)
    await trio.testing.wait_all_tasks_blocked()
    assert runner.running is None
    assert (await ledger.get("k1")).outcome == Outcome.success({"submitted": "f", "n": 1})


async def test_cancelling_while_the_start_is_written_still_records_the_start(
    autojump_clock, nursery
):
    """A start is never half-known: the write is shielded, so the row says started and
    the answer says the tool was cancelled after it started, not before."""
    submit, calls = counting(seconds=10)
    ledger = Gated()
    runner = make(nursery, submit, ledger=ledger)
    answers = []

    async def deliver() -> None:
        answers.append(await runner.execute(job(key="k1")))

    nursery.start_soon(deliver)
    await ledger.begin_entered.wait()
    assert runner.cancel("k1") is True
    ledger.release.set()
    await trio.testing.wait_all_tasks_blocked()
    assert answers == [Outcome.failure("cancelled", "cancelled by the hub")]
    row = await ledger.get("k1")
    assert row.started_at is not None and row.outcome == answers[0]
    assert runner.executions == {"submit": 1} and calls == ["f"]  # to its first checkpoint


async def test_the_daemon_stopping_while_an_outcome_is_written_still_writes_it(autojump_clock):
    submit, _ = counting(seconds=1)
    ledger = Gated()
    ledger.release.set()  # the start goes through
    async with trio.open_nursery() as daemon_nursery:
        runner = make(daemon_nursery, submit, ledger=ledger)
        daemon_nursery.start_soon(runner.execute, job(key="k1"))
        await trio.testing.wait_all_tasks_blocked()
        ledger.release = trio.Event()  # hold the outcome's write
        await ledger.finish_entered.wait()
        daemon_nursery.cancel_scope.cancel()  # the daemon stops meanwhile
        ledger.release.set()
    assert (await ledger.get("k1")).outcome == Outcome.success({"submitted": "f", "n": 1})


async def test_a_start_the_ledger_cannot_record_never_runs_and_is_not_remembered(
    autojump_clock, nursery
):
    submit, calls = counting()
    runner = make(nursery, submit, ledger=FailingWrites("begin"))
    delivery = job(key="k1")
    assert await runner.execute(delivery) == Outcome.failure(
        "ledger_error",
        "the sidecar cannot record the start in its ledger, so the tool was not started: "
        "ledger write failed: disk full",
    )
    assert calls == [] and runner.executions == {} and runner.cached("k1") is None
    runner.ledger = Ledger.memory()  # the disk is back: a redelivery runs
    assert runner.admit(job(key="k1")) is None
    assert (await runner.execute(job(key="k1"))).ok and calls == ["f"]


async def test_an_outcome_the_ledger_cannot_record_is_kept_in_memory(autojump_clock, nursery):
    submit, calls = counting()
    runner = make(nursery, submit, ledger=FailingWrites("finish"))
    outcome = await runner.execute(job(key="k1"))
    assert outcome.ok and runner.cached("k1") == outcome
    assert runner.admit(job(key="k1")) == outcome and calls == ["f"]


async def test_an_unrecorded_outcome_the_cache_forgot_is_in_doubt_never_run_twice(
    autojump_clock, nursery
):
    """The start is on disk, the outcome could not be written, and the memory cache (1
    entry here) has since let it go: a redelivery finds a started row with no run in
    flight. The tool may have acted, so it is answered ``in_doubt`` and does not run
    again (before the fix it ran a second time)."""
    submit, calls = counting()
    runner = make(nursery, submit, ledger=FailingWrites("finish"), size=1)
    assert (await runner.execute(job(key="k1"))).ok
    assert (await runner.execute(job(key="k2"))).ok  # evicts k1 from the memory cache
    assert runner.cached("k1") is None
    assert runner.admit(job(key="k1")) is None
    again = await runner.execute(job(key="k1"))
    assert again.code == "in_doubt"
    assert again.error.message == (  # what the caller reads, exactly
        "the tool started earlier and its outcome was not recorded; "
        "it may have acted and is not run again"
    )
    assert calls == ["f", "f"] and runner.executions == {"submit": 2}


async def test_a_delivery_that_expired_while_queued_is_answered_but_not_remembered(
    autojump_clock, nursery
):
    """It never started, so nothing is known about its key: a redelivery with a fresh
    deadline is judged afresh."""
    submit, calls = counting(seconds=10)
    runner = make(nursery, submit)
    nursery.start_soon(runner.execute, job(key="ka"))
    await trio.testing.wait_all_tasks_blocked()
    late = await runner.execute(job(key="kb", deadline_s=5))  # waits 10 s for the lock
    assert late.code == "expired" and late.error.message.startswith("deadline passed 5.000 s ago")
    assert runner.cached("kb") is None and await runner.ledger.get("kb") is None
    assert runner.admit(job(key="kb", deadline_s=60)) is None


async def test_a_declined_job_is_remembered_as_declined(autojump_clock, nursery):
    from deskbridge_sidecar import needs_approval
    from deskbridge_sidecar._consent import MemoryDesk

    calls = []

    @needs_approval
    @tool(side_effects=True)
    async def pay(invoice: str) -> str:
        calls.append(invoice)
        return invoice

    desk = MemoryDesk()
    runner = make(nursery, pay, approvals=desk)
    answers = []

    async def deliver() -> None:
        answers.append(await runner.execute(job("pay", {"invoice": "i"}, key="kp")))

    nursery.start_soon(deliver)
    await desk.wait_requested("job-1")
    desk.decline("job-1")
    await trio.testing.wait_all_tasks_blocked()
    declined = Outcome.failure("declined", "pay was declined at the desktop; not run")
    assert answers == [declined] and runner.cached("kp") == declined
    assert (await runner.ledger.get("kp")).outcome == declined and calls == []


async def test_a_run_ended_by_the_daemon_stopping_answers_its_waiters_cancelled(autojump_clock):
    """The daemon's nursery is cancelled under a running tool (not a planned stop): the
    delivery waiting in its session is answered, not left hanging."""
    submit, calls = counting(seconds=100)
    answers = []
    async with trio.open_nursery() as session:
        async with trio.open_nursery() as daemon_nursery:
            runner = make(daemon_nursery, submit)

            async def deliver() -> None:
                answers.append(await runner.execute(job(key="k1")))

            session.start_soon(deliver)
            await trio.testing.wait_all_tasks_blocked()
            daemon_nursery.cancel_scope.cancel()
    assert answers == [
        Outcome.failure("cancelled", "the sidecar stopped before the tool finished")
    ]
    assert calls == ["f"] and trio.current_time() == 0


async def test_a_closing_runner_starts_nothing_and_leaves_the_delivery_unanswered(
    autojump_clock, nursery
):
    submit, calls = counting()
    runner = make(nursery, submit)
    runner.close()
    with trio.move_on_after(3600) as waited:
        await runner.execute(job(key="k1", deadline_s=7200))
    assert waited.cancelled_caught and calls == [] and runner.executions == {}
    assert await runner.ledger.get("k1") is None and runner.cached("k1") is None


async def test_each_start_of_a_tool_is_counted(autojump_clock, nursery):
    submit, calls = counting()
    runner = make(nursery, submit)
    for key in ("k1", "k2", "k3"):
        await runner.execute(job(key=key))
    assert runner.executions == {"submit": 3} and len(calls) == 3


async def test_hits_count_every_answer_from_memory_and_from_the_ledger(autojump_clock, nursery):
    submit, calls = counting()
    ledger = Ledger.memory()
    await ledger.finish("old", Outcome.success("kept"), "submit", args_digest({"form": "f"}))
    runner = make(nursery, submit, ledger=ledger)
    await runner.load()
    twins = [job(key="k1") for _ in range(3)]
    assert all(runner.admit(t) is None for t in twins)  # all queued before any ran
    for t in twins:
        await runner.execute(t)
    assert runner.dedupe_hits == 2  # the second and third found the first's outcome
    for _ in range(2):
        assert await runner.execute(job(key="old")) == Outcome.success("kept")
    assert runner.dedupe_hits == 4 and calls == ["f"]


async def test_a_redelivery_is_answered_only_once_the_outcome_is_durable(autojump_clock, nursery):
    """The outcome goes to the ledger before any answer: a redelivery arriving while it
    is being written waits for the write, as the original does."""
    submit, _ = counting(seconds=1)
    ledger = Gated()
    ledger.release.set()
    runner = make(nursery, submit, ledger=ledger)
    nursery.start_soon(runner.execute, job(key="k1"))
    await trio.testing.wait_all_tasks_blocked()
    ledger.release = trio.Event()  # hold the outcome's write
    await ledger.finish_entered.wait()
    answered = []

    async def redeliver() -> None:
        answered.append(await runner.execute(job(key="k1")))

    nursery.start_soon(redeliver)
    await trio.testing.wait_all_tasks_blocked()
    assert answered == []  # not before the write
    ledger.release.set()
    await trio.testing.wait_all_tasks_blocked()
    assert answered == [Outcome.success({"submitted": "f", "n": 1})]
    assert (await ledger.get("k1")).outcome == answered[0]


async def test_an_outcome_before_the_start_is_recorded_with_its_tool_and_args(
    autojump_clock, nursery
):
    """Cancelled while queued: the row names the request, so a redelivery with other
    arguments after a restart is still a reused key."""
    submit, _ = counting(seconds=10)
    ledger = Ledger.memory()
    runner = make(nursery, submit, ledger=ledger)
    await running_and_queued(nursery, runner)
    assert runner.cancel("kb") is True
    await trio.testing.wait_all_tasks_blocked()
    row = await ledger.get("kb")
    assert (row.tool, row.args_digest, row.outcome.code) == (
        "submit", args_digest({"form": "f"}), "cancelled"
    )


async def test_a_process_tool_runs_in_its_own_process_through_the_runner(nursery, monkeypatch):
    import os
    import sys

    sys.path.insert(0, TOOLS_DIR)
    import gil_tools
    from deskbridge_sidecar._tools import tool_of

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    runner = make(nursery, tool_of(gil_tools.crunch))
    with trio.fail_after(60):
        outcome = await runner.execute(job("crunch", {"n": 100}, key="k1"))
    assert outcome.ok and outcome.result["sum"] == sum(range(100))
    assert outcome.result["pid"] != os.getpid()


async def test_a_tool_reports_progress_to_the_waiting_delivery(autojump_clock, nursery):
    @tool
    async def steps(progress: Progress) -> str:
        progress(1, 2, "half")
        await trio.sleep(5)
        return "done"

    runner = make(nursery, steps)
    seen = []

    async def on_progress(update) -> None:
        seen.append((update.progress, update.total, update.message))

    outcome = await runner.execute(job("steps", {}, key="k1"), on_progress=on_progress)
    assert outcome == Outcome.success("done") and seen == [(1, 2, "half")]


async def test_a_sync_tool_reports_progress_from_its_thread(nursery):
    import threading

    reported, release = threading.Event(), threading.Event()

    @tool
    def steps(progress: Progress) -> str:
        progress(3, 4, "three")
        reported.set()
        assert release.wait(10)
        return "done"

    runner = make(nursery, steps, wall_clock=lambda: 0.0)
    delivery = Job(id="d", job_id="j", name="steps", args={}, idempotency_key="k1", deadline=60)
    seen = []

    async def on_progress(update) -> None:
        seen.append((update.progress, update.total, update.message))
        release.set()

    with trio.fail_after(20):
        outcome = await runner.execute(delivery, on_progress=on_progress)
    release.set()
    assert outcome == Outcome.success("done") and seen == [(3, 4, "three")]


async def test_a_queued_job_never_starts_past_its_time_when_the_wall_clock_steps_back(
    autojump_clock, nursery
):
    """Before: the deadline check at the start read only the wall clock, so a step back
    (NTP, a user setting the time) while a job queued behind another let it start after
    its caller was told ``timeout``. The time left is now also counted on the monotonic
    clock from the delivery's admission; a step forward still expires it (never late)."""
    from deskbridge_sidecar.testing import FakeWallClock

    wall = FakeWallClock()
    submit, calls = counting(seconds=30)
    runner = make(nursery, submit, wall_clock=wall)
    first = job(key="ka", deadline_s=600)
    assert runner.admit(first) is None
    nursery.start_soon(runner.execute, first)
    await trio.testing.wait_all_tasks_blocked()
    queued = job(key="kb", deadline_s=10)  # 10 s left when it arrives
    assert runner.admit(queued) is None
    wall.jump(-3600)  # the wall clock steps back an hour while kb waits for the lock
    outcome = await runner.execute(queued)  # ka holds the lock for 30 s
    assert outcome.code == "expired" and calls == ["f"], outcome
    assert trio.current_time() == 30


async def test_a_queued_job_starts_within_its_time_whatever_the_wall_clock_does(
    autojump_clock, nursery
):
    submit, calls = counting(seconds=5)
    runner = make(nursery, submit)
    first = job(key="ka", deadline_s=600)
    runner.admit(first)
    nursery.start_soon(runner.execute, first)
    await trio.testing.wait_all_tasks_blocked()
    queued = job(key="kb", deadline_s=10)
    assert runner.admit(queued) is None
    assert (await runner.execute(queued)).ok and calls == ["f", "f"]


async def test_a_job_awaiting_approval_expires_on_time_when_the_wall_clock_steps_back(
    autojump_clock, nursery
):
    """The approval wait used the wall clock too: stepped back, it kept waiting past the
    caller's time and an approval then ran the tool late."""
    from deskbridge_sidecar import needs_approval
    from deskbridge_sidecar._consent import MemoryDesk
    from deskbridge_sidecar.testing import FakeWallClock

    calls: list[str] = []

    @needs_approval
    @tool(side_effects=True)
    async def pay(invoice: str) -> str:
        calls.append(invoice)
        return invoice

    wall, desk = FakeWallClock(), MemoryDesk()
    runner = make(nursery, pay, approvals=desk, wall_clock=wall)
    delivery = job("pay", {"invoice": "i"}, key="kp", deadline_s=10)
    assert runner.admit(delivery) is None
    answers: list[Outcome] = []

    async def deliver() -> None:
        answers.append(await runner.execute(delivery))

    nursery.start_soon(deliver)
    await desk.wait_requested("job-1")
    wall.jump(-3600)
    await trio.sleep(20)  # past the caller's 10 s on any steady clock
    if "job-1" in desk.requests:
        desk.approve("job-1")
    await trio.testing.wait_all_tasks_blocked()
    assert answers and answers[0].code == "expired" and calls == [], answers
