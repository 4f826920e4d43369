"""Serving one entry, exactly (issue 15: survivors of ``_delivery``'s mutation run):
what the forwarded job carries, which answers are fenced and notify their caller, what a
lost or malformed entry is answered, and the states and counts each answer leaves.
Same kit as test_delivery.py: the memory substrate, a fake executor, MockClock."""

from __future__ import annotations

import json
import logging

import pytest
import trio
from deskbridge_common import JobError, JobResult, Timings
from deskbridge_hub import _metrics
from deskbridge_hub._delivery import EntryServer, outcome_of
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._jobs import JobEnvelope, result_payload
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._keys import state_key
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._substrate import idem_key

from .test_delivery import USER, FakeExecutor, Reclaimed, answer, setup, wall


def test_a_failure_without_an_error_is_answered_failed_failed():
    assert outcome_of(JobResult("d", False)) == (
        "failed",
        result_payload("failed", error={"code": "failed", "message": "failed"}),
    )


def test_an_outcome_error_code_is_its_own_status_and_any_other_code_is_failed():
    declined = JobResult("d", False, error=JobError("declined", "no"))
    assert outcome_of(declined)[0] == "declined"
    other = JobResult("d", False, error=JobError("boom", "no"))
    assert outcome_of(other) == (
        "failed",
        result_payload("failed", error={"code": "boom", "message": "no"}),
    )


class Recording(FakeExecutor):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epochs: list[int | None] = []

    async def execute(self, job, epoch=None):
        self.epochs.append(epoch)
        return await super().execute(job)


async def test_the_forwarded_job_carries_the_time_left_waited_trace_and_epoch(autojump_clock):
    now = wall()
    substrate, server, entry = await setup(
        deadline=repr(now + 0.5), enqueued_at=repr(now - 0.25), traceparent="00-ab-cd-01"
    )
    executor = Recording()
    await server.serve(entry, executor)
    (job,) = executor.jobs
    assert job.timeout_s == 0.5  # the substrate's clock: deadline - now, under one second
    assert job.deadline == now + 0.5  # that duration on this hub's clock
    assert job.waited_s == 0.25
    assert job.traceparent == "00-ab-cd-01"
    assert executor.epochs == [1]  # the delivery's claim epoch fences its stage writes


async def test_the_dispatch_histogram_counts_the_queued_time_by_tool(autojump_clock):
    now = wall()
    substrate, server, entry = await setup(enqueued_at=repr(now - 2.0))
    histogram = _metrics.DISPATCH_SECONDS.labels("echo")
    before = histogram._sum.get()
    await server.serve(entry, FakeExecutor())
    assert histogram._sum.get() - before == 2.0


async def test_a_cancel_entry_without_a_job_id_asks_to_cancel_the_empty_id(autojump_clock):
    substrate, server, entry = await setup(control="cancel")
    fields = {k: v for k, v in entry.fields.items() if k != "job_id"}
    executor = FakeExecutor()
    await server.serve(type(entry)(entry.entry_id, fields), executor)
    assert executor.cancels == [""] and substrate.pending_count(USER) == 0


async def test_a_malformed_entry_is_answered_with_why_it_does_not_decode(autojump_clock):
    substrate, server, entry = await setup(args="[1]")
    await server.serve(entry, FakeExecutor())
    error = (await answer(substrate))["error"]
    assert error["code"] == "malformed" and "args" in error["message"]


async def test_a_malformed_entry_without_a_job_id_is_counted_by_its_tool(autojump_clock, caplog):
    substrate, server, entry = await setup(args="[1]")
    fields = {k: v for k, v in entry.fields.items() if k != "job_id"}
    counter = _metrics.SERVED.labels("echo", "failed")
    before = counter._value.get()
    with caplog.at_level(logging.INFO, logger="deskbridge.hub.jobs"):
        await server.serve(type(entry)(entry.entry_id, fields), FakeExecutor())
    assert counter._value.get() == before + 1
    assert substrate.pending_count(USER) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.jobs"]
    assert lines == ["job None finished: failed (echo)"]


