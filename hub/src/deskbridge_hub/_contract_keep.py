"""Contract checks of the records a running job keeps alive (``keep_job``) and of the
owner record its answer keeps (``finish``); registered with ``_contract``.

The kind they pin: a record the hub relies on lapsing while its job is legitimately
still alive (a job running past the result TTL, or answered after its deadline)."""

from __future__ import annotations

import attrs
import trio

from ._contract import SubstrateHarness, check
from ._contract_caller import _submission
from ._jobstate import JobState, Stage
from ._substrate import (
    JobOwner,
    cancel_key,
    fence_key,
    idem_key,
    owner_key,
    result_key,
    state_key,
)

#: Short lifetimes for the checks (they run on a real Redis too), seconds.
_SHORT_S = 0.3
_LONG_S = 3.0


async def _running(h: SubstrateHarness) -> tuple[str, str, str, int]:
    """A user, a submitted and delivered job of it (state, claim epoch, cancel flag,
    idempotency record and owner record, all with ``_SHORT_S`` to live), the job's
    idempotency key and its claim epoch."""
    s, user, job = h.substrate, h.user(), h.job()
    key = f"key-{job}"
    await s.set_presence(user, "s1", 30)
    short = attrs.evolve(
        _submission(user, job, key=key), state_ttl_s=_SHORT_S, index_ttl_s=_SHORT_S
    )
    assert (await s.submit(user, short)).verdict == "queued"
    assert len(await s.read_new(user, "c1", count=10, block_ms=None)) == 1
    delivered = JobState(Stage.DELIVERED, user, at=1.0, session_id="s1")
    marked = await s.mark_delivered(user, job, delivered, ttl_s=_SHORT_S)
    assert marked.verdict == "delivered" and marked.epoch is not None
    await s.request_cancel(user, job, ttl_s=_SHORT_S)
    return user, job, key, marked.epoch


@check
async def check_keep_job_keeps_a_running_jobs_records_alive(h: SubstrateHarness) -> None:
    s = h.substrate
    user, job, key, epoch = await _running(h)
    await s.keep_job(user, job, ttl_s=_LONG_S, idempotency_key=key)
    await trio.sleep(2 * _SHORT_S)
    state = await s.get_job_state(user, job)
    assert state is not None and state.stage is Stage.DELIVERED
    assert await s.job_owner(job) == JobOwner(user, "box")
    # the claim epoch is kept (the next delivery's is larger, never the first again),
    # and so is the cancel flag (the delivered job is in doubt, not delivered afresh)
    again = JobState(Stage.DELIVERED, user, at=2.0, session_id="s2")
    marked = await s.mark_delivered(user, job, again, ttl_s=_LONG_S)
    assert (marked.verdict, marked.epoch) == ("in_doubt", epoch + 1)
    # the idempotency record still names the job: a retry attaches to it
    retry = await s.submit(user, _submission(user, h.job(), key=key))
    assert retry.verdict == "indexed" and (retry.index_value or "").startswith(job + " ")
    if h.raw is not None:
        for kept in (idem_key(user, key), cancel_key(user, job), fence_key(user, job)):
            assert 1_000 < await h.raw("PTTL", kept) <= _LONG_S * 1000, kept


