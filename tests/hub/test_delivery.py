"""Serving one entry (``_delivery.EntryServer``) alone: no socket, no session, a fake
executor, the memory substrate, MockClock (autojump). Plus the job-state table."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobError, JobResult, LocalProtocolError, Timings
from deskbridge_hub._delivery import EntryServer
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._jobs import JobEnvelope
from deskbridge_hub._jobstate import (
    TERMINAL,
    TRANSITIONS,
    InvalidTransition,
    JobState,
    MalformedState,
    Stage,
    check_transition,
)
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._memory_finish import WrongType
from deskbridge_hub._substrate import result_key

EPOCH = 1_700_000_000.0
USER = "u1"


def wall() -> float:
    return EPOCH + trio.current_time()


class FakeExecutor:
    """Answers every job with ``answer(job)``; records what it was asked."""

    def __init__(self, answer=None, *, refuse: bool = False, hang: bool = False):
        self.jobs: list[Job] = []
        self.cancels: list[str] = []
        self._answer = answer or (lambda job: JobResult(job.id, True, job.args))
        self._refuse = refuse
        self._hang = hang

    async def execute(self, job: Job, epoch: int | None = None) -> JobResult:
        self.jobs.append(job)
        if self._refuse:
            raise LocalProtocolError("args", "too large")
        if self._hang:
            await trio.sleep_forever()
        await trio.sleep(1)
        return self._answer(job)

    async def cancel(self, job_id: str) -> None:
        self.cancels.append(job_id)


async def setup(**fields_override):
    substrate = MemorySubstrate(clock=wall)
    server = EntryServer(substrate, Timings(), USER, "session-1", wall, tools=frozenset({"echo"}))
    envelope = JobEnvelope("job-1", "echo", {"x": 1}, "key-1", wall() + 60, wall())
    fields = {**envelope.to_fields(), **fields_override}
    # as Bridge.dispatch does: the job id is claimed (stage queued) before the XADD
    await substrate.claim_job(USER, "job-1", JobState(Stage.QUEUED, USER, at=wall()), ttl_s=300)
    await substrate.enqueue(USER, fields, maxlen=100)
    (entry,) = await substrate.read_new(USER, "hub-1", count=10, block_ms=1)
    return substrate, server, entry


async def answer(substrate, job_id="job-1"):
    payload = await substrate.wait_result(USER, job_id, timeout_s=0.001)
    return None if payload is None else json.loads(payload)


async def test_a_job_is_forwarded_once_published_then_acked(autojump_clock):
    substrate, server, entry = await setup()
    executor = FakeExecutor()
    await server.serve(entry, executor)
    assert [j.idempotency_key for j in executor.jobs] == ["key-1"]
    assert (await answer(substrate)) == {"status": "completed", "result": {"x": 1}}
    assert substrate.pending_count(USER) == 0
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.FINISHED


async def test_each_delivery_gets_a_fresh_id(autojump_clock):
    substrate, server, entry = await setup()
    executor = FakeExecutor()
    await server.serve(entry, executor)
    await server.serve(entry, executor)
    assert len({j.id for j in executor.jobs}) == 2


async def test_a_failed_tool_is_answered_failed_with_its_code(autojump_clock):
    substrate, server, entry = await setup()
    executor = FakeExecutor(lambda job: JobResult(job.id, False, error=JobError("boom", "no")))
    await server.serve(entry, executor)
    assert (await answer(substrate))["error"] == {"code": "boom", "message": "no"}


async def test_past_its_deadline_is_expired_and_never_forwarded(autojump_clock):
    substrate, server, entry = await setup(deadline=repr(wall() - 1))
    executor = FakeExecutor()
    await server.serve(entry, executor)
    assert executor.jobs == []
    assert (await answer(substrate))["status"] == "expired"
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.EXPIRED
    assert substrate.pending_count(USER) == 0


async def test_cancel_flag_refuses_the_job_before_it_starts(autojump_clock):
    substrate, server, entry = await setup()
    await substrate.request_cancel(USER, "job-1", ttl_s=60)
    executor = FakeExecutor()
    await server.serve(entry, executor)
    assert executor.jobs == []
    body = await answer(substrate)
    assert body["status"] == "cancelled" and body["detail"] == {"stage": "queued"}
    assert substrate.pending_count(USER) == 0


async def _cancelled_redelivery(
    before: Stage = Stage.DELIVERED, *, daemon: str | None = "d1", first: str | None = "d1"
):
    """job-1 went to desktop ``first`` (None: a desktop not recorded), its state then
    ``before``, its socket or pod gone; a cancel came before its redelivery, which is read
    now by a session of desktop ``daemon``. Returns the substrate, that session's server,
    the entry and the first delivery's ``Marked``."""
    substrate, _, _ = await setup()
    server = EntryServer(
        substrate, Timings(), USER, "session-2", wall, daemon_id=daemon, tools=frozenset({"echo"})
    )
    state = JobState(Stage.DELIVERED, USER, at=wall(), session_id="session-0", daemon_id=first)
    old = await substrate.mark_delivered(USER, "job-1", state, ttl_s=300, deadline=wall() + 60)
    was = JobState(before, USER, at=wall(), daemon_id=first)
    await substrate.set_job_state(USER, "job-1", was, ttl_s=300)
    await substrate.request_cancel(USER, "job-1", ttl_s=60)
    (entry,) = await substrate.read_pending(USER, "hub-1", count=10)
    return substrate, server, entry, old


