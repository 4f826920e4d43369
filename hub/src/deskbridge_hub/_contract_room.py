"""Contract checks of the queue's bound (see ``_contract``): ``submit`` refuses a job
(``queue_full``) while the user has ``maxlen`` entries not yet acknowledged, writing
nothing, so the stream's ``MAXLEN ~`` trim never has to drop accepted work to make room
(docs/architecture.md, "A full queue refuses new work")."""

from __future__ import annotations

import anyio
import attrs

from ._contract import SubstrateHarness, check
from ._contract_caller import _submission
from ._jobstate import JobState, Stage
from ._substrate import Beat, Submission


def _bounded(user: str, job: str, most: int, *, key: str | None = None) -> Submission:
    return attrs.evolve(_submission(user, job, key=key), maxlen=most)


@check
async def check_submit_refuses_past_maxlen_unacknowledged_and_leaves_nothing(
    h: SubstrateHarness,
) -> None:
    """``maxlen`` entries not yet acknowledged (queued, or read and in flight): the next
    submit answers ``queue_full`` and writes nothing (no state, no idempotency record, no
    owner record, no entry); a retry with the same key once an XACK made room enqueues;
    a retry of an accepted key still attaches (``indexed``: the key is looked at first)."""
    s, user = h.substrate, h.user()
    await s.set_presence(user, "s1", 30)
    jobs = [h.job() for _ in range(3)]
    for i, job in enumerate(jobs):
        got = await s.submit(user, _bounded(user, job, 3, key=f"k{i}"))
        assert got.verdict == "queued", got
    before = None if h.keys_of is None else sorted(await h.keys_of(user))
    late = h.job()
    full = await s.submit(user, _bounded(user, late, 3, key="k3"))
    assert full.verdict == "queue_full", full
    assert await s.get_job_state(user, late) is None
    assert await s.job_owner(late) is None
    assert (await s.queue_info(user)).length == 3
    if h.keys_of is not None:
        assert sorted(await h.keys_of(user)) == before, "a refused submit left keys behind"
    # a retry of an accepted request attaches to its job, full or not
    assert (await s.submit(user, _bounded(user, h.job(), 3, key="k0"))).verdict == "indexed"
    # read (in flight) is not acknowledged: still full
    (first,) = await s.read_new(user, "c1", count=1, block_ms=1)
    assert (await s.submit(user, _bounded(user, late, 3, key="k3"))).verdict == "queue_full"
    assert await s.ack(user, first.entry_id) == 1
    again = await s.submit(user, _bounded(user, late, 3, key="k3"))
    assert again.verdict == "queued", again
    assert await s.job_ids(user, [again.entry_id or ""]) == {again.entry_id: late}


@check
async def check_accepted_entries_are_never_trimmed_to_make_room(h: SubstrateHarness) -> None:
    """With ``maxlen`` 100 (Redis trims ``~``: whole nodes of 100 entries), a desktop
    that reads and acknowledges some while a flood keeps coming: every entry a submit
    accepted keeps its body until it is read (no ``trimmed``), and the acknowledged ones
    are what the trim takes."""
    s, user, most = h.substrate, h.user(), 100
    await s.set_presence(user, "s1", 30)
    accepted: list[str] = []
    refused = 0
    for round_ in range(3):
        for _ in range(most + 20):
            got = await s.submit(user, _bounded(user, h.job(), most))
            if got.verdict == "queued":
                accepted.append(got.entry_id or "")
            else:
                assert got.verdict == "queue_full", got
                refused += 1
        assert await s.trimmed(user) == [], f"round {round_}: an accepted entry was trimmed"
        # the desktop catches up with 90 of them (read, acknowledged)
        for entry in await s.read_new(user, "c1", count=90, block_ms=1):
            assert entry.fields is not None, "an accepted entry lost its body"
            await s.ack(user, entry.entry_id)
    # each round: room for 100, then for the 90 acknowledged; the rest refused
    assert (len(accepted), refused) == (most + 2 * 90, 3 * (most + 20) - most - 2 * 90)
    unread = await s.read_new(user, "c1", count=10 * most, block_ms=1)
    assert len(unread) == most - 90
    assert all(e.fields is not None for e in unread)
    assert (await s.queue_info(user)).length <= 2 * most