async def test_a_bad_job_answer_says_why_notifies_its_caller_and_is_fenced(autojump_clock):
    substrate, server, entry = await setup(reply_to="box-1")
    await server.serve(entry, FakeExecutor(refuse=True))
    error = (await answer(substrate))["error"]
    assert error == {"code": "bad_job", "message": "args: too large"}
    got = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert [job for job, _ in got] == ["job-1"]

    substrate, server, entry = await setup()
    await server.serve(entry, Reclaimed(substrate, refuse=True))  # a zombie's bad_job
    assert await answer(substrate) is None and substrate.pending_count(USER) == 1


class Ending(FakeExecutor):
    def ended_reason(self):
        return "superseded"


class EndingForGood(Ending):
    def handed_over(self):
        return True


async def test_an_in_doubt_answer_names_the_reason_notifies_and_is_counted(autojump_clock, caplog):
    substrate, server, entry = await setup(reply_to="box-1")
    counter = _metrics.SERVED.labels("echo", "in_doubt")
    before = counter._value.get()
    with caplog.at_level(logging.INFO, logger="deskbridge.hub"):
        with trio.move_on_after(5):
            await server.serve(entry, Ending(hang=True))
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.user_id, state.at) == (Stage.INTERRUPTED, USER, wall())
    assert await answer(substrate) is None  # provisional (no ``handed_over``): not stored
    got = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert [job for job, _ in got] == ["job-1"]
    body = json.loads(got[0][1])
    assert body["status"] == "in_doubt" and "superseded" in json_text(body)
    assert body["detail"]["pending"] is True
    assert counter._value.get() == before + 1
    # provisional: what the caller was told, not the job's outcome (the redelivery's
    # real outcome is its one "finished" line; two would tell two final outcomes)
    jobs = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.jobs"]
    assert jobs == []
    calls = [(r.getMessage(), r.answer) for r in caplog.records if r.name == "deskbridge.hub.calls"]
    assert calls == [
        ("call for job job-1 answered: in_doubt (provisional; echo for u1)", "in_doubt")
    ]


async def test_an_in_doubt_answer_after_the_job_s_answer_is_settled_not_counted(
    autojump_clock, caplog
):
    """The session ends on purpose while the job is on the desktop, but the job has its
    answer already (another writer was first): the ``in_doubt`` changes nothing, reaches
    no caller, is not counted, and its line says so."""
    substrate, server, entry = await setup(reply_to="box-1")
    done = JobState(Stage.FINISHED, USER, at=wall())

    class AnsweredThenEnding(EndingForGood):
        async def execute(self, job, epoch=None):
            await substrate.finish(USER, "job-1", '"first"', done, ttl_s=300, epoch=epoch)
            await trio.sleep_forever()

    counter = _metrics.SERVED.labels("echo", "in_doubt")
    before = counter._value.get()
    with caplog.at_level(logging.INFO, logger="deskbridge.hub.delivery"):
        with trio.move_on_after(5):
            await server.serve(entry, AnsweredThenEnding())
    assert counter._value.get() == before
    assert await substrate.get_result(USER, "job-1") == '"first"'
    assert await substrate.get_job_state(USER, "job-1") == done
    assert await substrate.read_notifications("box-1", count=10, block_ms=1) == []
    assert substrate.pending_count(USER) == 0
    lines = [r.getMessage() for r in caplog.records if "had its answer" in r.getMessage()]
    assert lines == [
        "user u1: job job-1 had its answer already (another writer was first, e.g. a "
        "cancel); this one (in_doubt) dropped, its entry acked"
    ]


def json_text(body) -> str:
    return json.dumps(body)


async def test_a_zombies_refused_in_doubt_is_logged_with_its_job_and_epoch(autojump_clock, caplog):
    substrate, server, entry = await setup()

    class EndingZombie(Reclaimed):
        def ended_reason(self):
            return "superseded"

    with caplog.at_level(logging.WARNING, logger="deskbridge.hub.delivery"):
        with trio.move_on_after(5):
            await server.serve(entry, EndingZombie(substrate, hang=True))
    lines = [r.getMessage() for r in caplog.records if "stale answer" in r.getMessage()]
    assert lines == [
        "user u1: stale answer (in_doubt) of job job-1 refused: delivery epoch 1, newest 2 "
        "(the entry was delivered again meanwhile; that delivery answers)"
    ]