async def _late_answer_is_refused(substrate, old) -> None:
    """The old delivery's late answer is refused (one answer)."""
    late = await substrate.finish(
        USER, "job-1", '{"status":"completed","result":1}', JobState(Stage.FINISHED, USER),
        ttl_s=300, epoch=old.epoch,
    )  # fmt: skip
    assert late.verdict == "stale"


def _refused_as_late(job: Job) -> JobResult:
    """The desktop's answer to a job it never started, with no time left."""
    return JobResult(job.id, False, error=JobError("expired", "deadline passed; not started"))


FORWARDED_BEFORE = [Stage.DELIVERED, Stage.INTERRUPTED, Stage.AWAITING_APPROVAL]


@pytest.mark.parametrize(
    ("answer_of", "status", "message"),
    [
        (lambda job: JobResult(job.id, False, error=JobError("cancelled", "by the hub")),
         "cancelled", "by the hub"),
        (lambda job: JobResult(job.id, True, {"done": 1}), "completed", None),
        (lambda job: JobResult(job.id, False, error=JobError("expired", "not started")),
         "cancelled", "cancelled before it started"),
        (lambda job: JobResult(job.id, False, error=JobError("in_doubt", "crashed")),
         "in_doubt", "crashed"),
    ],
)  # fmt: skip
async def test_a_cancelled_redelivery_to_the_same_desktop_gets_its_answer(
    autojump_clock, answer_of, status, message
):
    """Found by fault injection (tests/chaos/test_cancel_across_takeover.py): the job's
    pod died, the cancel came, then the same desktop took the job over: it was answered
    ``in_doubt`` unasked and the desktop got no cancel (its tool ran to its end). Now it
    goes to that desktop with no time left (its ledger joins or answers, never starts it
    afresh) and the cancel right behind it; the desktop's answer is the caller's, and its
    "expired" (never started there) is ``cancelled``."""
    substrate, server, entry, old = await _cancelled_redelivery()
    executor = FakeExecutor(answer_of)
    await server.serve(entry, executor)
    (job,) = executor.jobs
    assert job.timeout_s == 0.0 and job.deadline <= wall()  # never started afresh
    assert executor.cancels == ["job-1"]
    body = await answer(substrate)
    assert body["status"] == status, body
    assert message is None or body["error"]["message"] == message, body
    assert substrate.pending_count(USER) == 0
    await _late_answer_is_refused(substrate, old)  # still refused


@pytest.mark.parametrize("before", FORWARDED_BEFORE)
async def test_a_cancelled_redelivery_asks_the_desktops_ledger(autojump_clock, before):
    """Issue 16, cancel2 round: the job may have run, and only the desktop's ledger
    knows. Whatever stage the first delivery left, it is forwarded with no time left (it
    never starts now) with its cancel behind it: a desktop that ran it answers from its
    record, and that is the caller's answer (was: ``in_doubt`` from the hub, without
    asking). The old delivery's late answer is refused (one answer)."""
    substrate, server, entry, old = await _cancelled_redelivery(before)
    executor = FakeExecutor(lambda job: JobResult(job.id, True, {"ran": True}))
    await server.serve(entry, executor)
    assert [job.timeout_s for job in executor.jobs] == [0.0]
    assert executor.cancels == ["job-1"]
    assert await answer(substrate) == {"status": "completed", "result": {"ran": True}}
    assert substrate.pending_count(USER) == 0
    await _late_answer_is_refused(substrate, old)


