"""Contract checks of the holder's finishing step (``Substrate.finish``) and the claim
epoch (fencing token) that ``mark_delivered`` raises; registered with ``_contract``."""

from __future__ import annotations

import json
import secrets

import attrs
import trio

from ._contract import GROUP_MAXLEN, SubstrateHarness, check
from ._contract_caller import _submission
from ._errors import SubstrateUnavailable
from ._jobstate import MIXED, JobState, Stage
from ._substrate import Entry, fence_key, result_key, state_key


async def _delivered(h: SubstrateHarness) -> tuple[str, str, Entry, str]:
    """A user, a job whose entry this consumer read, and a mailbox for its caller."""
    s, user, job = h.substrate, h.user(), h.job()
    box = f"box-{secrets.token_hex(4)}"
    h.on_mailbox(box)
    await s.enqueue(user, {"job_id": job}, maxlen=GROUP_MAXLEN)
    (entry,) = await s.read_new(user, "c1", count=10, block_ms=None)
    return user, job, entry, box


def _state(stage: Stage, user: str, session: str = "s1") -> JobState:
    return JobState(stage, user, at=1.0, session_id=session)


@check
async def check_finish_publishes_records_acks_and_notifies(h: SubstrateHarness) -> None:
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    marked = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user), ttl_s=60)
    assert marked.verdict == "delivered" and marked.epoch is not None
    finished = await s.finish(
        user, job, '{"status":"completed"}', _state(Stage.FINISHED, user), ttl_s=60,
        entry_id=entry.entry_id, epoch=marked.epoch, notify=box,
    )  # fmt: skip
    assert (finished.verdict, finished.acked) == ("done", True)
    assert await s.get_result(user, job) == '{"status":"completed"}'
    assert (await s.get_job_state(user, job)) == _state(Stage.FINISHED, user)
    assert (await s.queue_info(user)).pending_count == 0
    assert await s.job_ids(user, [entry.entry_id]) == {}
    with trio.fail_after(3):
        got = await s.read_notifications(box, count=10, block_ms=1000)
    assert got == [(job, '{"status":"completed"}')]
    # a retry of a step that happened (its reply was lost): safe, nothing acked twice
    again = await s.finish(
        user, job, '{"status":"completed"}', _state(Stage.FINISHED, user), ttl_s=60,
        entry_id=entry.entry_id, epoch=marked.epoch,
    )  # fmt: skip
    assert (again.verdict, again.acked) == ("done", False)
    if h.raw is not None:
        assert 59_000 < await h.raw("PTTL", result_key(user, job)) <= 60_000


@check
async def check_finish_without_payload_or_entry_only_records_the_state(
    h: SubstrateHarness,
) -> None:
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    finished = await s.finish(user, job, None, _state(Stage.INTERRUPTED, user), ttl_s=60)
    assert finished.verdict == "done"
    assert await s.get_result(user, job) is None
    assert (await s.get_job_state(user, job)) == _state(Stage.INTERRUPTED, user)
    assert (await s.queue_info(user)).pending_count == 1


