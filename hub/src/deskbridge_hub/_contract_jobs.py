"""Contract checks of results and progress beyond the round trips in ``_contract``: the
arguments' bounds, that a progress stream expires, and which desktops a job's deliveries
went to (registered with ``_contract``)."""

from __future__ import annotations

import attrs
import trio

from ._contract import SubstrateHarness, check
from ._jobstate import MIXED, JobState, Stage


async def _refused(call: object, words: str, *, exact: bool = False) -> None:
    try:
        await call  # type: ignore[misc]
    except ValueError as exc:
        assert (str(exc) == words) if exact else (words in str(exc)), str(exc)
    else:
        raise AssertionError(f"accepted what must raise ValueError ({words})")


@check
async def check_result_and_progress_waits_refuse_negative_times_and_accept_zero(
    h: SubstrateHarness,
) -> None:
    """``wait_result(timeout_s=0)`` and ``read_progress(block_ms=0)`` wait until there is
    something (here there is: they answer at once); a negative time is a ValueError."""
    s, user, job = h.substrate, h.user(), h.job()
    await s.publish_result(user, job, "done", ttl_s=30)
    await s.publish_progress(job, '{"progress": 1}', ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_result(user, job, timeout_s=0) == "done"
        assert [p for _, p in await s.read_progress(job, "0", block_ms=0)] == ['{"progress": 1}']
    await _refused(s.wait_result(user, job, timeout_s=-0.5), "must be >= 0, got -0.5")
    await _refused(s.read_progress(job, "0", block_ms=-1), "block_ms must be >= 0, got -1")


@check
async def check_progress_expires_after_its_ttl(h: SubstrateHarness) -> None:
    """Every ``publish_progress`` (re)sets the stream's TTL: a stream left alone for
    longer than its last TTL is gone."""
    s, job = h.substrate, h.job()
    await s.publish_progress(job, '{"progress": 1}', ttl_s=30)
    await s.publish_progress(job, '{"progress": 2}', ttl_s=0.2)
    await trio.sleep(0.4)
    assert await s.read_progress(job, "0", block_ms=1) == []


@check
async def check_enqueue_and_read_new_refuse_arguments_out_of_range_and_accept_their_bounds(
    h: SubstrateHarness,
) -> None:
    """``enqueue``: ``maxlen`` >= 1, at least one field, ``start_within_s`` >= 0;
    ``read_new``: ``block_ms`` >= 0 (0: until an entry comes; here one is there)."""
    s, user = h.substrate, h.user()
    entry_id = await s.enqueue(user, {"job_id": h.job()}, maxlen=1, start_within_s=0.0)
    with trio.fail_after(3):
        (entry,) = await s.read_new(user, "c1", count=10, block_ms=0)
    assert entry.entry_id == entry_id
    bounds = "enqueue needs maxlen >= 1 and at least one field"
    await _refused(s.enqueue(user, {"job_id": h.job()}, maxlen=0), bounds, exact=True)
    await _refused(s.enqueue(user, {}, maxlen=10), bounds, exact=True)
    await _refused(
        s.enqueue(user, {"job_id": h.job()}, maxlen=10, start_within_s=-1),
        "start_within_s must be >= 0, got -1",
    )
    await _refused(s.read_new(user, "c1", count=10, block_ms=-1), "must be >= 0, got -")
    assert (await s.queue_info(user)).length == 1


@check
async def check_prune_consumers_goes_by_each_consumer_s_idle_time(h: SubstrateHarness) -> None:
    """A consumer with nothing pending goes once it has been idle ``idle_ms``: not
    before (an hour), but after a tenth of a second; no stream, nothing to prune."""
    s, user = h.substrate, h.user()
    assert await s.prune_consumers(user, idle_ms=1, keep="me") == 0
    for consumer in ("a", "b"):
        await s.enqueue(user, {"job_id": h.job()}, maxlen=100)
        (entry,) = await s.read_new(user, consumer, count=1, block_ms=1)
        await s.ack(user, entry.entry_id)
    await trio.sleep(0.15)
    assert await s.prune_consumers(user, idle_ms=3_600_000, keep="me") == 0
    assert await s.prune_consumers(user, idle_ms=100, keep="me") == 2


@check
async def check_queue_info_lists_the_oldest_pending_entries_only_when_asked(
    h: SubstrateHarness,
) -> None:
    """Without ``count`` only the counts; with it, that many pending entries, oldest
    first, each with its consumer, idle time and deliveries."""
    s, user = h.substrate, h.user()
    ids = [await s.enqueue(user, {"job_id": h.job()}, maxlen=100) for _ in range(3)]
    await s.read_new(user, "c1", count=2, block_ms=1)
    await trio.sleep(0.1)
    info = await s.queue_info(user)
    assert (info.length, info.pending_count, info.pending) == (3, 2, ())
    (first,) = (await s.queue_info(user, count=1)).pending
    assert (first.entry_id, first.consumer, first.deliveries) == (ids[0], "c1", 1)
    assert 90 <= first.idle_ms < 60_000, first.idle_ms
    both = (await s.queue_info(user, count=5)).pending
    assert [p.entry_id for p in both] == ids[:2]


@check
async def check_a_running_report_is_kept_until_the_answer(h: SubstrateHarness) -> None:
    """The desktop's ``running`` report (``JobState.running``) is kept by every later
    stage of the delivery written without it (the interrupted mark) and by a redelivery:
    the hub never forgets that the job may have acted; a terminal stage is as given."""
    s, user, job = h.substrate, h.user(), h.job()
    first = await s.mark_delivered(user, job, JobState(Stage.DELIVERED, user), ttl_s=60)
    ran = JobState(Stage.DELIVERED, user, at=2.0, session_id="s1", running=True)
    await s.finish(user, job, None, ran, ttl_s=60, epoch=first.epoch)
    gone = JobState(Stage.INTERRUPTED, user, at=2.5)
    await s.finish(user, job, None, gone, ttl_s=60, epoch=first.epoch)
    assert await s.get_job_state(user, job) == attrs.evolve(gone, running=True)
    again = JobState(Stage.DELIVERED, user, at=3.0, session_id="s2")
    await s.mark_delivered(user, job, again, ttl_s=60)
    stored = await s.get_job_state(user, job)
    assert stored is not None and (stored.session_id, stored.running) == ("s2", True), stored
    other = h.job()  # never reported: stays False through the same steps
    marked = await s.mark_delivered(user, other, JobState(Stage.DELIVERED, user), ttl_s=60)
    await s.finish(user, other, None, gone, ttl_s=60, epoch=marked.epoch)
    assert await s.get_job_state(user, other) == gone


@check
async def check_a_redelivery_says_whether_an_earlier_one_went_to_another_desktop(
    h: SubstrateHarness,
) -> None:
    """``mark_delivered`` records the delivery's ``daemon_id``; a redelivery of a job
    forwarded before to another desktop (or to one not known) records ``?`` and answers
    ``elsewhere`` (that desktop may have started it), and ``?`` stays. A stage written
    without ``daemon_id`` by ``finish`` (the interrupted mark) keeps the stored one."""
    s, user = h.substrate, h.user()

    def at(daemon: str | None, stage: Stage = Stage.DELIVERED) -> JobState:
        return JobState(stage, user, at=1.5, session_id="s1", daemon_id=daemon)

    job = h.job()
    first = await s.mark_delivered(user, job, at("d1"), ttl_s=60)
    assert (first.verdict, first.elsewhere) == ("delivered", False)
    gone = JobState(Stage.INTERRUPTED, user, at=2.5)
    await s.finish(user, job, None, gone, ttl_s=60, epoch=first.epoch)
    stored = await s.get_job_state(user, job)
    assert stored == attrs.evolve(gone, daemon_id="d1"), stored
    same = await s.mark_delivered(user, job, at("d1"), ttl_s=60)
    assert (same.verdict, same.elsewhere) == ("delivered", False)
    assert await s.get_job_state(user, job) == at("d1")
    other = await s.mark_delivered(user, job, at("d2"), ttl_s=60)
    assert (other.verdict, other.elsewhere) == ("delivered", True)
    assert await s.get_job_state(user, job) == at(MIXED)
    back = await s.mark_delivered(user, job, at("d1"), ttl_s=60)
    assert (back.verdict, back.elsewhere) == ("delivered", True)  # mixed stays mixed
    done = JobState(Stage.FINISHED, user, at=3.5)  # a terminal stage is stored as given
    await s.finish(user, job, '{"status":"completed"}', done, ttl_s=60, epoch=back.epoch)
    assert await s.get_job_state(user, job) == done
    unknown = h.job()
    await s.mark_delivered(user, unknown, at(None), ttl_s=60)  # a sidecar without an id
    again = await s.mark_delivered(user, unknown, at(None), ttl_s=60)
    assert (again.verdict, again.elsewhere) == ("delivered", True)
    fresh = h.job()
    await s.set_job_state(user, fresh, JobState(Stage.QUEUED, user), ttl_s=60)
    assert (await s.mark_delivered(user, fresh, at("d2"), ttl_s=60)).elsewhere is False


@check
async def check_a_cancelled_redelivery_says_whether_an_earlier_one_went_to_another_desktop(
    h: SubstrateHarness,
) -> None:
    """A cancel found at a redelivery of a forwarded job is ``in_doubt`` (epoch raised,
    state untouched); ``elsewhere`` is False only when every earlier delivery went to
    this very desktop (its ledger knows the job: ``_delivery`` asks it)."""
    s, user = h.substrate, h.user()

    def at(daemon: str | None) -> JobState:
        return JobState(Stage.DELIVERED, user, at=1.5, session_id="s1", daemon_id=daemon)

    for first, again, elsewhere in [
        ("d1", "d1", False), ("d1", "d2", True), (None, None, True), ("d1", None, True),
    ]:  # fmt: skip
        job = h.job()
        before = await s.mark_delivered(user, job, at(first), ttl_s=60)
        await s.request_cancel(user, job, ttl_s=60)
        marked = await s.mark_delivered(user, job, at(again), ttl_s=60)
        assert (marked.verdict, marked.epoch, marked.elsewhere) == (
            "in_doubt", (before.epoch or 0) + 1, elsewhere,
        ), (first, again)  # fmt: skip
        assert await s.get_job_state(user, job) == at(first)  # untouched


@check
async def check_a_delivery_mark_never_forwarded_is_undone_only_while_it_is_the_newest(
    h: SubstrateHarness,
) -> None:
    """``unmark_delivered``: the state goes back to ``queued`` and the claim epoch is
    dropped (a cancel's unfenced answer is then accepted), only while the epoch is the
    one given and the stage ``delivered``; otherwise nothing changes."""
    s, user, job = h.substrate, h.user(), h.job()
    queued = JobState(Stage.QUEUED, user, at=1.0, reply_to="box")
    marked = await s.mark_delivered(user, job, JobState(Stage.DELIVERED, user), ttl_s=60)
    assert marked.epoch is not None
    assert not await s.unmark_delivered(user, job, queued, epoch=marked.epoch + 1, ttl_s=60)
    assert await s.unmark_delivered(user, job, queued, epoch=marked.epoch, ttl_s=60)
    assert await s.get_job_state(user, job) == queued
    cancelled = JobState(Stage.CANCELLED, user, at=2.0)
    assert (
        await s.finish(user, job, '{"status":"cancelled"}', cancelled, ttl_s=60, epoch=0)
    ).verdict == "done"
    assert not await s.unmark_delivered(user, job, queued, epoch=marked.epoch, ttl_s=60)
    again = h.job()
    first = await s.mark_delivered(user, again, JobState(Stage.DELIVERED, user), ttl_s=60)
    await s.finish(
        user, again, None, JobState(Stage.INTERRUPTED, user), ttl_s=60, epoch=first.epoch
    )
    assert not await s.unmark_delivered(user, again, queued, epoch=first.epoch or 0, ttl_s=60)
    stored = await s.get_job_state(user, again)
    assert stored is not None and stored.stage is Stage.INTERRUPTED