@pytest.mark.parametrize("before", FORWARDED_BEFORE)
async def test_a_cancelled_redelivery_the_desktop_never_started_is_cancelled(
    autojump_clock, before
):
    """The same desktop refuses it as late: its ledger has no start, so it never ran
    there, the only desktop it went to: ``cancelled`` is true."""
    substrate, server, entry, _ = await _cancelled_redelivery(before)
    await server.serve(entry, FakeExecutor(_refused_as_late))
    body = await answer(substrate)
    assert body["status"] == "cancelled", body
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.CANCELLED


@pytest.mark.parametrize("before", FORWARDED_BEFORE)
@pytest.mark.parametrize(("first", "daemon"), [("d1", "d2"), ("d1", None), (None, "d1")])
async def test_a_cancelled_redelivery_to_another_desktop_is_in_doubt_unasked(
    autojump_clock, before, first, daemon
):
    """Issue 16: the job went to a desktop whose socket (or pod) then went away, and a
    cancel came before its redelivery to another desktop, or one not known (either side).
    The first may have run it and this one cannot tell: the caller is told ``in_doubt``,
    never "cancelled before it started"; it is not forwarded again (no cancel sent), and
    the old delivery's late answer is refused (one answer)."""
    substrate, server, entry, old = await _cancelled_redelivery(
        before, daemon=daemon, first=first
    )
    executor = FakeExecutor(_refused_as_late)
    await server.serve(entry, executor)
    assert executor.jobs == [] and executor.cancels == []
    body = await answer(substrate)
    assert body["status"] == "in_doubt", body
    assert body["detail"] == {"stage": "interrupted", "reason": "cancelled after it was delivered"}
    assert substrate.pending_count(USER) == 0
    await _late_answer_is_refused(substrate, old)
    assert await answer(substrate) is None


async def test_malformed_entry_is_failed_and_acked(autojump_clock):
    substrate, server, entry = await setup(args="[1]")
    executor = FakeExecutor()
    await server.serve(entry, executor)
    assert executor.jobs == []
    assert (await answer(substrate))["error"]["code"] == "malformed"
    assert substrate.pending_count(USER) == 0


async def test_a_job_no_sidecar_could_accept_is_failed_bad_job(autojump_clock):
    substrate, server, entry = await setup()
    await server.serve(entry, FakeExecutor(refuse=True))
    assert (await answer(substrate))["error"]["code"] == "bad_job"
    assert substrate.pending_count(USER) == 0


async def test_executor_gone_records_interrupted_and_leaves_the_entry_pending(autojump_clock):
    substrate, server, entry = await setup()
    with trio.move_on_after(5):
        await server.serve(entry, FakeExecutor(hang=True))
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.INTERRUPTED
    assert substrate.pending_count(USER) == 1
    assert await answer(substrate) is None


async def test_a_socket_that_just_went_away_tells_the_caller_nothing(autojump_clock):
    """An executor that cannot say why it ended (no ``ended_reason``: the socket went
    away, not a hub decision) leaves the caller waiting for the redelivery: no answer in
    its mailbox, none stored, the stage ``interrupted``, the entry pending."""
    substrate, server, entry = await setup(reply_to="box-1")
    with trio.move_on_after(5):
        await server.serve(entry, FakeExecutor(hang=True))
    assert await substrate.read_notifications("box-1", count=10, block_ms=1) == []
    assert await answer(substrate) is None
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.INTERRUPTED
    assert substrate.pending_count(USER) == 1


async def test_an_entry_whose_body_is_gone_is_answered_lost_once(autojump_clock):
    substrate, server, entry = await setup()
    await server.answer_lost(entry.entry_id, "job-1")
    await server.answer_lost(entry.entry_id, "job-1")  # a second sweep: nothing more
    assert (await answer(substrate))["status"] == "lost"
    assert await answer(substrate) is None
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.LOST