@check
async def check_a_provisional_answer_reaches_only_the_caller(h: SubstrateHarness) -> None:
    """An ``in_doubt`` at a hand-over whose desktop comes back: the caller's mailbox (and
    the progress stream) get it, the result list does not (a retry by the key waits for
    the real outcome), the entry stays pending; the redelivery's answer is the result."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    marked = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user), ttl_s=60)
    pending = '{"status":"in_doubt","detail":{"pending":true}}'
    finished = await s.finish(
        user, job, pending, _state(Stage.INTERRUPTED, user), ttl_s=60, epoch=marked.epoch,
        notify=box, idempotency_key="key-1", provisional=True,
    )  # fmt: skip
    assert (finished.verdict, finished.acked) == ("done", False)
    with trio.fail_after(3):
        got = await s.read_notifications(box, count=10, block_ms=1000)
    assert got == [(job, pending)]
    assert await s.get_result(user, job) is None
    assert (await s.get_job_state(user, job)) == _state(Stage.INTERRUPTED, user)
    assert (await s.queue_info(user)).pending_count == 1
    if h.raw is not None:
        assert await h.raw("EXISTS", result_key(user, job)) == 0
    again = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user, "s2"), ttl_s=60)
    await s.finish(
        user, job, '{"status":"completed"}', _state(Stage.FINISHED, user), ttl_s=60,
        entry_id=entry.entry_id, epoch=again.epoch, idempotency_key="key-1",
    )  # fmt: skip
    assert await s.get_result(user, job) == '{"status":"completed"}'
    assert (await s.queue_info(user)).pending_count == 0


@check
async def check_every_delivery_raises_the_epoch_and_only_the_newest_finishes(
    h: SubstrateHarness,
) -> None:
    """A zombie (the delivery before a reclaim) is refused: nothing published, no state,
    no XACK, no notification; the newest delivery then finishes."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    first = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user, "s1"), ttl_s=60)
    second = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user, "s2"), ttl_s=60)
    assert first.epoch is not None and second.epoch is not None
    assert second.epoch > first.epoch
    stale = await s.finish(
        user, job, "zombie", _state(Stage.FINISHED, user), ttl_s=60,
        entry_id=entry.entry_id, epoch=first.epoch, notify=box,
    )  # fmt: skip
    assert (stale.verdict, stale.newest) == ("stale", second.epoch)
    assert await s.get_result(user, job) is None
    # the second went to a desktop not known to be the first's: ``?`` (_contract_jobs)
    newest = attrs.evolve(_state(Stage.DELIVERED, user, "s2"), daemon_id=MIXED)
    assert (await s.get_job_state(user, job)) == newest
    assert (await s.queue_info(user)).pending_count == 1
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=50) == []
    done = await s.finish(
        user, job, "newest", _state(Stage.FINISHED, user), ttl_s=60,
        entry_id=entry.entry_id, epoch=second.epoch, notify=box,
    )  # fmt: skip
    assert (done.verdict, done.acked) == ("done", True)
    assert await s.get_result(user, job) == "newest"
    # an unfenced answer (no delivery produced it: lost, malformed) passes the fence, but
    # the job has its answer already: it is settled, nothing changes
    unfenced = await s.finish(user, job, "late", _state(Stage.LOST, user), ttl_s=60)
    assert unfenced.verdict == "settled"
    assert await s.get_result(user, job) == "newest"


@check
async def check_the_epoch_outlives_the_state_until_the_deadline(h: SubstrateHarness) -> None:
    """The fence is kept until the job's deadline plus the state's TTL: a zombie whose
    answer comes after the state expired is still refused."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    marked = await s.mark_delivered(
        user, job, _state(Stage.DELIVERED, user), ttl_s=0.05, deadline=_far(h)
    )
    assert marked.epoch is not None
    await trio.sleep(0.2)
    assert await s.get_job_state(user, job) is None
    older = marked.epoch - 1  # the delivery before this one (a zombie)
    stale = await s.finish(user, job, "zombie", _state(Stage.FINISHED, user), ttl_s=60, epoch=older)
    assert (stale.verdict, stale.newest) == ("stale", marked.epoch)
    if h.raw is not None:
        assert 500_000 < await h.raw("PTTL", fence_key(user, job)) <= 601_000


def _far(h: SubstrateHarness) -> float:
    """A deadline 600 s ahead on the substrate's clock (Redis TIME / the memory clock)."""
    import time

    server_time = getattr(h.substrate, "server_time", time.time)
    return float(server_time()) + 600.0


