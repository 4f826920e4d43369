"""Contract checks of the caller's path: the one enqueue step (``submit``), results read
without popping, notification mailboxes, job owner records (see ``_contract``)."""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Awaitable
from typing import Any

import attrs
import trio

from ._contract import SubstrateHarness, check
from ._idempotency import IndexRecord
from ._jobstate import JobState, Stage
from ._substrate import JobOwner, Submission, idem_key, result_key


def _submission(
    user: str, job: str, *, key: str | None = None, sha1: str | None = "", tool: str = "echo"
) -> Submission:
    return Submission(
        job_id=job,
        fields={"job_id": job, "name": tool, "args": "{}", "idempotency_key": key or job},
        start_within_s=30.0,
        state=JobState(Stage.QUEUED, user, at=1.0, reply_to="box"),
        state_ttl_s=60.0,
        maxlen=100,
        catalogue_sha1=sha1,
        idempotency_key=key,
        index_value=IndexRecord(job, tool, "d1").encode(),
        index_ttl_s=60.0,
        owner=JobOwner(user, "box"),
        write_owner=True,
    )


@check
async def check_submit_offline_writes_nothing(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    got = await s.submit(user, _submission(user, job, key="k1"))
    assert got.verdict == "offline"
    assert await s.get_job_state(user, job) is None
    assert (await s.queue_info(user)).length == 0
    await s.set_presence(user, "s1", 30)
    # the key was not indexed by the offline attempt: a retry enqueues
    assert (await s.submit(user, _submission(user, job, key="k1"))).verdict == "queued"


async def _keys(h: SubstrateHarness, user: str) -> list[str] | None:
    return None if h.keys_of is None else sorted(await h.keys_of(user))


@check
async def check_refused_submits_leave_no_key_behind(h: SubstrateHarness) -> None:
    """A submit answered anything but ``queued`` (or ``indexed``) writes nothing that
    outlives it: not the user's stream or consumer group, not a state, index or
    idempotency record, not the owner record (``write_owner``). A caller trying many
    unknown user ids must not leave keys without a TTL behind."""
    s, user, job = h.substrate, h.user(), h.job()
    got = await s.submit(user, _submission(user, job, key="k1"))
    assert got.verdict == "offline"
    assert await _keys(h, user) in (None, []), "an offline submit left keys behind"
    assert await s.job_owner(job) is None
    # online, but every check refuses: each answer leaves the keys as they were
    await s.set_presence(user, "p1.s1", 30)
    text = '[{"name": "echo"}]'
    await s.set_catalogue(user, text)
    sha1 = hashlib.sha1(text.encode()).hexdigest()
    before = await _keys(h, user)
    # presence names a process the caller has not seen alive
    held = await s.submit(user, _submission(user, job, key="k2", sha1=sha1))
    assert held.verdict == "holder"
    await s.clear_presence(user, "p1.s1")
    await s.set_presence(user, "s2", 30)  # no process named: the catalogue decides
    stale = await s.submit(user, _submission(user, job, key="k2", sha1="0" * 40))
    assert stale.verdict == "catalogue"
    assert await _keys(h, user) == before, "a refused submit left keys behind"
    assert await s.job_owner(job) is None
    assert (await s.queue_info(user)).length == 0
    # a job id already in use: refused, and the job's own records are left as they were
    assert (await s.submit(user, _submission(user, job, sha1=sha1))).verdict == "queued"
    before = await _keys(h, user)
    again = attrs.evolve(_submission(user, job, key="k3", sha1=sha1), owner=JobOwner(user, "b2"))
    assert (await s.submit(user, again)).verdict == "job_id_in_use"
    assert await _keys(h, user) == before
    assert await s.job_owner(job) == JobOwner(user, "box")
    assert (await s.queue_info(user)).length == 1


@check
async def check_submit_enqueues_with_state_index_owner_and_server_deadline(
    h: SubstrateHarness,
) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    await s.set_presence(user, "s1", 30)
    got = await s.submit(user, _submission(user, job))
    assert got.verdict == "queued" and got.entry_id
    assert got.presence == "s1"  # the presence it was queued under
    (entry,) = await s.read_new(user, "c1", count=10, block_ms=1)
    assert entry.entry_id == got.entry_id and entry.fields is not None
    assert entry.fields["job_id"] == job and entry.fields["name"] == "echo"
    deadline, enqueued_at = float(entry.fields["deadline"]), float(entry.fields["enqueued_at"])
    assert abs(deadline - enqueued_at - 30.0) < 0.002
    assert await s.job_ids(user, [entry.entry_id]) == {entry.entry_id: job}
    state = await s.get_job_state(user, job)
    assert state is not None and state.stage is Stage.QUEUED and state.reply_to == "box"
    assert await s.job_owner(job) == JobOwner(user, "box")
    # the same job id again (a racing caller): refused, nothing enqueued
    assert (await s.submit(user, _submission(user, job))).verdict == "job_id_in_use"
    assert await s.read_new(user, "c1", count=10, block_ms=1) == []


@check
async def check_submit_with_the_callers_time_counts_the_window_from_the_call(
    h: SubstrateHarness,
) -> None:
    """``give_up_s``: a step that runs at once enqueues as without it, the job's window
    counted from the call (a lower bound of the substrate's clock then: at most the
    step's own ``TIME``, a round trip earlier at worst); a non-positive one is refused."""
    s, user, job = h.substrate, h.user(), h.job()
    await s.set_presence(user, "s1", 30)
    got = await s.submit(user, attrs.evolve(_submission(user, job), give_up_s=5.0))
    assert got.verdict == "queued"
    (entry,) = await s.read_new(user, "c1", count=10, block_ms=1)
    assert entry.fields is not None
    window = float(entry.fields["deadline"]) - float(entry.fields["enqueued_at"])
    assert 30.0 - 1.0 < window <= 30.0 + 0.002
    try:
        await s.submit(user, attrs.evolve(_submission(user, h.job()), give_up_s=0.0))
    except ValueError:
        pass
    else:
        raise AssertionError("give_up_s = 0 was accepted")
    assert (await s.queue_info(user)).length == 1


@check
async def check_submit_compares_the_catalogue_version(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.set_presence(user, "s1", 30)
    # no catalogue stored: any version the caller names is out of date, with none to send
    none = await s.submit(user, _submission(user, h.job(), sha1="0" * 40))
    assert (none.verdict, none.catalogue) == ("catalogue", None)
    text = '[{"name": "echo"}]'
    await s.set_catalogue(user, text)
    stale = await s.submit(user, _submission(user, h.job(), sha1=""))
    assert stale.verdict == "catalogue" and stale.catalogue == text
    sha1 = hashlib.sha1(text.encode()).hexdigest()
    assert (await s.submit(user, _submission(user, h.job(), sha1=sha1))).verdict == "queued"
    # None: no catalogue check at all (the status tool)
    assert (await s.submit(user, _submission(user, h.job(), sha1=None))).verdict == "queued"
    other = await s.submit(user, _submission(user, h.job(), sha1="0" * 40))
    assert other.verdict == "catalogue" and other.catalogue == text
    assert (await s.queue_info(user)).length == 2


@check
async def check_submit_with_an_indexed_key_returns_its_record_and_enqueues_nothing(
    h: SubstrateHarness,
) -> None:
    s, user, first, second = h.substrate, h.user(), h.job(), h.job()
    key = f"key-{secrets.token_hex(4)}"
    await s.set_presence(user, "s1", 30)
    assert (await s.submit(user, _submission(user, first, key=key))).verdict == "queued"
    await s.clear_presence(user, "s1")  # the desktop went away: a retry must still attach
    again = await s.submit(user, _submission(user, second, key=key, tool="click"))
    assert again.verdict == "indexed"
    # the record, with the job's deadline (the entry's, from the substrate's clock)
    (entry,) = await s.read_new(user, "c1", count=10, block_ms=1)
    assert entry.fields is not None
    record = IndexRecord.decode(again.index_value or "")
    assert record == IndexRecord(first, "echo", "d1", float(entry.fields["deadline"]))
    assert again.index_value == record.encode()
    # ... and the substrate's clock now: the job may start for about 30 s more
    assert again.server_time is not None and record.deadline is not None
    assert 29.0 < record.deadline - again.server_time <= 30.0 + 0.002
    assert await s.get_job_state(user, second) is None
    assert (await s.queue_info(user)).length == 1


@check
async def check_submit_attach_only_looks_the_key_up_and_writes_nothing(
    h: SubstrateHarness,
) -> None:
    """``attach_only`` (a request whose caller-chosen job id another call holds): the
    key's record when it names a job, else ``job_id_in_use``; nothing written either way,
    whatever presence, catalogue and state say."""
    s, user, job = h.substrate, h.user(), h.job()
    key = f"key-{secrets.token_hex(4)}"
    await s.set_presence(user, "s1", 30)
    only = attrs.evolve(_submission(user, job, key=key), attach_only=True)
    assert (await s.submit(user, only)).verdict == "job_id_in_use"
    assert await s.get_job_state(user, job) is None
    assert await s.job_owner(job) is None
    assert (await s.queue_info(user)).length == 0
    if h.keys_of is not None:
        assert [k for k in await h.keys_of(user) if "presence" not in k] == []
    assert (await s.submit(user, _submission(user, job, key=key))).verdict == "queued"
    again = await s.submit(user, attrs.evolve(only, job_id=h.job()))
    assert again.verdict == "indexed"
    assert IndexRecord.decode(again.index_value or "").job_id == job
    assert (await s.queue_info(user)).length == 1
    try:
        await s.submit(user, attrs.evolve(only, idempotency_key=None))
    except ValueError as exc:
        assert str(exc) == "submit with attach_only needs an idempotency_key"
    else:
        raise AssertionError("attach_only without a key must be refused")


@check
async def check_published_result_is_read_without_popping_and_notified(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    box = f"box-{secrets.token_hex(4)}"
    h.on_mailbox(box)
    assert await s.get_result(user, job) is None
    await s.publish_result(user, job, '{"status": "completed"}', ttl_s=300, notify=box)
    await s.publish_result(user, job, "second", ttl_s=300)
    for _ in range(2):  # any number of waiters read the first payload
        assert await s.get_result(user, job) == '{"status": "completed"}'
    with trio.fail_after(3):
        got = await s.read_notifications(box, count=10, block_ms=1000)
    assert got == [(job, '{"status": "completed"}')]
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=10, block_ms=50) == []


@check
async def check_read_notifications_wakes_on_a_publish(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    box = f"box-{secrets.token_hex(4)}"
    h.on_mailbox(box)
    got: list[list[tuple[str, str]]] = []

    async def reader() -> None:
        got.append(await s.read_notifications(box, count=10, block_ms=5000))

    with trio.fail_after(4):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await h.wait_blocked("blmpop")
            await s.publish_result(user, job, "done", ttl_s=30, notify=box)
    assert got == [[(job, "done")]]


@check
async def check_published_result_lives_as_long_as_its_idempotency_record(
    h: SubstrateHarness,
) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    key = f"key-{secrets.token_hex(4)}"
    await s.set_presence(user, "s1", 30)
    submission = _submission(user, job, key=key)
    # (a record lives until its job's deadline + the result TTL: the answer keeps no
    # more of it than that, so the deadline is far too)
    long_lived = attrs.evolve(submission, index_ttl_s=600.0, start_within_s=570.0)
    assert (await s.submit(user, long_lived)).verdict == "queued"
    await s.publish_result(user, job, "done", ttl_s=30, idempotency_key=key)
    if h.raw is not None:
        result_ms = await h.raw("PTTL", result_key(user, job))
        index_ms = await h.raw("PTTL", idem_key(user, key))
        assert 590_000 < result_ms <= 600_000 and abs(result_ms - index_ms) < 2_000
    # a record naming another job is left alone
    await s.publish_result(user, h.job(), "other", ttl_s=30, idempotency_key=key)
    if h.raw is not None:
        assert await h.raw("PTTL", idem_key(user, key)) > 500_000


@check
async def check_job_id_claims_are_global(h: SubstrateHarness) -> None:
    s, job = h.substrate, h.job()
    assert await s.job_owner(job) is None
    assert await s.claim_job_id(job, JobOwner("u1", "box"), ttl_s=60) is True
    assert await s.claim_job_id(job, JobOwner("u2"), ttl_s=60) is False
    assert await s.job_owner(job) == JobOwner("u1", "box")
    await s.forget_job_id(job, JobOwner("u1", "box"))
    assert await s.job_owner(job) is None
    assert await s.claim_job_id(job, JobOwner("u2"), ttl_s=60) is True
    assert await s.job_owner(job) == JobOwner("u2")


@check
async def check_a_copy_drops_only_its_own_job_id_claim(h: SubstrateHarness) -> None:
    """Copies of one request claim a job id with records that differ in their claim
    token. A copy that enqueued the job claims the id again with ``replace`` (whatever
    unanswered record is there); a refused copy's ``forget_job_id`` that lands after it
    deletes nothing (it deleted the record naming the running job). A record marked
    answered is never replaced."""
    s, job = h.substrate, h.job()
    first = JobOwner("u1", "box", request="d1", claim="aaaa")
    second = JobOwner("u1", "box", request="d1", claim="bbbb")
    assert await s.claim_job_id(job, first, ttl_s=60) is True
    assert await s.claim_job_id(job, second, ttl_s=60) is False
    assert await s.claim_job_id(job, second, ttl_s=60, replace=True) is True
    await s.forget_job_id(job, first)  # the refused copy's late drop
    assert await s.job_owner(job) == second
    await s.forget_job_id(job, second)
    assert await s.job_owner(job) is None
    assert await s.claim_job_id(job, second, ttl_s=60, replace=True) is True  # free: made
    await s.finish("u1", job, "{}", JobState(Stage.FINISHED, "u1", at=2.0), ttl_s=60)
    answered = await s.job_owner(job)
    assert answered is not None and answered.answered
    assert await s.claim_job_id(job, first, ttl_s=60, replace=True) is False
    await s.forget_job_id(job, second)  # not the record as claimed any more
    assert await s.job_owner(job) == answered


@check
async def check_a_redelivery_past_its_deadline_is_forwarded_not_expired(
    h: SubstrateHarness,
) -> None:
    """Issue 16: a job whose state says it was forwarded (delivered, awaiting approval, or
    interrupted when its socket went away) may have run; past its deadline its redelivery is still
    ``delivered`` (the desktop's ledger answers it), never ``expired``. A job never
    forwarded (queued, or no state) past its deadline is ``expired``, state untouched."""
    s, user = h.substrate, h.user()
    again = JobState(Stage.DELIVERED, user, at=3.0, session_id="s2", daemon_id="d1")
    now = (await s.mark_delivered(user, h.job(), again, ttl_s=60)).server_time
    # awaiting_approval too (issue 12 item 5): approved, it may have run before its
    # ``running`` report was recorded
    for before in (Stage.DELIVERED, Stage.INTERRUPTED, Stage.AWAITING_APPROVAL):
        job = h.job()
        sent = JobState(before, user, at=2.0, daemon_id="d1")
        await s.set_job_state(user, job, sent, ttl_s=60)
        marked = await s.mark_delivered(user, job, again, ttl_s=60, deadline=now - 5.0)
        assert (marked.verdict, marked.elsewhere) == ("delivered", False), before
        assert marked.server_time >= now
        assert await s.get_job_state(user, job) == again
    never: tuple[Stage | None, ...] = (Stage.QUEUED, Stage.FINISHED, None)
    for unsent in never:
        job = h.job()
        if unsent is not None:
            await s.set_job_state(user, job, JobState(unsent, user, at=2.0), ttl_s=60)
        marked = await s.mark_delivered(user, job, again, ttl_s=60, deadline=now - 5.0)
        assert marked.verdict == "expired", unsent
        stored = await s.get_job_state(user, job)
        assert (None if stored is None else stored.stage) == unsent
    # a cancel requested for a forwarded job still wins over forwarding it afresh, but the
    # job may have run: in doubt (never "cancelled"; ``_delivery`` asks the desktop only
    # when every earlier delivery went to it), with a raised epoch that refuses the old
    # delivery's late answer; past its deadline or not
    for deadline in (now - 5.0, now + 60.0):
        job = h.job()
        first = await s.mark_delivered(user, job, again, ttl_s=60)
        await s.set_job_state(user, job, JobState(Stage.INTERRUPTED, user), ttl_s=60)
        await s.request_cancel(user, job, ttl_s=60)
        marked = await s.mark_delivered(user, job, again, ttl_s=60, deadline=deadline)
        assert (marked.verdict, marked.epoch) == ("in_doubt", (first.epoch or 0) + 1)
        assert marked.elsewhere  # the interrupted delivery's desktop is not known
        stored = await s.get_job_state(user, job)
        assert stored is not None and stored.stage is Stage.INTERRUPTED  # untouched
        late = JobState(Stage.FINISHED, user)
        stale = await s.finish(user, job, None, late, ttl_s=60, epoch=first.epoch)
        assert stale.verdict == "stale"
    # never forwarded: "cancelled", no epoch
    job = h.job()
    await s.set_job_state(user, job, JobState(Stage.QUEUED, user), ttl_s=60)
    await s.request_cancel(user, job, ttl_s=60)
    marked = await s.mark_delivered(user, job, again, ttl_s=60, deadline=now + 60.0)
    assert (marked.verdict, marked.epoch) == ("cancelled", None)


@check
async def check_submit_wakes_the_holder_process_it_expects(h: SubstrateHarness) -> None:
    """With ``alive_holder``, a queued job pushes its user onto that process's wake list
    in the same step; a presence naming another process enqueues nothing."""
    s, user = h.substrate, h.user()
    holder = f"h{secrets.token_hex(4)}"
    # (the wake list is popped empty below, so it needs no cleanup)
    h.on_user(holder)  # its liveness key carries its tag
    await s.set_liveness(holder, 30)
    await s.set_presence(user, f"{holder}.s1", 30)
    job = h.job()
    sub = attrs.evolve(_submission(user, job), alive_holder=holder, wake_ttl_s=30.0)
    assert (await s.submit(user, sub)).verdict == "queued"
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1.0, count=10) == [user]
    assert await s.job_owner(job) == JobOwner(user, "box")  # written in the same step
    other = attrs.evolve(_submission(user, h.job()), alive_holder="elsewhere")
    got = await s.submit(user, other)
    assert (got.verdict, got.presence) == ("holder", f"{holder}.s1")
    assert (await s.queue_info(user)).length == 1


@check
async def check_submit_without_write_owner_leaves_the_owner_record_alone(
    h: SubstrateHarness,
) -> None:
    """``write_owner`` False (the Bridge: its job ids name their user): queued, and no
    owner record written."""
    s, user, job = h.substrate, h.user(), h.job()
    await s.set_presence(user, "s1", 30)
    sub = attrs.evolve(_submission(user, job), write_owner=False)
    assert (await s.submit(user, sub)).verdict == "queued"
    assert await s.job_owner(job) is None
    assert (await s.queue_info(user)).length == 1


async def _refused(call: Awaitable[Any], message: str) -> None:
    try:
        await call
    except ValueError as exc:
        assert str(exc) == message, str(exc)
    else:
        raise AssertionError(f"accepted what must raise ValueError({message!r})")


@check
async def check_caller_arguments_out_of_range_are_refused_and_their_bounds_accepted(
    h: SubstrateHarness,
) -> None:
    """``submit``: ``start_within_s`` >= 0 (not NaN) and ``maxlen`` >= 1;
    ``read_notifications``: ``block_ms`` >= 0 (0: until one comes) and ``count`` >= 1.
    Beyond: ValueError, nothing written."""
    s, user = h.substrate, h.user()
    await s.set_presence(user, "s1", 30)
    edge = attrs.evolve(_submission(user, h.job()), start_within_s=0.0, maxlen=1)
    assert (await s.submit(user, edge)).verdict == "queued"
    submit_bounds = "submit needs start_within_s >= 0 and maxlen >= 1"
    for bad in ({"start_within_s": -0.001}, {"start_within_s": math.nan}, {"maxlen": 0}):
        sub = attrs.evolve(_submission(user, h.job()), **bad)
        await _refused(s.submit(user, sub), submit_bounds)
    assert (await s.queue_info(user)).length == 1
    box = f"box-{secrets.token_hex(4)}"
    h.on_mailbox(box)
    await s.publish_result(user, "j1", "one", ttl_s=30, notify=box)
    with trio.fail_after(3):
        assert await s.read_notifications(box, count=1, block_ms=0) == [("j1", "one")]
    read_bounds = "read_notifications needs block_ms >= 0 and count >= 1"
    await _refused(s.read_notifications(box, count=0, block_ms=10), read_bounds)
    await _refused(s.read_notifications(box, count=1, block_ms=-1), read_bounds)
