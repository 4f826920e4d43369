"""The hub never tells a caller or a reader something untrue about a job (its stage, a
cancel's answer, its outcome) when the desktop vanished, the store was rewound or the
job finished meanwhile (docs/outcomes.md). MemorySubstrate, memory sockets, MockClock."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobError, JobResult
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._reader import ProcessReader

from tests.hub import test_outcomes
from tests.hub.test_session import wall

state = test_outcomes.state  # the fixtures: one hub process, a Bridge on its substrate
bridge = test_outcomes.bridge


@pytest.mark.parametrize("read", ["delivered", "queued"])
async def test_a_cancel_of_a_job_answered_after_its_state_was_read_says_finished(
    autojump_clock, state, bridge, read
):
    """The cancel read ``delivered`` (or ``queued``); the job's answer was written
    before the cancel flag (the holder delivered and finished it in between). Before:
    202 ``delivered`` (its own unfenced answer refused, for ``queued``): the cancel was
    "requested" for a job that had its answer. Now ``finished`` (409)."""
    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: bridge.dispatch("u1", "click", {}, job_id="job-f", timeout_s=60))
        await trio.sleep(1)
        delivered = JobState(Stage.DELIVERED, "u1", at=wall(), session_id="ghost")
        marked = []
        if read == "delivered":  # else the cancel's read finds it queued
            marked.append(await s.mark_delivered("u1", "job-f", delivered, ttl_s=300))
        real_send_cancel = s.send_cancel

        async def answered_first(user_id: str, job_id: str, **kwargs: float) -> str | None:
            if not marked:
                marked.append(await s.mark_delivered("u1", "job-f", delivered, ttl_s=300))
            done = JobState(Stage.FINISHED, "u1", at=wall())
            payload = json.dumps({"status": "completed", "result": 1})
            await s.finish("u1", "job-f", payload, done, ttl_s=300, epoch=marked[0].epoch)
            return await real_send_cancel(user_id, job_id, **kwargs)

        s.send_cancel = answered_first  # type: ignore[method-assign]
        assert await bridge.cancel("job-f") == "finished"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("same_daemon", [False, True])
async def test_a_job_refused_as_late_after_it_went_to_a_vanished_desktop_is_in_doubt(
    autojump_clock, state, bridge, same_daemon
):
    """A 30 s job reaches desktop d1, which vanishes mid-job (its socket closed: kill -9,
    the lid). Past the job's deadline another desktop of the user (d2) gets the entry
    (the reclaim idle) and refuses it as late: it never started it. Before, the job read
    ``expired`` ("did not run") though d1 had started it. Now ``in_doubt``. The same
    desktop back after the deadline says ``expired``, which is then true: its ledger
    would have answered a job it had started."""
    async with trio.open_nursery() as nursery:
        old = await test_outcomes.connect(nursery, state, daemon_id="d1")
        reached = trio.Event()

        async def gone(frame):
            if isinstance(frame, Job):
                reached.set()

        nursery.start_soon(test_outcomes.sidecar, old, gone)
        calls = []

        async def call():
            calls.append(await bridge.dispatch("u1", "click", {}, job_id="job-v", timeout_s=30))

        nursery.start_soon(call)
        await reached.wait()
        await old.disconnect()  # gone, mid-job
        await trio.sleep(40)  # past the deadline
        assert [(o.status, o.detail) for o in calls] == [("timeout", {"stage": "interrupted"})]
        new = await test_outcomes.connect(nursery, state, daemon_id="d1" if same_daemon else "d2")
        refused = trio.Event()

        async def late(frame):
            if isinstance(frame, Job):
                error = JobError("expired", "deadline passed before it started")
                await new.send(JobResult(frame.id, False, error=error))
                refused.set()

        nursery.start_soon(test_outcomes.sidecar, new, late)
        with trio.fail_after(state.timings.reclaim_idle_s + 3 * state.timings.heartbeat_s):
            await refused.wait()
            while (job := await bridge.job_state("job-v")) is None or not job.stage.terminal:  # noqa: ASYNC110 - test poll, bounded
                await trio.sleep(0.5)
        answer = json.loads(await bridge.answer_of("job-v") or "null")
        assert answer["status"] == ("expired" if same_daemon else "in_doubt"), answer
        nursery.cancel_scope.cancel()


async def test_a_job_pushed_to_a_session_that_ended_before_forwarding_it_is_queued_again(
    autojump_clock, state, bridge, monkeypatch
):
    """A caller's step pushed the job to this process for the desktop's session and
    marked it delivered; the session ended before it forwarded the job (it waited
    behind the user's other reads). Before: it stayed ``delivered`` (its caller was
    told "on the desktop, may be running", and another desktop refusing it later as
    late made it ``in_doubt``), though no desktop got it. Now ``queued`` again."""
    reader = state.reader
    held: list[tuple[str, tuple[str, ...]]] = []
    async with trio.open_nursery() as nursery:
        desk = await test_outcomes.connect(nursery, state, daemon_id="d1")
        nursery.start_soon(test_outcomes.sidecar, desk, test_outcomes.ignore)

        async def busy(self, item):  # the user's reads are busy: the entry waits its turn
            return False

        def hold(self, user_id, *kinds):  # ... and no worker takes it up meanwhile
            held.append((user_id, kinds))

        monkeypatch.setattr(ProcessReader, "_dispatch_now", busy)
        monkeypatch.setattr(ProcessReader, "schedule", hold)
        calls = []

        async def call():
            calls.append(await bridge.dispatch("u1", "click", {}, job_id="job-p", timeout_s=20))

        nursery.start_soon(call)
        with trio.fail_after(5):
            while not reader._pushed.get("u1"):  # noqa: ASYNC110 - test poll, bounded
                await trio.sleep(0.01)
        marked = await state.substrate.get_job_state("u1", "job-p")
        assert marked is not None and marked.stage is Stage.DELIVERED
        await desk.disconnect()  # the session ends before it forwarded the job
        with trio.fail_after(30):
            while not calls:  # noqa: ASYNC110 - test poll, bounded
                await trio.sleep(0.5)
        assert [(o.status, o.detail) for o in calls] == [("timeout", {"stage": "queued"})]
        nursery.cancel_scope.cancel()


async def _attached_then_stopped(nursery, state):
    """A desktop (d1, never answering) whose session is attached to the process reader,
    then stops reading (draining: running jobs go on, nothing new is read); its
    listener."""
    desk = await test_outcomes.connect(nursery, state, daemon_id="d1")
    nursery.start_soon(test_outcomes.sidecar, desk, test_outcomes.ignore)
    with trio.fail_after(5):
        while "u1" not in state.reader._listeners:  # noqa: ASYNC110 - test poll, bounded
            await trio.sleep(0.01)
    (session,) = state.sessions.values()
    session.stop_reading()
    return state.reader._listeners["u1"]


async def test_a_job_pushed_to_a_session_that_stopped_reading_is_queued_again(
    autojump_clock, state, bridge
):
    """The session stopped reading (the process drains: SIGTERM's grace, up to 20 s)
    while presence still names it, so another replica's caller pushes a job to it,
    marked delivered. The session never forwards it (it reads nothing more). Before:
    the worker dropped the pushed entry and it stayed ``delivered`` (its caller was told
    "on the desktop, may be running", a cancel answered ``in_doubt``) though no desktop
    got it. Now ``queued`` again, as for a session that ended."""
    async with trio.open_nursery() as nursery:
        await _attached_then_stopped(nursery, state)
        calls = []

        async def call():
            calls.append(await bridge.dispatch("u1", "click", {}, job_id="job-s", timeout_s=20))

        nursery.start_soon(call)
        with trio.fail_after(30):
            while not calls:  # noqa: ASYNC110 - test poll, bounded
                await trio.sleep(0.5)
        assert [(o.status, o.detail) for o in calls] == [("timeout", {"stage": "queued"})]
        job = await state.substrate.get_job_state("u1", "job-s")
        assert job is not None and job.stage is Stage.QUEUED, job
        nursery.cancel_scope.cancel()


async def test_pushed_entries_a_worker_meets_after_the_session_stopped_are_queued_again(
    autojump_clock, state, bridge, monkeypatch
):
    """The same, when the session stops while a worker hands it the pushed entries
    (``_dispatch``: it skips them once the session reads nothing more). Before: skipped
    and left ``delivered``. Now each goes back to ``queued``."""
    from deskbridge_hub import _reader
    from deskbridge_hub._substrate import Entry, Marked

    unmarked: list[str] = []

    async def spy(substrate, pushed, *, ttl_s):
        unmarked.append(pushed.entry.entry_id)

    monkeypatch.setattr(_reader, "unmark_unheld", spy)
    async with trio.open_nursery() as nursery:
        listener = await _attached_then_stopped(nursery, state)
        marked = Marked("delivered", 0.0, 1)
        entries = [Entry("0-7", {"job_id": "j7"}, marked), Entry("0-8", {"job_id": "j8"}, marked)]
        await state.reader._dispatch(listener, {"0-8"}, entries, pushed=True)
        assert unmarked == ["0-7"]  # 0-8 is being served here: left to that delivery
        nursery.cancel_scope.cancel()


# -- in_doubt and restarting answers name an idempotency key only when the call had one --


def test_an_interrupted_answer_names_a_key_only_when_the_call_had_one() -> None:
    """Before: "a retry with the same idempotency key gets it" and "retry with a new key"
    for a call without a key (its key is its job id): a retry without one is a new job."""
    import json

    from deskbridge_hub._jobs import interrupted_payload

    for pending in (True, False):
        keyless = json.loads(interrupted_payload("expired", pending=pending, unkeyed_job="j7"))
        message = keyless["error"]["message"]
        assert "key" not in message, message
        keyed = json.loads(interrupted_payload("expired", pending=pending))["error"]["message"]
        assert "idempotency key" in keyed or "new key" in keyed
    pending_keyless = json.loads(interrupted_payload("x", pending=True, unkeyed_job="j7"))
    assert "GET /v1/jobs/j7 reports it" in pending_keyless["error"]["message"]


def test_a_released_call_is_told_of_its_key_only_when_it_had_one() -> None:
    from deskbridge_hub._http import restarting_answer

    _, keyless = restarting_answer("job-7", "running", keyed=False)
    assert "idempotency" not in keyless["error"]["message"]
    assert "GET /v1/jobs/job-7" in keyless["error"]["message"]
    _, keyed = restarting_answer("job-7", "running", keyed=True)
    assert "retry with the same idempotency_key" in keyed["error"]["message"]
