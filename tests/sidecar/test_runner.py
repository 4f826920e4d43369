"""The ToolRunner on its own (no session, no socket): admission, answers from memory and
from the ledger, joining a running original, cancelling, recording a cancellation. MockClock
and the in-memory ledger; deliveries are plain Job values (helpers in runner_kit)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_sidecar import Outcome, ToolRegistry, tool
from deskbridge_sidecar._dedupe import DedupeCache
from deskbridge_sidecar._isolate import isolated
from deskbridge_sidecar._ledger import Ledger, args_digest
from deskbridge_sidecar._runner import ToolRunner
from deskbridge_sidecar.testing import FakeWallClock

from .runner_kit import counting, failing_reads, job, make, running_and_queued

# -- answers without running ---------------------------------------------------------


async def test_a_reused_key_names_the_first_tool_and_what_differs(autojump_clock, nursery):
    submit, calls = counting()
    other, _ = counting(name="other")
    runner = make(nursery, submit, other)
    assert await runner.execute(job(key="k1")) == Outcome.success({"submitted": "f", "n": 1})
    changed = runner.admit(job(args={"form": "g"}, key="k1"))
    elsewhere = runner.admit(job(name="other", key="k1"))
    assert changed == Outcome.failure(
        "idempotency_key_reused",
        "idempotency key 'k1' was first used for 'submit' with other arguments; this request "
        "('submit') has different arguments. A key names one request: use a new key",
    )
    assert elsewhere == Outcome.failure(
        "idempotency_key_reused",
        "idempotency key 'k1' was first used for 'submit' with other arguments; this request "
        "('other') has another tool. A key names one request: use a new key",
    )
    assert calls == ["f"]


async def test_cached_is_the_recent_outcome_of_that_key(autojump_clock, nursery):
    submit, _ = counting()
    runner = make(nursery, submit)
    outcome = await runner.execute(job(key="k1"))
    assert runner.cached("k1") == outcome and runner.cached("k2") is None


async def test_a_twin_that_finished_while_this_delivery_queued_answers_from_memory(
    autojump_clock, nursery
):
    """Both deliveries were admitted before either ran; the second finds the first's
    outcome in memory: no ledger read (the ledger's reads fail here), one run, one hit."""
    submit, calls = counting()
    runner = make(nursery, submit, ledger=failing_reads())
    first, second = job(key="k1"), job(key="k1")
    assert runner.admit(first) is None and runner.admit(second) is None
    one = await runner.execute(first)
    assert await runner.execute(second) == one and one.ok
    assert calls == ["f"] and runner.dedupe_hits == 1


async def test_a_key_held_by_the_ledger_is_answered_from_its_record(autojump_clock, nursery):
    submit, calls = counting()
    ledger = Ledger.memory()
    await ledger.begin("k1", "submit", args_digest({"form": "f"}), keep_until=2e9)
    await ledger.finish("k1", Outcome.success({"from": "ledger"}))
    runner = make(nursery, submit, ledger=ledger)
    await runner.load()
    delivery = job(key="k1")
    assert runner.admit(delivery) is None  # known: execute reads the record
    assert await runner.execute(delivery) == Outcome.success({"from": "ledger"})
    assert calls == [] and runner.dedupe_hits == 1


async def test_a_ledger_that_cannot_be_read_answers_ledger_error_and_runs_nothing(
    autojump_clock, nursery
):
    submit, calls = counting()
    ledger = failing_reads()
    await ledger.finish("k1", Outcome.success(1), "submit", args_digest({"form": "f"}))
    runner = make(nursery, submit, ledger=ledger)
    await runner.load()
    assert await runner.execute(job(key="k1")) == Outcome.failure(
        "ledger_error", "the sidecar cannot read its ledger: ledger read failed: disk I/O error"
    )
    assert calls == []


async def test_a_known_key_whose_row_is_gone_runs_as_a_new_request_once(autojump_clock, nursery):
    """Two deliveries of a key the ledger no longer holds: both read the ledger, the
    first starts the run and the second, back from its read, joins it."""
    submit, calls = counting(seconds=5)
    ledger = Ledger.memory()
    await ledger.finish("k1", Outcome.success(1), "submit", args_digest({"form": "f"}))
    runner = make(nursery, submit, ledger=ledger)
    await runner.load()
    ledger._conn.execute("DELETE FROM jobs")  # pruned between two prune passes
    outcomes = []

    async def deliver() -> None:
        outcomes.append(await runner.execute(job(key="k1")))

    async with trio.open_nursery() as inner:
        inner.start_soon(deliver)
        inner.start_soon(deliver)
    assert calls == ["f"] and outcomes[0] == outcomes[1]
    assert outcomes[0] == Outcome.success({"submitted": "f", "n": 1})


async def test_joining_a_running_original_reads_nothing_from_the_ledger(autojump_clock, nursery):
    """The redelivery of a key whose run is in flight waits for that run; a failing
    ledger read cannot turn it into ledger_error."""
    submit, calls = counting(seconds=10)
    runner = make(nursery, submit, ledger=failing_reads())
    original = job(key="k1")
    assert runner.admit(original) is None
    first: list[Outcome] = []

    async def run_original() -> None:
        first.append(await runner.execute(original))

    nursery.start_soon(run_original)
    await trio.testing.wait_all_tasks_blocked()
    assert runner.started_keys() == {"k1"}
    redelivery = job(key="k1")
    assert runner.admit(redelivery) is None
    second = await runner.execute(redelivery)
    await trio.testing.wait_all_tasks_blocked()
    assert second.ok and first == [second] and calls == ["f"]
    assert runner.dedupe_hits == 1 and trio.current_time() == 10


# -- cancel, record -------------------------------------------------------------------


async def test_cancel_says_whether_a_cancellation_was_requested(autojump_clock, nursery):
    submit, _ = counting(seconds=10)
    runner = make(nursery, submit)
    assert runner.cancel("nothing-here") is False
    a, b = await running_and_queued(nursery, runner)
    assert runner.cancel("kb") is True  # queued: cancelled before it started
    assert runner.cancel("ka") is True  # an async tool: cancelled at its next checkpoint
    await trio.testing.wait_all_tasks_blocked()
    assert runner.cached("kb") == Outcome.failure(
        "cancelled", "cancelled by the hub before it started"
    )
    assert runner.cached("ka") == Outcome.failure("cancelled", "cancelled by the hub")


async def test_a_sync_tool_in_its_thread_cannot_be_cancelled(autojump_clock, nursery):
    import threading

    release = threading.Event()

    @tool
    def crunch() -> str:
        assert release.wait(10)
        return "done"

    runner = make(nursery, crunch)
    delivery = job("crunch", {}, key="kc")
    answers = []
    answered = trio.Event()

    async def deliver() -> None:
        answers.append(await runner.execute(delivery))
        answered.set()

    nursery.start_soon(deliver)
    await trio.testing.wait_all_tasks_blocked()
    try:
        assert runner.started_keys() == {"kc"}
        assert runner.cancel("kc") is False
    finally:
        release.set()
    await answered.wait()
    assert answers == [Outcome.success("done")]  # its real outcome


async def test_a_cancellation_before_the_start_is_remembered_everywhere(autojump_clock, nursery):
    """record(): in memory at once (a redelivery gets the same answer; other arguments
    are a reused key) and in the ledger with the delivery's tool and args digest."""
    submit, calls = counting()
    ledger = Ledger.memory()
    runner = make(nursery, submit, ledger=ledger)
    delivery = job(key="k1")
    outcome = Outcome.failure("cancelled", "cancelled by the hub before it started")
    runner.record("k1", outcome, delivery)
    assert runner.cached("k1") == outcome
    assert runner.admit(job(key="k1")) == outcome
    assert runner.admit(job(args={"form": "g"}, key="k1")).code == "idempotency_key_reused"
    await trio.testing.wait_all_tasks_blocked()
    row = await ledger.get("k1")
    assert (row.key, row.tool, row.args_digest, row.outcome) == (
        "k1",
        "submit",
        args_digest({"form": "f"}),
        outcome,
    )
    assert calls == []


async def test_record_never_replaces_what_the_key_is_known_for(autojump_clock, nursery):
    submit, _ = counting()
    runner = make(nursery, submit)
    await runner.execute(job(key="k1"))
    runner.record("k1", Outcome.failure("cancelled", "late"), job("other", {}, key="k1"))
    assert runner.admit(job("other", {}, key="k1")).code == "idempotency_key_reused"


async def test_record_without_the_delivery_keeps_the_outcome_under_no_tool(autojump_clock, nursery):
    runner = make(nursery)
    outcome = Outcome.failure("cancelled", "x")
    runner.record("k1", outcome)
    await trio.testing.wait_all_tasks_blocked()
    row = await runner.ledger.get("k1")
    assert (row.tool, row.args_digest, row.outcome) == ("", "", outcome)
    known = runner._known["k1"]
    assert (known.tool, known.args_digest) == ("", "")


# -- which tools run in a process of their own ------------------------------------------


@pytest.mark.parametrize(
    ("kind", "isolate_sync", "expected"),
    [
        ("isolated", False, True),
        ("sync", True, True),
        ("sync", False, False),
        ("async", True, False),
    ],
)
def test_isolates_marked_tools_and_sync_ones_under_isolate_sync(kind, isolate_sync, expected):
    def sync_fn() -> None: ...

    async def async_fn() -> None: ...

    if kind == "isolated":
        fn = isolated(sync_fn)
    else:
        fn = sync_fn if kind == "sync" else async_fn
    registry = ToolRegistry([tool(fn)])
    spec = registry.get(fn.__name__)
    assert spec is not None
    runner = ToolRunner(registry=registry, cache=DedupeCache(), nursery=None,  # type: ignore[arg-type]
                        wall_clock=FakeWallClock(), isolate_sync=isolate_sync)  # fmt: skip
    assert runner.isolates(spec) is expected


# -- admission: decided once, from memory ------------------------------------------------


async def test_other_args_while_the_original_waits_for_the_lock_are_refused(
    autojump_clock, nursery
):
    """The original is queued, not started (the ledger does not know it yet): the run in
    flight is what the key is checked against."""
    submit, calls = counting(seconds=10)
    runner = make(nursery, submit)
    await running_and_queued(nursery, runner)  # kb waits behind ka
    refused = runner.admit(job(args={"form": "other"}, key="kb"))
    assert refused is not None and refused.code == "idempotency_key_reused"
    assert runner.admit(job(key="kb")) is None  # the same request joins it


async def test_a_key_held_by_the_ledger_is_never_refused_afresh(autojump_clock, nursery):
    """Its redelivery is answered by its record, even one arriving past its deadline or
    for a tool this sidecar no longer offers."""
    ledger = Ledger.memory()
    await ledger.finish("k1", Outcome.success(1), "gone", args_digest({"form": "f"}))
    runner = make(nursery, ledger=ledger)
    await runner.load()
    assert runner.admit(job("gone", key="k1", deadline_s=-5)) is None
    assert await runner.execute(job("gone", key="k1", deadline_s=-5)) == Outcome.success(1)


async def test_a_queued_runs_redelivery_joins_it_even_past_its_deadline(autojump_clock, nursery):
    submit, _ = counting(seconds=10)
    runner = make(nursery, submit)
    await running_and_queued(nursery, runner)
    assert runner.admit(job(key="kb", deadline_s=-5)) is None  # joins kb, not "expired"


async def test_bad_arguments_are_refused_at_admission_and_nothing_starts(autojump_clock, nursery):
    submit, calls = counting()
    runner = make(nursery, submit)
    refused = runner.admit(job(args={"form": 1, "extra": True}, key="k1"))
    assert refused is not None and refused.code == "bad_args"
    assert runner.executions == {} and calls == [] and await runner.ledger.get("k1") is None


async def test_each_answer_from_memory_counts_one_dedupe_hit(autojump_clock, nursery):
    submit, calls = counting()
    runner = make(nursery, submit)
    await runner.execute(job(key="k1"))
    for _ in range(3):
        assert runner.admit(job(key="k1")) is not None
    assert runner.dedupe_hits == 3 and calls == ["f"]


async def test_each_delivery_joining_a_run_counts_one_hit(autojump_clock, nursery):
    submit, calls = counting(seconds=10)
    runner = make(nursery, submit)
    answers = []

    async def deliver() -> None:
        answers.append(await runner.execute(job(key="k1")))

    for _ in range(3):
        nursery.start_soon(deliver)
        await trio.testing.wait_all_tasks_blocked()
    await trio.sleep(10)
    await trio.testing.wait_all_tasks_blocked()
    assert len(answers) == 3 and calls == ["f"] and runner.dedupe_hits == 2


async def test_a_delivery_at_its_deadline_exactly_is_expired(autojump_clock, nursery):
    submit, calls = counting()
    runner = make(nursery, submit)
    refused = runner.admit(job(key="k1", deadline_s=0))
    assert refused == Outcome.failure("expired", "deadline passed 0.000 s ago; not started")
    assert calls == []


async def test_a_job_queued_for_a_tool_that_changed_since_is_refused_not_run(
    autojump_clock, nursery
):
    """A sidecar restarted with another definition of a tool (its schema, or a toolset's
    roots) used to run jobs enqueued for the old one: a files_write queued for root A
    wrote into root B. Jobs enqueued before this daemon's first welcome are refused;
    later ones (validated against the new catalogue) run."""
    import attrs as _attrs

    submit, calls = counting()
    runner = make(nursery, submit, changed_tools=frozenset({"submit"}))
    old = _attrs.evolve(job(key="k-old"), waited_s=30.0)
    assert runner.admit(old).code == "catalogue_changed"  # not welcomed yet
    runner.serving_since = trio.current_time()
    await trio.sleep(10)
    assert runner.admit(_attrs.evolve(job(key="k-old2"), waited_s=11.0)).code == (
        "catalogue_changed"
    )  # enqueued before the welcome
    assert runner.admit(_attrs.evolve(job(key="k-unknown"), waited_s=None)).code == (
        "catalogue_changed"
    )  # cannot tell: refused
    assert runner.admit(_attrs.evolve(job(key="k-near"), waited_s=9.5)).code == (
        "catalogue_changed"
    )  # 0.5 s after the welcome: too close to tell
    fresh = _attrs.evolve(job(key="k-new"), waited_s=5.0)  # enqueued 5 s after it
    assert runner.admit(fresh) is None
    assert (await runner.execute(fresh)).ok and calls == ["f"]
    unchanged = make(nursery, submit)
    assert unchanged.admit(_attrs.evolve(job(key="k-x"), waited_s=30.0)) is None


async def test_a_redelivery_of_a_key_the_ledger_holds_is_answered_even_if_its_tool_changed(
    autojump_clock, nursery
):
    import attrs as _attrs

    submit, calls = counting()
    runner = make(nursery, submit)
    assert (await runner.execute(job(key="k1"))).ok
    runner.changed_tools = frozenset({"submit"})
    assert runner.admit(_attrs.evolve(job(key="k1"), waited_s=30.0)).ok and calls == ["f"]


async def test_a_delivery_with_no_time_left_is_answered_by_what_the_desktop_knows(
    autojump_clock, nursery
):
    """What the hub relies on when it asks about a cancelled job forwarded before (``ask``:
    sent with no time left): a key the ledger holds answers its record, a key whose run
    is in flight answers that run's outcome, and an unknown key is refused ``expired``
    without running (it never started here; the hub answers its caller ``cancelled``)."""
    submit, calls = counting(seconds=5)
    ledger = Ledger.memory()
    await ledger.begin("ran", "submit", args_digest({"form": "f"}), keep_until=2e9)
    await ledger.finish("ran", Outcome.success({"from": "ledger"}))
    runner = make(nursery, submit, ledger=ledger)
    await runner.load()
    recorded = job(key="ran", deadline_s=0)
    assert runner.admit(recorded) is None
    assert await runner.execute(recorded) == Outcome.success({"from": "ledger"})
    first = job(key="running")
    assert runner.admit(first) is None
    async with trio.open_nursery() as inner:
        inner.start_soon(runner.execute, first)
        await trio.testing.wait_all_tasks_blocked()
        late = job(key="running", deadline_s=0)
        assert runner.admit(late) is None  # joined: the run in flight answers
        assert await runner.execute(late) == Outcome.success({"submitted": "f", "n": 1})
    never = runner.admit(job(key="never", deadline_s=0))
    assert never is not None and never.code == "expired"
    assert calls == ["f"]