@check
async def check_invariant_3_finish_stops_at_a_failed_result_write(h: SubstrateHarness) -> None:
    """Invariant 3 inside the one step: the result list holds a value of another type
    (WRONGTYPE), so the step fails at the result write and nothing after it happens: the
    entry stays pending (it will be redelivered), the state and the mailbox untouched."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    marked = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user), ttl_s=60)
    await h.spoil(result_key(user, job))
    try:
        await s.finish(
            user, job, "answer", _state(Stage.FINISHED, user), ttl_s=60,
            entry_id=entry.entry_id, epoch=marked.epoch, notify=box,
        )  # fmt: skip
    except SubstrateUnavailable:
        raise AssertionError("a WRONGTYPE is not an outage") from None
    except Exception:  # noqa: BLE001 - the store's own error type
        pass
    else:
        raise AssertionError("a result write into a string key must fail")
    assert (await s.queue_info(user)).pending_count == 1, "XACK ran although the result failed"
    assert await s.job_ids(user, [entry.entry_id]) == {entry.entry_id: job}
    assert (await s.get_job_state(user, job)) == _state(Stage.DELIVERED, user)
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=50) == []


@check
async def check_read_new_delivered_marks_every_job_it_reads(h: SubstrateHarness) -> None:
    """The read and the delivery mark in one step: each job read is judged on the
    substrate's clock and, if deliverable, recorded delivered with its claim epoch;
    control entries and entries that are not jobs are read unmarked."""
    s, user = h.substrate, h.user()
    delivered = _state(Stage.DELIVERED, user)
    # no stream or group yet (NOGROUP): nothing read, the group is made from 0
    assert await s.read_new_delivered(user, "c1", count=10, state=delivered, ttl_s=60) == []
    live, late, cancelled = h.job(), h.job(), h.job()
    await s.request_cancel(user, cancelled, ttl_s=60)
    far, past = repr(_far(h)), repr(_far(h) - 1200.0)
    entry_ids = []
    for fields in (
        {"job_id": live, "deadline": far},
        {"job_id": late, "deadline": past},
        {"job_id": cancelled, "deadline": far},
        {"control": "cancel", "job_id": live},
        {"job_id": h.job(), "deadline": "soon"},
        {"filler": "x"},
    ):
        entry_ids.append(await s.enqueue(user, fields, maxlen=GROUP_MAXLEN))
    got = await s.read_new_delivered(user, "c1", count=10, state=delivered, ttl_s=60)
    verdicts = [None if e.marked is None else e.marked.verdict for e in got]
    assert verdicts == ["delivered", "expired", "cancelled", None, None, None], verdicts
    assert [e.entry_id for e in got] == entry_ids
    assert got[0].fields == {"job_id": live, "deadline": far}
    assert got[3].fields == {"control": "cancel", "job_id": live}
    assert got[0].marked is not None and got[0].marked.epoch == 1
    assert abs(got[0].marked.server_time - (_far(h) - 600.0)) < 5.0
    assert await s.get_job_state(user, live) == delivered
    assert await s.get_job_state(user, late) is None
    assert (await s.queue_info(user)).pending_count == 6
    again = await s.mark_delivered(user, live, delivered, ttl_s=60)
    assert again.epoch == 2
    assert await s.read_new_delivered(user, "c1", count=10, state=delivered, ttl_s=60) == []


@check
async def check_read_new_delivered_reads_nothing_for_a_superseded_session(
    h: SubstrateHarness,
) -> None:
    """Issue 16: with ``session_id``, nothing is read (nor marked) while presence names
    another session, so a session superseded by a newer one (maybe half-open) takes no
    entry after the newer one's takeover; presence absent or ours reads as before."""
    s, user = h.substrate, h.user()
    delivered = _state(Stage.DELIVERED, user)
    assert await s.read_new_delivered(user, "c1", count=10, state=delivered, ttl_s=60) == []
    job = h.job()
    await s.enqueue(user, {"job_id": job, "deadline": repr(_far(h))}, maxlen=GROUP_MAXLEN)
    await s.set_presence(user, "h2.new", 30)
    old = await s.read_new_delivered(
        user, "c1", count=10, state=delivered, ttl_s=60, session_id="h1.old"
    )
    assert old == []
    assert (await s.queue_info(user)).pending_count == 0
    assert await s.get_job_state(user, job) is None
    got = await s.read_new_delivered(
        user, "c2", count=10, state=delivered, ttl_s=60, session_id="h2.new"
    )
    assert [e.fields["job_id"] for e in got if e.fields] == [job]
    await s.clear_presence(user, "h2.new")
    other = h.job()
    await s.enqueue(user, {"job_id": other, "deadline": repr(_far(h))}, maxlen=GROUP_MAXLEN)
    got = await s.read_new_delivered(
        user, "c1", count=10, state=delivered, ttl_s=60, session_id="h1.old"
    )
    assert [e.fields["job_id"] for e in got if e.fields] == [other]
    # no session_id: no check, whatever presence names
    await s.set_presence(user, "h2.new", 30)
    third = h.job()
    await s.enqueue(user, {"job_id": third, "deadline": repr(_far(h))}, maxlen=GROUP_MAXLEN)
    got = await s.read_new_delivered(user, "c1", count=10, state=delivered, ttl_s=60)
    assert [e.fields["job_id"] for e in got if e.fields] == [third]