async def test_cancel_control_entry_reaches_the_executor_and_is_acked(autojump_clock):
    substrate, server, entry = await setup(control="cancel")
    executor = FakeExecutor()
    await server.serve(entry, executor)
    assert executor.cancels == ["job-1"] and executor.jobs == []
    assert substrate.pending_count(USER) == 0


async def test_a_publish_during_an_outage_is_retried_before_the_ack(autojump_clock):
    substrate, server, entry = await setup()

    class Flaky(FakeExecutor):
        async def execute(self, job, epoch=None):
            result = await super().execute(job)
            substrate.set_unavailable(True)
            return result

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, entry, Flaky())
        await trio.sleep(10)
        assert substrate.pending_count(USER) == 1  # not acked while unpublished
        substrate.set_unavailable(False)
    assert (await answer(substrate))["status"] == "completed"
    assert substrate.pending_count(USER) == 0


# -- the job-state table ---------------------------------------------------------------


def test_every_stage_has_a_row_and_terminal_stages_are_final():
    assert set(TRANSITIONS) == set(Stage)
    for stage in TERMINAL:
        assert TRANSITIONS[stage] == frozenset()
        assert stage.terminal


@pytest.mark.parametrize("old", list(Stage))
@pytest.mark.parametrize("new", list(Stage))
def test_transition_table_is_the_only_rule(old, new):
    if new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(old, new)


def test_interrupted_job_can_be_delivered_again_but_a_finished_one_cannot():
    state = JobState(Stage.QUEUED, USER, at=1.0)
    state = state.advance(Stage.DELIVERED, session_id="s1").advance(Stage.INTERRUPTED)
    state = state.advance(Stage.DELIVERED).advance(Stage.FINISHED)
    with pytest.raises(InvalidTransition):
        state.advance(Stage.DELIVERED)


def test_state_round_trips_and_bad_text_is_refused():
    state = JobState(Stage.DELIVERED, USER, at=2.5, session_id="s1")
    assert JobState.decode(state.encode()) == state
    assert json.loads(JobState(Stage.QUEUED, USER).encode()) == {
        "stage": "queued",
        "user_id": USER,
    }
    for bad in ["", "[]", '{"stage": "nope", "user_id": "u"}', '{"stage": "queued"}']:
        with pytest.raises(MalformedState):
            JobState.decode(bad)


class Watched:
    """The memory substrate seen through a proxy that can refuse the finishing step and
    records the order of finishing steps and separate XACKs."""

    def __init__(self, inner: MemorySubstrate, *, refuse_publishes: int = 0):
        self._inner = inner
        self._refuse = refuse_publishes
        self.order: list[str] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def finish(self, user_id, job_id, payload, state, **options):
        # whatever happens to this write, the entry must still be pending now
        assert self._inner.pending_count(USER) == 1, "XACK came before the result write"
        if self._refuse:
            self._refuse -= 1
            self.order.append("refused")
            raise SubstrateUnavailable("result writes refused (test)")
        finished = await self._inner.finish(user_id, job_id, payload, state, **options)
        # the one step both publishes and acknowledges
        assert payload is not None and await self._inner.get_result(USER, job_id) == payload
        self.order.append("publish")
        if self._inner.pending_count(USER) == 0:
            self.order.append("ack")
        return finished

    async def ack(self, user_id, entry_id):
        self.order.append("separate ack")
        return await self._inner.ack(user_id, entry_id)


async def test_invariant_3_xack_only_after_the_result_is_durable(autojump_clock):
    """Invariant 3: an entry is acknowledged only once its result is durable.

    Only the finishing step fails (an XACK alone would succeed), so an XACK moved before
    it is caught: the entry would leave the pending entries list while its caller has
    no answer, and a crash then would lose the job for good. (Inside the step, the
    order is pinned by ``test_invariant_3_a_result_write_that_fails_leaves_the_entry_pending``
    and the substrate contract's ``invariant_3_finish_stops_at_a_failed_result_write``.)
    """
    substrate, server, entry = await setup()
    watched = Watched(substrate, refuse_publishes=3)
    server = attrs.evolve(server, substrate=watched)
    with trio.fail_after(120):
        await server.serve(entry, FakeExecutor())
    assert watched.order == ["refused", "refused", "refused", "publish", "ack"]
    assert (await answer(substrate))["status"] == "completed"
    assert substrate.pending_count(USER) == 0


