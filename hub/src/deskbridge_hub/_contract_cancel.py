"""Contract checks of a cancel's reads and write-backs; registered with ``_contract``.

* ``cancel_requested``: the cancel flag read (``Bridge.job_state`` answers a cancelled
  ``queued`` job no live hub process holds, instead of saying ``queued`` until its TTL).
* ``restore_delivery``: the holder of a job in flight writes its delivery back over a
  state a store rewound to ``queued`` (``_cancel_notice``), so that the job's next
  reader knows it was forwarded (it may have run) and never answers it ``cancelled``.

The kind they pin: a terminal answer claimed by someone who cannot know, about work
that may have run."""

from __future__ import annotations

from ._contract import SubstrateHarness, check
from ._jobstate import JobState, Stage


@check
async def check_cancel_requested_reads_the_flag(h: SubstrateHarness) -> None:
    s, user, job, sent = h.substrate, h.user(), h.job(), h.job()
    assert await s.cancel_requested(user, job) is False
    await s.request_cancel(user, job, ttl_s=60)
    assert await s.cancel_requested(user, job) is True
    await s.send_cancel(user, sent, ttl_s=60, maxlen=100)  # the flag says "sent"
    assert await s.cancel_requested(user, sent) is True
    assert await s.cancel_requested(h.user(), job) is False  # another user's job


@check
async def check_restore_delivery_writes_back_only_over_queued(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    queued = JobState(Stage.QUEUED, user, at=1.0, reply_to="box")
    mine = JobState(Stage.DELIVERED, user, at=2.0, session_id="s1", daemon_id="d1")
    # no state (unknown, or gone): nothing is made
    assert await s.restore_delivery(user, job, mine, epoch=3, ttl_s=60) is False
    assert await s.get_job_state(user, job) is None
    # rewound: "queued" and no claim epoch (lost with it): written back, with the epoch
    await s.set_job_state(user, job, queued, ttl_s=60)
    assert await s.restore_delivery(user, job, mine, epoch=3, ttl_s=60) is True
    assert await s.get_job_state(user, job) == mine
    late = JobState(Stage.FINISHED, user, at=3.0)
    assert (await s.finish(user, job, None, late, ttl_s=60, epoch=2)).verdict == "stale"
    # written back once: not "queued" any more, nothing more is written
    other = JobState(Stage.DELIVERED, user, at=4.0, session_id="s2", daemon_id="d2")
    assert await s.restore_delivery(user, job, other, epoch=3, ttl_s=60) is False
    assert await s.get_job_state(user, job) == mine
    # its next reader, the cancel flag set, asks the desktop (never "cancelled"): in
    # doubt, and every earlier delivery went to this desktop, whose ledger answers
    await s.request_cancel(user, job, ttl_s=60)
    again = JobState(Stage.DELIVERED, user, at=5.0, session_id="s3", daemon_id="d1")
    marked = await s.mark_delivered(user, job, again, ttl_s=60)
    assert (marked.verdict, marked.epoch, marked.elsewhere) == ("in_doubt", 4, False)
    # a newer delivery's epoch is stored: an older holder writes nothing back
    newer = h.job()
    await s.set_job_state(user, newer, queued, ttl_s=60)
    for epoch in (1, 2):
        assert (await s.mark_delivered(user, newer, mine, ttl_s=60)).epoch == epoch
    await s.set_job_state(user, newer, queued, ttl_s=60)
    assert await s.restore_delivery(user, newer, mine, epoch=1, ttl_s=60) is False
    assert await s.get_job_state(user, newer) == queued
    assert await s.restore_delivery(user, newer, mine, epoch=2, ttl_s=60) is True
    # answered meanwhile (terminal): a terminal answer is final
    done = h.job()
    await s.set_job_state(user, done, JobState(Stage.CANCELLED, user, at=2.0), ttl_s=60)
    assert await s.restore_delivery(user, done, mine, epoch=1, ttl_s=60) is False
    stored = await s.get_job_state(user, done)
    assert stored is not None and stored.stage is Stage.CANCELLED