class FinishFailsOnce:
    """The memory substrate, whose first ``finish`` is unavailable."""

    def __init__(self, inner):
        self._inner = inner
        self.failed = False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def finish(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            raise SubstrateUnavailable("finish refused (test)")
        return await self._inner.finish(*args, **kwargs)


async def test_an_in_doubt_answer_that_cannot_be_written_still_records_interrupted(
    autojump_clock,
):
    substrate, server, entry = await setup()
    server.substrate = FinishFailsOnce(substrate)
    with trio.move_on_after(5):
        await server.serve(entry, Ending(hang=True))
    assert await answer(substrate) is None
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.user_id) == (Stage.INTERRUPTED, USER)
    assert wall() - 0.1 < state.at <= wall()
    assert substrate.pending_count(USER) == 1


async def test_an_interrupted_mark_names_the_user_and_the_time(autojump_clock):
    substrate, server, entry = await setup()
    with trio.move_on_after(5):
        await server.serve(entry, FakeExecutor(hang=True))
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.user_id, state.at) == (Stage.INTERRUPTED, USER, wall())


async def test_the_delivered_state_names_user_time_and_session(autojump_clock):
    substrate, server, entry = await setup()
    await trio.sleep(3)
    state = server.delivered_state()
    assert (state.stage, state.user_id, state.at, state.session_id) == (
        Stage.DELIVERED,
        USER,
        wall(),
        "session-1",
    )


# -- lost entries -------------------------------------------------------------------------


async def test_an_owned_entry_whose_job_state_is_gone_is_forgotten_and_acked(autojump_clock):
    substrate, server, entry = await setup()
    del substrate._kv[state_key(USER, "job-1")]  # its state expired long ago
    await server.answer_lost(entry.entry_id, "job-1")
    assert await answer(substrate) is None
    assert substrate.pending_count(USER) == 0
    assert await substrate.job_ids(USER, [entry.entry_id]) == {}


async def test_a_delivered_job_s_entry_held_elsewhere_is_left_to_its_holder(autojump_clock):
    """Not owned, delivered (running elsewhere): neither answered lost nor forgotten,
    nor acked; the holder answers."""
    substrate, server, entry = await setup()
    await substrate.mark_delivered(USER, "job-1", server.delivered_state(), ttl_s=300)
    await server.answer_lost(entry.entry_id, "job-1", owned=False)
    assert await answer(substrate) is None
    assert substrate.pending_count(USER) == 1
    assert await substrate.job_ids(USER, [entry.entry_id]) == {entry.entry_id: "job-1"}


async def test_an_owned_delivered_entry_is_dropped_unanswered(autojump_clock, caplog):
    substrate, server, entry = await setup()
    await substrate.mark_delivered(USER, "job-1", server.delivered_state(), ttl_s=300)
    with caplog.at_level(logging.WARNING, logger="deskbridge.hub.delivery"):
        await server.answer_lost(entry.entry_id, "job-1")
    assert await answer(substrate) is None
    assert substrate.pending_count(USER) == 0
    assert await substrate.job_ids(USER, [entry.entry_id]) == {}
    assert [r.getMessage() for r in caplog.records] == [
        f"user u1: entry {entry.entry_id} (job job-1) was trimmed after it was delivered; its "
        "outcome is unknown (the caller's wait ends with stage delivered)"
    ]


async def test_an_owned_finished_entry_is_forgotten_without_a_warning(autojump_clock, caplog):
    substrate, server, entry = await setup()
    await server.serve(entry, FakeExecutor())
    with caplog.at_level(logging.WARNING, logger="deskbridge.hub.delivery"):
        await server.answer_lost(entry.entry_id, "job-1")
    assert caplog.records == []
    assert await substrate.job_ids(USER, [entry.entry_id]) == {}


async def test_an_unknown_entry_is_only_acked(autojump_clock):
    substrate, server, entry = await setup()
    await substrate.forget(USER, entry.entry_id)
    await server.answer_lost(entry.entry_id, None)
    assert await answer(substrate) is None
    assert substrate.pending_count(USER) == 0
    state = await substrate.get_job_state(USER, "job-1")
    assert state.stage is Stage.QUEUED