async def test_invariant_3_a_result_write_that_fails_leaves_the_entry_pending(autojump_clock):
    """Invariant 3 inside the one step: the result list holds a value of another type
    (Redis: WRONGTYPE), so the step stops at the result write. Nothing after it may
    have happened: the entry is still pending (redelivered later), its state is still
    ``delivered``, the caller's mailbox got nothing."""
    substrate, server, entry = await setup(reply_to="box-1")
    substrate.spoil_key(result_key(USER, "job-1"))
    with trio.fail_after(120), pytest.raises(WrongType):
        await server.serve(entry, FakeExecutor())
    assert substrate.pending_count(USER) == 1
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.DELIVERED
    assert await substrate.read_notifications("box-1", count=10, block_ms=1) == []


@pytest.mark.parametrize("kind", ["failed", "expired", "lost", "malformed"])
async def test_invariant_3_holds_for_every_answer_the_hub_publishes(autojump_clock, kind):
    """The tool's failure and the hub's own answers (expired, lost, malformed) also
    publish before the XACK."""
    if kind == "expired":
        substrate, server, entry = await setup(deadline=repr(wall() - 1))
    elif kind == "malformed":
        substrate, server, entry = await setup(args="not json")
    else:
        substrate, server, entry = await setup()
    if kind == "lost":
        entry = type(entry)(entry.entry_id, None)  # body trimmed before anyone ran it
    watched = Watched(substrate, refuse_publishes=1)
    server = attrs.evolve(server, substrate=watched)
    executor = FakeExecutor(lambda job: JobResult(job.id, False, error=JobError("boom", "no")))
    with trio.fail_after(120):
        await server.serve(entry, executor)
    assert watched.order == ["refused", "publish", "ack"]
    status = {"malformed": "failed"}.get(kind, kind)
    assert (await answer(substrate))["status"] == status
    assert substrate.pending_count(USER) == 0


async def test_the_terminal_state_names_user_and_time_and_lives_as_long_as_the_result(
    autojump_clock,
):
    """After the answer, the job's state says ``finished`` for this user, stamped when it
    finished, and is kept exactly as long as the result (``result_ttl_s``): a late cancel
    is answered "finished" while the caller may still read the result, not forever."""
    substrate, server, entry = await setup()
    await server.serve(entry, FakeExecutor())  # the fake tool takes 1 s
    finished_at = wall()
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.user_id, state.at) == (Stage.FINISHED, USER, finished_at)
    await trio.sleep(Timings().result_ttl_s - 0.01)
    assert (await substrate.get_job_state(USER, "job-1")) is not None
    await trio.sleep(0.02)
    assert (await substrate.get_job_state(USER, "job-1")) is None


@pytest.mark.parametrize(
    ("kind", "tool", "outcome"),
    [
        ("completed", "echo", "completed"),
        ("malformed", "echo", "failed"),
        ("lost", "unknown", "lost"),
    ],
)
async def test_every_answer_is_counted_once_by_tool_and_outcome_and_logged_with_its_job(
    autojump_clock, caplog, kind, tool, outcome
):
    """The served-jobs counter and the one INFO line per job name the real tool, outcome
    and job id, also for entries whose body is malformed (tool from the raw fields) or gone
    (job id from the index)."""
    import logging

    from deskbridge_hub import _metrics

    substrate, server, entry = await setup(**({"args": "[1"} if kind == "malformed" else {}))
    if kind == "lost":
        entry = type(entry)(entry.entry_id, None)
    counter = _metrics.SERVED.labels(tool, outcome)
    before = counter._value.get()
    with caplog.at_level(logging.INFO, logger="deskbridge.hub.jobs"):
        await server.serve(entry, FakeExecutor())
    assert counter._value.get() == before + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.jobs"]
    assert lines == [f"job job-1 finished: {outcome} ({tool})"]