@check
async def check_finish_keeps_the_idempotency_record_as_long_as_the_result(
    h: SubstrateHarness,
) -> None:
    """Given the job's ``idempotency_key``, the finishing step keeps the key's record as
    long as the result (a retry attaches while the answer is kept); given none, it leaves
    every record alone, even one stored under the job's own id."""
    s, user, keyed, unkeyed = h.substrate, h.user(), h.job(), h.job()
    key = f"key-{secrets.token_hex(4)}"
    await s.set_presence(user, "s1", 30)
    for job, job_key in ((keyed, key), (unkeyed, unkeyed)):
        short = attrs.evolve(_submission(user, job, key=job_key), index_ttl_s=1.0)
        assert (await s.submit(user, short)).verdict == "queued"
    state = _state(Stage.FINISHED, user)
    await s.finish(user, keyed, "done", state, ttl_s=60, idempotency_key=key)
    await s.finish(user, unkeyed, "done", state, ttl_s=60)
    await trio.sleep(1.2)  # past the records' 1 s (the submits came before the finishes)
    kept = await s.submit(user, _submission(user, h.job(), key=key))
    assert kept.verdict == "indexed", "the record expired before the result"
    gone = await s.submit(user, _submission(user, h.job(), key=unkeyed))
    assert gone.verdict == "queued", "a finish given no key kept a record"


@check
async def check_publish_result_leaves_the_job_state_alone(h: SubstrateHarness) -> None:
    """``publish_result`` writes the result and its notifications, never the job's state:
    a recorded state stays as it was, and a job without one still has none."""
    s, user, recorded, stateless = h.substrate, h.user(), h.job(), h.job()
    delivered = _state(Stage.DELIVERED, user)
    await s.set_job_state(user, recorded, delivered, ttl_s=60)
    for job in (recorded, stateless):
        await s.publish_result(user, job, "done", ttl_s=60)
    assert await s.get_job_state(user, recorded) == delivered
    assert await s.get_job_state(user, stateless) is None