@check
async def check_keep_job_never_shortens_a_record_nor_makes_one(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    long_lived = JobState(Stage.DELIVERED, user, at=1.0, session_id="s1")
    await s.set_job_state(user, job, long_lived, ttl_s=60)
    await s.keep_job(user, job, ttl_s=_SHORT_S, idempotency_key="never-made")
    await trio.sleep(2 * _SHORT_S)
    assert await s.get_job_state(user, job) == long_lived
    assert await s.job_owner(job) is None
    if h.raw is not None:
        assert await h.raw("PTTL", state_key(user, job)) > 50_000
        for absent in (idem_key(user, "never-made"), cancel_key(user, job), fence_key(user, job)):
            assert await h.raw("EXISTS", absent) == 0, absent
        assert await h.raw("EXISTS", owner_key(job)) == 0


@check
async def check_finish_keeps_the_owner_record_as_long_as_the_state(h: SubstrateHarness) -> None:
    # A job answered after its deadline: its owner record (deadline + result TTL) would
    # lapse before the state the answer records (result TTL from now): GET and DELETE
    # of a caller-chosen job id then said 404 for a job whose answer is still kept.
    s = h.substrate
    user, job, key, _ = await _running(h)
    finished = JobState(Stage.FINISHED, user, at=2.0)
    got = await s.finish(
        user, job, '{"status":"completed"}', finished, ttl_s=_LONG_S, idempotency_key=key
    )
    assert got.verdict == "done"
    await trio.sleep(2 * _SHORT_S)
    assert await s.get_job_state(user, job) == finished
    assert await s.job_owner(job) == JobOwner(user, "box", answered=True)
    if h.raw is not None:
        assert 1_000 < await h.raw("PTTL", owner_key(job)) <= _LONG_S * 1000


@check
async def check_a_terminal_answer_shortens_the_claim_epoch(h: SubstrateHarness) -> None:
    # The mark keeps a forwarded job's claim epoch as long as its state, a day (its
    # desktop may come back that late); once the job has its answer the epoch lives no
    # longer than the answer's state, or every answered job's epoch would stay a day.
    s = h.substrate
    user, job, _, _ = await _running(h)
    again = JobState(Stage.DELIVERED, user, at=2.0, session_id="s2")
    await s.request_cancel(user, job, ttl_s=_SHORT_S)
    await trio.sleep(2 * _SHORT_S)  # the cancel flag lapsed: delivered again
    marked = await s.mark_delivered(user, job, again, ttl_s=_LONG_S * 10)
    assert marked.verdict == "delivered" and marked.epoch is not None
    finished = JobState(Stage.FINISHED, user, at=3.0)
    got = await s.finish(user, job, '"x"', finished, ttl_s=_SHORT_S, epoch=marked.epoch)
    assert got.verdict == "done"
    if h.raw is not None:
        assert 0 < await h.raw("PTTL", fence_key(user, job)) <= _SHORT_S * 1000
    await trio.sleep(2 * _SHORT_S)
    # the epoch lapsed with the state: another epoch's answer is no longer "stale"
    late = await s.finish(user, job, None, finished, ttl_s=_SHORT_S, epoch=marked.epoch + 7)
    assert late.verdict != "stale", late


@check
async def check_a_stage_of_the_delivery_keeps_the_keys_record_as_long_as_the_state(
    h: SubstrateHarness,
) -> None:
    # The socket went away with the job (``interrupted``, kept a day): a retry with its
    # key must still attach to it after the record's own deadline + result TTL, never
    # find the key free (then: ``offline`` while the desktop is away, or a second job).
    s = h.substrate
    user, job, key, epoch = await _running(h)
    interrupted = JobState(Stage.INTERRUPTED, user, at=2.0)
    got = await s.finish(
        user, job, None, interrupted, ttl_s=_LONG_S, epoch=epoch, idempotency_key=key
    )
    assert got.verdict == "done"
    await trio.sleep(2 * _SHORT_S)
    retry = await s.submit(user, _submission(user, h.job(), key=key))
    assert retry.verdict == "indexed" and (retry.index_value or "").startswith(job + " ")


@check
async def check_a_delivery_keeps_the_keys_record_as_long_as_the_state_until_answered(
    h: SubstrateHarness,
) -> None:
    # A holder that dies writes no ``interrupted`` mark: the delivery's own mark (kept a
    # day in production) must keep the key's record as long as the state, or a retry
    # finds the key free while the job may have run. The answer then sets the record back
    # to its own lifetime (deadline + result TTL, at least the answer's), never a day.
    s, user = h.substrate, h.user()
    await s.set_presence(user, "s1", 30)
    delivered = JobState(Stage.DELIVERED, user, at=1.0, session_id="s1")
    jobs = (h.job(), h.job())
    for job in jobs:
        short = attrs.evolve(
            _submission(user, job, key=f"key-{job}"), start_within_s=0.0,
            state_ttl_s=_SHORT_S, index_ttl_s=_SHORT_S,
        )  # fmt: skip
        assert (await s.submit(user, short)).verdict == "queued"
    one, two = jobs
    (first,) = await s.read_new(user, "c1", count=1, block_ms=None)
    assert first.fields is not None and first.fields["job_id"] == one
    # the deadline (start within 0 s) has passed, so the mark must find it forwarded
    await s.set_job_state(user, one, delivered, ttl_s=_LONG_S)
    marked = await s.mark_delivered(
        user, one, delivered, ttl_s=_LONG_S * 10, idempotency_key=f"key-{one}"
    )
    assert marked.verdict == "delivered"
    await s.set_job_state(user, two, delivered, ttl_s=_LONG_S)
    (second,) = await s.read_new_delivered(
        user, "c1", count=1, state=delivered, ttl_s=_LONG_S * 10
    )
    assert second.marked is not None and second.marked.verdict == "delivered"
    await trio.sleep(2 * _SHORT_S)  # past the records' own lifetime
    for job in jobs:
        retry = await s.submit(user, _submission(user, h.job(), key=f"key-{job}"))
        assert retry.verdict == "indexed", f"the key's record of {job} lapsed before its state"
        if h.raw is not None:
            assert await h.raw("PTTL", idem_key(user, f"key-{job}")) > _LONG_S * 1000
    finished = JobState(Stage.FINISHED, user, at=2.0)
    got = await s.finish(
        user, one, '{"status":"completed"}', finished, ttl_s=_SHORT_S,
        idempotency_key=f"key-{one}",
    )  # fmt: skip
    assert got.verdict == "done"
    await s.publish_result(user, two, '"x"', ttl_s=_SHORT_S, idempotency_key=f"key-{two}")
    if h.raw is not None:
        for job in jobs:
            assert 0 < await h.raw("PTTL", idem_key(user, f"key-{job}")) <= _SHORT_S * 1000
            assert 0 < await h.raw("PTTL", result_key(user, job)) <= _SHORT_S * 1000
    await trio.sleep(2 * _SHORT_S)
    for job in jobs:  # answered, past its deadline + result TTL: the key is free again
        fresh = await s.submit(user, _submission(user, h.job(), key=f"key-{job}"))
        assert fresh.verdict == "queued", f"the answered key of {job} was still taken"


@check
async def check_a_keep_of_a_chosen_id_that_lands_after_its_answer_keeps_nothing(
    h: SubstrateHarness,
) -> None:
    # The delivery hands a forwarded chosen id's keep (a day) to a loop that sends it
    # soon; a fast answer's write (result TTL) may land first. Whatever the order, the
    # answer wins: an answered id is free again with its state, never taken a day.
    s = h.substrate
    user, kept, _, _ = await _running(h)
    other, answered, _, _ = await _running(h)
    finished = JobState(Stage.FINISHED, other, at=2.0)
    got = await s.finish(other, answered, '{"status":"completed"}', finished, ttl_s=_SHORT_S)
    assert got.verdict == "done"
    owner = await s.job_owner(answered)
    assert owner is not None and owner.user_id == other  # GET /v1/jobs/{id} still finds it
    await s.keep_job_ids([kept, answered], ttl_s=_LONG_S)  # lands after the answer
    if h.raw is not None:
        assert 0 < await h.raw("PTTL", owner_key(answered)) <= _SHORT_S * 1000
        assert await h.raw("PTTL", owner_key(kept)) > _SHORT_S * 1000
    await trio.sleep(2 * _SHORT_S)
    assert await s.job_owner(answered) is None, "an answered id was kept by a late keep"
    found = await s.job_owner(kept)
    assert found is not None and found.user_id == user  # an unanswered one is kept