async def test_the_answer_notifies_the_callers_mailbox_and_lives_as_long_as_its_key(
    autojump_clock,
):
    """The publish step wakes the caller through its process's mailbox (``reply_to``)
    and keeps the result as long as the idempotency record that points at it, so a retry
    with the same key, up to the job's deadline + result TTL, still finds the answer."""
    from deskbridge_hub._substrate import idem_key

    substrate, server, entry = await setup(reply_to="box-1")
    record_until_s = Timings().result_ttl_s + 600  # e.g. a 600 s deadline, then the TTL
    substrate._set(idem_key(USER, "key-1"), "job-1 echo digest", wall(), record_until_s)
    await server.serve(entry, FakeExecutor())
    got = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert [job for job, _ in got] == ["job-1"]
    await trio.sleep(record_until_s - 2)  # past the result TTL, inside the record's life
    assert (await answer(substrate)) == {"status": "completed", "result": {"x": 1}}


# -- fenced deliveries (issue 12 item 3) -------------------------------------------------


class Reclaimed(FakeExecutor):
    """While the tool runs, another holder takes the entry over (a reclaim after this
    holder looked dead) and delivers it again: this executor becomes a zombie."""

    def __init__(self, substrate, **kwargs):
        super().__init__(**kwargs)
        self._substrate = substrate

    async def execute(self, job, epoch=None):
        newer = JobState(Stage.DELIVERED, USER, at=wall(), session_id="session-2")
        marked = await self._substrate.mark_delivered(
            USER, job.job_id, newer, ttl_s=300, deadline=wall() + 60
        )
        assert marked.verdict == "delivered"
        return await super().execute(job)


async def test_every_delivery_of_a_job_gets_a_larger_epoch(autojump_clock):
    substrate, server, entry = await setup()
    delivered = JobState(Stage.DELIVERED, USER, at=wall(), session_id="s")
    epochs = [
        (await substrate.mark_delivered(USER, "job-1", delivered, ttl_s=300)).epoch
        for _ in range(3)
    ]
    assert epochs == [1, 2, 3]


async def test_a_zombies_answer_is_refused_counted_and_logged_once(autojump_clock, caplog):
    """The entry was delivered again while this delivery ran: its answer is stale. Nothing
    is published (the caller waits for the newer delivery's), the state stays the newer
    delivery's, the entry stays pending for that delivery, the refusal is counted and
    logged once; no "finished" line or served count for it."""
    import logging

    from deskbridge_hub import _metrics

    substrate, server, entry = await setup(reply_to="box-1")
    stale = _metrics.STALE_RESULTS._value.get()
    served = _metrics.SERVED.labels("echo", "completed")._value.get()
    with caplog.at_level(logging.INFO):
        await server.serve(entry, Reclaimed(substrate))
    assert await answer(substrate) is None
    assert await substrate.read_notifications("box-1", count=10, block_ms=1) == []
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.session_id) == (Stage.DELIVERED, "session-2")
    assert substrate.pending_count(USER) == 1
    assert _metrics.STALE_RESULTS._value.get() == stale + 1
    assert _metrics.SERVED.labels("echo", "completed")._value.get() == served
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("deskbridge.hub")]
    assert lines == [
        "user u1: stale answer (completed) of job job-1 refused: delivery epoch 1, newest 2 "
        "(the entry was delivered again meanwhile; that delivery answers)"
    ]


async def test_the_newest_delivery_answers_after_a_zombie_was_refused(autojump_clock):
    substrate, server, entry = await setup()
    await server.serve(entry, Reclaimed(substrate, answer=lambda job: JobResult(job.id, True, 1)))
    newer = attrs.evolve(server, session_id="session-2")
    await newer.finish(
        entry.entry_id, "job-1", "completed", '{"status":"completed","result":2}', epoch=2
    )
    assert (await answer(substrate))["result"] == 2
    assert await answer(substrate) is None
    assert substrate.pending_count(USER) == 0


async def test_a_zombies_in_doubt_and_interrupted_marks_are_refused_too(autojump_clock):
    """A session that ends while a newer delivery of its job runs elsewhere neither
    answers ``in_doubt`` nor records ``interrupted`` over the newer delivery's state."""
    for reason in ("superseded", None):
        substrate, server, entry = await setup()

        class Ending(Reclaimed):
            def ended_reason(self, reason=reason):
                return reason

        with trio.move_on_after(5):
            await server.serve(entry, Ending(substrate, hang=True))
        assert await answer(substrate) is None
        state = await substrate.get_job_state(USER, "job-1")
        assert (state.stage, state.session_id) == (Stage.DELIVERED, "session-2")