@check
async def check_the_published_outcome_ends_the_job_s_progress_stream(h: SubstrateHarness) -> None:
    """A finish with a payload appends ``{"outcome": <payload>}`` to the job's progress
    stream, if it has one (as ``publish_result``); a finish without a payload, a stale
    one and a job without a stream add nothing (no stream is made)."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    marked = await s.mark_delivered(user, job, _state(Stage.DELIVERED, user), ttl_s=60)
    await s.publish_progress(job, '{"progress": 1}', ttl_s=60)
    (first,) = await s.read_progress(job, "0", block_ms=1)
    state = _state(Stage.FINISHED, user)
    await s.finish(user, job, None, _state(Stage.INTERRUPTED, user), ttl_s=60)
    older = (marked.epoch or 0) - 1
    stale = await s.finish(user, job, '"zombie"', state, ttl_s=60, epoch=older)
    assert stale.verdict == "stale"
    assert await s.read_progress(job, first[0], block_ms=1) == []
    payload = '{"status":"completed","result":7}'
    done = await s.finish(
        user, job, payload, state, ttl_s=60, entry_id=entry.entry_id, epoch=marked.epoch,
        notify=box,
    )  # fmt: skip
    assert done.verdict == "done"
    (end,) = await s.read_progress(job, first[0], block_ms=1)
    assert json.loads(end[1]) == {"outcome": json.loads(payload)}
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=1000) == [(job, payload)]
    streamless = h.job()
    await s.finish(user, streamless, payload, state, ttl_s=60, notify=box)
    assert await s.read_progress(streamless, "0", block_ms=1) == []
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=1000) == [(streamless, payload)]


@check
async def check_a_terminal_answer_is_final(h: SubstrateHarness) -> None:
    """Two writers about one job (a cancel's answer and the holder's ``expired``, a
    stage report and the tool's answer): whichever finishes first is the job's one
    answer. A later finish, fenced or not, with or without a payload, is ``settled``:
    no second result, no state change, no notification; its entry is still acked (the
    job is answered, it must not be delivered again)."""
    s = h.substrate
    user, job, entry, box = await _delivered(h)
    cancelled = '{"status":"cancelled"}'
    first = await s.finish(
        user, job, cancelled, _state(Stage.CANCELLED, user), ttl_s=60, epoch=0, notify=box
    )
    assert first.verdict == "done"
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=1000) == [(job, cancelled)]
    acks = []
    for payload, stage, epoch in (
        ('{"status":"expired"}', Stage.EXPIRED, None),
        ('{"status":"cancelled"}', Stage.CANCELLED, 0),
        (None, Stage.AWAITING_APPROVAL, None),
        (None, Stage.INTERRUPTED, 0),
    ):
        late = await s.finish(
            user, job, payload, _state(stage, user, "s2"), ttl_s=60, entry_id=entry.entry_id,
            epoch=epoch, notify=box,
        )  # fmt: skip
        assert late.verdict == "settled", (stage, late)
        acks.append(late.acked)
        assert (await s.get_job_state(user, job)) == _state(Stage.CANCELLED, user)
        assert await s.get_result(user, job) == cancelled
    assert acks == [True, False, False, False]  # acked all the same, once
    assert (await s.queue_info(user)).pending_count == 0
    assert await s.job_ids(user, [entry.entry_id]) == {}
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=50) == []
    if h.raw is not None:
        assert await h.raw("LLEN", result_key(user, job)) == 1
    # a fenced answer of the delivery that finished: the same, and a provisional one
    user, other, _, _ = await _delivered(h)
    marked = await s.mark_delivered(user, other, _state(Stage.DELIVERED, user), ttl_s=60)
    done = await s.finish(
        user, other, '"ok"', _state(Stage.FINISHED, user), ttl_s=60, epoch=marked.epoch
    )
    assert done.verdict == "done"
    for provisional in (False, True):
        late = await s.finish(
            user, other, '"again"', _state(Stage.INTERRUPTED, user), ttl_s=60,
            epoch=marked.epoch, provisional=provisional,
        )  # fmt: skip
        assert (late.verdict, late.acked) == ("settled", False)
    assert (await s.get_job_state(user, other)) == _state(Stage.FINISHED, user)
    assert await s.get_result(user, other) == '"ok"'
    # stored text that is not a job state is no answer: the step happens
    user, odd, odd_entry, _ = await _delivered(h)
    await h.spoil(state_key(user, odd))
    done = await s.finish(
        user, odd, '"x"', _state(Stage.FINISHED, user), ttl_s=60, entry_id=odd_entry.entry_id
    )
    assert (done.verdict, done.acked) == ("done", True)
    assert await s.get_result(user, odd) == '"x"'
    assert (await s.get_job_state(user, odd)) == _state(Stage.FINISHED, user)