async def test_deleted_ids_of_a_reclaim_are_settled_but_never_acked(autojump_clock):
    """XAUTOCLAIM's deleted IDs: a queued job's is answered lost; a delivered job's is
    left to its holder, neither forgotten nor acked here (it is not this consumer's)."""
    substrate, server, entry = await setup()
    await server.answer_deleted([entry.entry_id])
    assert (await answer(substrate))["status"] == "lost"  # its finishing step XACKs it

    substrate, server, entry = await setup()
    await substrate.mark_delivered(USER, "job-1", server.delivered_state(), ttl_s=300)
    await server.answer_deleted([entry.entry_id])
    assert await answer(substrate) is None
    assert await substrate.job_ids(USER, [entry.entry_id]) == {entry.entry_id: "job-1"}
    assert substrate.pending_count(USER) == 1


async def test_no_deleted_ids_still_sweeps_the_trimmed_index(autojump_clock):
    substrate, server, entry = await setup()
    calls = []
    real = substrate.job_ids

    async def job_ids(user_id, entry_ids):
        calls.append(list(entry_ids))
        return await real(user_id, entry_ids)

    substrate.job_ids = job_ids
    await server.answer_deleted([])
    assert calls == []  # nothing to look up
    assert substrate.pending_count(USER) == 1


async def test_an_entry_the_reader_marked_is_not_marked_again(autojump_clock):
    """The process reader's read + mark step (``read_new_delivered``) already raised the
    claim epoch: serving that entry forwards it under that epoch, with no second mark."""
    substrate = MemorySubstrate(clock=wall)
    server = EntryServer(substrate, Timings(), USER, "session-1", wall)
    queued = JobState(Stage.QUEUED, USER, at=wall())
    await substrate.claim_job(USER, "job-1", queued, ttl_s=300)
    envelope = JobEnvelope("job-1", "echo", {"x": 1}, "key-1", wall() + 60, wall())
    await substrate.enqueue(USER, envelope.to_fields(), maxlen=100)
    (entry,) = await substrate.read_new_delivered(
        USER, "hub-1", count=10, state=server.delivered_state(), ttl_s=300
    )
    assert entry.marked is not None and entry.marked.epoch == 1
    executor = Recording()
    await server.serve(entry, executor)
    assert executor.epochs == [1]


@pytest.mark.parametrize("verdict", ["expired", "cancelled"])
async def test_an_answer_given_before_forwarding_notifies_and_is_counted_by_tool(
    autojump_clock, verdict
):
    overrides = {"deadline": repr(wall() - 1)} if verdict == "expired" else {}
    substrate, server, entry = await setup(reply_to="box-1", **overrides)
    if verdict == "cancelled":
        await substrate.request_cancel(USER, "job-1", ttl_s=60)
    counter = _metrics.SERVED.labels("echo", verdict)
    before = counter._value.get()
    await server.serve(entry, FakeExecutor())
    assert (await answer(substrate))["status"] == verdict
    got = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert [job for job, _ in got] == ["job-1"]
    assert counter._value.get() == before + 1


async def test_an_in_doubt_answer_lives_as_long_as_the_callers_idempotency_record(
    autojump_clock,
):
    substrate, server, entry = await setup()
    record_until_s = Timings().result_ttl_s + 600
    substrate._set(idem_key(USER, "key-1"), "job-1 echo digest", wall(), record_until_s)
    with trio.move_on_after(5):
        await server.serve(entry, EndingForGood(hang=True))
    await trio.sleep(record_until_s - 10)  # past the result TTL, inside the record's life
    assert (await answer(substrate))["status"] == "in_doubt"


async def test_a_zombies_interrupted_mark_is_fenced_when_its_in_doubt_answer_failed(
    autojump_clock,
):
    substrate, server, entry = await setup()

    class EndingZombie(Reclaimed):
        def ended_reason(self):
            return "superseded"

    server.substrate = FinishFailsOnce(substrate)
    with trio.move_on_after(5):
        await server.serve(entry, EndingZombie(substrate, hang=True))
    state = await substrate.get_job_state(USER, "job-1")
    assert (state.stage, state.session_id) == (Stage.DELIVERED, "session-2")


async def test_an_entry_held_elsewhere_whose_job_is_over_or_gone_is_forgotten(autojump_clock):
    """Not owned: a finished job's index record is dropped, and so is one whose state
    is gone; neither is acked here."""
    for gone in (False, True):
        substrate, server, entry = await setup()
        await server.finish("0-0", "job-1", "completed", result_payload("completed", result=1))
        if gone:
            del substrate._kv[state_key(USER, "job-1")]
        await server.answer_lost(entry.entry_id, "job-1", owned=False)
        assert await substrate.job_ids(USER, [entry.entry_id]) == {}
        assert substrate.pending_count(USER) == 1