async def test_an_in_doubt_answer_of_a_takeover_elsewhere_is_final_and_acked(autojump_clock):
    """4001 through another process (perhaps another desktop): the newest delivery's
    ``in_doubt`` is the job's result, and the entry is not delivered again."""
    substrate, server, entry = await setup(reply_to="box-1")

    class Ending(FakeExecutor):
        def ended_reason(self):
            return "superseded"

        def handed_over(self):
            return True

    with trio.move_on_after(5):
        await server.serve(entry, Ending(hang=True))
    body = await answer(substrate)
    assert (body["status"], body["detail"]) == (
        "in_doubt",
        {"stage": "interrupted", "reason": "superseded"},
    )
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.FINISHED
    assert substrate.pending_count(USER) == 0
    [(job, payload)] = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert json.loads(payload) == body


async def _ended_mid_job(**fields_override):  # type: ignore[no-untyped-def]
    """The job's session ends on purpose (a hub restart) while it runs: the substrate and
    the caller's one notification (job id, decoded body)."""
    substrate, server, entry = await setup(reply_to="box-1", **fields_override)

    class Ending(FakeExecutor):
        def ended_reason(self):
            return "hub restarting"

        def handed_over(self):
            return False

    with trio.move_on_after(5):
        await server.serve(entry, Ending(hang=True))
    [(job, payload)] = await substrate.read_notifications("box-1", count=10, block_ms=1)
    return substrate, job, json.loads(payload)


async def test_an_in_doubt_answer_at_a_restart_or_expiry_is_provisional(autojump_clock):
    """1012 / 4003: the same desktop comes back, so the caller is told ``in_doubt`` with
    ``detail.pending`` (its mailbox only) and the job's result stays to come: the entry
    stays pending for its redelivery, the stage says ``interrupted``."""
    substrate, job, body = await _ended_mid_job()
    assert (job, body["status"], body["detail"]) == (
        "job-1", "in_doubt", {"stage": "interrupted", "reason": "hub restarting", "pending": True}
    )  # fmt: skip
    assert await answer(substrate) is None  # not the job's result
    assert (await substrate.get_job_state(USER, "job-1")).stage is Stage.INTERRUPTED
    assert substrate.pending_count(USER) == 1


@pytest.mark.parametrize(("key", "advice"), [
    ("key-1", "a retry with the same idempotency key gets it"),
    ("job-1", "GET /v1/jobs/job-1 reports it (a new call would be a new job)"),
])  # fmt: skip
async def test_a_provisional_in_doubt_names_a_key_only_when_the_call_had_one(
    autojump_clock, key, advice
):
    """A call without a key (its entry's key is its job id) was told "a retry with the
    same idempotency key gets it": a retry without one is a new job."""
    _, _, body = await _ended_mid_job(idempotency_key=key)
    assert body["error"]["message"].endswith(advice)


async def test_an_answer_after_the_job_s_answer_changes_nothing_and_is_not_served(
    autojump_clock, caplog
):
    """Another writer answered first (a cancel, while the job was queued); the holder then
    reads the entry past its deadline: its ``expired`` is settled. The answer stays the
    cancel's, the entry is acked, the expired answer is neither counted nor notified,
    and the line says which job and which answer."""
    import logging

    from deskbridge_hub import _metrics

    substrate, server, entry = await setup(deadline=repr(wall() - 1))
    cancelled = '{"status":"cancelled"}'
    first = JobState(Stage.CANCELLED, USER, at=wall())
    await substrate.finish(USER, "job-1", cancelled, first, ttl_s=300, epoch=0)
    served = _metrics.SERVED.labels("echo", "expired")
    before = served._value.get()
    with caplog.at_level(logging.INFO, logger="deskbridge.hub.delivery"):
        await server.serve(entry, FakeExecutor())
    assert served._value.get() == before
    assert await substrate.get_result(USER, "job-1") == cancelled
    assert await substrate.get_job_state(USER, "job-1") == first
    assert substrate.pending_count(USER) == 0
    assert [r.getMessage() for r in caplog.records if "had its answer" in r.getMessage()] == [
        "user u1: job job-1 had its answer already (another writer was first, e.g. a "
        "cancel); this one (expired) dropped, its entry acked"
    ]