@check
async def check_an_entry_deleted_from_the_middle_is_swept_and_frees_its_room(
    h: SubstrateHarness,
) -> None:
    """An operator's XDEL of a queued entry in the middle of the stream (the stream's
    first entry stays): its index record would stay for ever and, as the bound counts
    the index, lower the user's bound for good. A deep beat asks for the sweep, the
    sweep's ``trimmed`` lists it (not an entry a consumer read and was then deleted: its
    reader answers that one), and once it is forgotten the next submit has room.
    Was: only entries older than the stream's first entry were found."""
    s, user, most = h.substrate, h.user(), 4
    await s.set_presence(user, "s1", 30)
    jobs = [h.job() for _ in range(most)]
    ids = [(await s.submit(user, _bounded(user, job, most))).entry_id or "" for job in jobs]
    read = await s.read_new(user, "c1", count=2, block_ms=1)
    assert [e.entry_id for e in read] == ids[:2]
    await h.delete_entry(user, ids[1])  # read, then deleted: its reader's to answer
    await h.delete_entry(user, ids[2])  # queued, deleted from the middle
    assert (await s.submit(user, _bounded(user, h.job(), most))).verdict == "queue_full"
    deep = [Beat(user, "s1", deep=True)]
    (beat,) = await s.heartbeat(deep, ttl_s=30, consumer="c1", reclaim_idle_ms=60_000)
    assert beat.trimmed_due, beat
    assert await s.trimmed(user) == [(ids[2], jobs[2])]
    assert await s.forget(user, ids[2]) is True
    assert await s.trimmed(user) == []
    assert (await s.submit(user, _bounded(user, h.job(), most))).verdict == "queued"


@check
async def check_a_cancel_flag_tells_whether_its_control_entry_was_sent(
    h: SubstrateHarness,
) -> None:
    """Each cancel of a job sends one indexed control entry only while none was sent:
    ``send_cancel`` sets the flag (an existing one keeps its value and TTL), adds the
    entry and marks the flag ``sent`` in one step, so cancels at once write one entry
    between them. A flag set by ``request_cancel`` alone (a withdrawn job's) still gets
    its entry; a marked flag is still a cancel flag (a delivery of the job is refused)."""
    s, user, job = h.substrate, h.user(), h.job()
    await s.request_cancel(user, job, ttl_s=60)
    sent = await s.send_cancel(user, job, ttl_s=60, maxlen=10)
    assert sent is not None
    at_once: list[str | None] = [None] * 4

    async def cancel(i: int) -> None:
        at_once[i] = await s.send_cancel(user, job, ttl_s=60, maxlen=10)

    async with anyio.create_task_group() as tg:
        for i in range(len(at_once)):
            tg.start_soon(cancel, i)
    assert at_once == [None] * 4, at_once
    assert await s.job_ids(user, [sent]) == {sent: job}  # indexed like a job
    state = JobState(Stage.QUEUED, user, at=1.0)
    await s.claim_job(user, job, state, ttl_s=60)
    delivered = state.advance(Stage.DELIVERED, at=2.0)
    marked = await s.mark_delivered(user, job, delivered, ttl_s=60, deadline=None)
    assert marked.verdict == "cancelled", marked
    other = h.job()
    in_a_row = [await s.send_cancel(user, other, ttl_s=60, maxlen=10) for _ in range(3)]
    assert in_a_row[0] is not None and in_a_row[1:] == [None, None]
    fields = [e.fields for e in await s.read_new(user, "c1", count=10, block_ms=None)]
    controls = [f for f in fields if f and f.get("control") == "cancel"]
    assert controls == [
        {"control": "cancel", "job_id": job},
        {"control": "cancel", "job_id": other},
    ], controls