async def test_a_trimmed_unread_entry_of_a_delivered_job_is_left_to_its_holder(autojump_clock):
    """The sweep's trimmed entries are not this consumer's: a delivered job's record stays
    (its holder answers), no warning, nothing answered."""
    substrate = MemorySubstrate(clock=wall)
    server = EntryServer(substrate, Timings(), USER, "session-1", wall)
    for job_id in ("job-1", "job-2"):
        await substrate.claim_job(USER, job_id, JobState(Stage.QUEUED, USER, at=wall()), ttl_s=300)
        envelope = JobEnvelope(job_id, "echo", {}, f"key-{job_id}", wall() + 60, wall())
        entry_id = await substrate.enqueue(USER, envelope.to_fields(), maxlen=1)
        if job_id == "job-1":
            first = entry_id
            await substrate.mark_delivered(USER, job_id, server.delivered_state(), ttl_s=300)
    assert await substrate.trimmed(USER) == [(first, "job-1")]
    await server.answer_deleted([])
    assert await substrate.trimmed(USER) == [(first, "job-1")]
    assert await answer(substrate) is None


class NewerDeliveryFirst:
    """The memory substrate; just before the first ``finish``, the job is delivered again
    elsewhere (a newer epoch)."""

    def __init__(self, inner):
        self._inner = inner
        self.done = False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def finish(self, *args, **kwargs):
        if not self.done:
            self.done = True
            newer = JobState(Stage.DELIVERED, USER, at=wall(), session_id="session-2")
            await self._inner.set_job_state(USER, "job-1", newer, ttl_s=300)
            await self._inner.mark_delivered(USER, "job-1", newer, ttl_s=300)
        return await self._inner.finish(*args, **kwargs)


async def _cancelled_redelivery(reply_to=None):
    substrate, server, _ = await setup(**({"reply_to": reply_to} if reply_to else {}))
    first = JobState(Stage.DELIVERED, USER, at=wall(), session_id="session-0")
    await substrate.mark_delivered(USER, "job-1", first, ttl_s=300, deadline=wall() + 60)
    await substrate.request_cancel(USER, "job-1", ttl_s=60)
    (entry,) = await substrate.read_pending(USER, "hub-1", count=10)
    return substrate, server, entry


async def test_a_cancelled_redelivery_s_in_doubt_answer_notifies_its_caller(autojump_clock):
    substrate, server, entry = await _cancelled_redelivery(reply_to="box-1")
    await server.serve(entry, FakeExecutor())
    assert (await answer(substrate))["status"] == "in_doubt"
    got = await substrate.read_notifications("box-1", count=10, block_ms=1)
    assert [job for job, _ in got] == ["job-1"]


async def test_a_cancelled_redelivery_s_in_doubt_answer_is_fenced(autojump_clock):
    substrate, server, entry = await _cancelled_redelivery()
    server.substrate = NewerDeliveryFirst(substrate)
    await server.serve(entry, FakeExecutor())
    assert await answer(substrate) is None  # the newer delivery answers


def test_a_result_with_a_lone_surrogate_is_answered_failed_bad_result():
    # an older (or hostile) sidecar's text that is not valid Unicode: the HTTP answer
    # carried "\udce9" as is, the MCP endpoint could not serialise it (no answer at all)
    status, payload = outcome_of(JobResult("d", True, result={"name": "caf\udce9.txt"}))
    assert status == "failed", payload
    body = json.loads(payload)
    assert body["error"]["code"] == "bad_result", body
    json.dumps(body, ensure_ascii=False).encode("utf-8")  # the answer is valid text


def test_a_result_outside_the_basic_plane_is_answered_as_it_came():
    status, payload = outcome_of(JobResult("d", True, result={"s": "\U0001f600 \\ud800"}))
    assert status == "completed" and json.loads(payload)["result"] == {"s": "\U0001f600 \\ud800"}


def test_an_error_message_with_a_lone_surrogate_is_answered_with_a_replacement_character():
    status, payload = outcome_of(JobResult("d", False, error=JobError("boom", "caf\udce9")))
    assert status == "failed"
    assert json.loads(payload)["error"] == {"code": "boom", "message": "caf\ufffd"}
