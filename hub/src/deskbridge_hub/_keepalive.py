"""The records of the jobs this hub process is running stay alive while they run.

A job's deadline bounds when it may *start*; once on the desktop it runs until it
answers (a browser task, a long upload). The records the hub relies on meanwhile were
written with lifetimes counted from the delivery or the deadline: the state (result TTL
from the delivery), the claim epoch and the idempotency record (deadline + result TTL),
the owner record of a caller-chosen job id (timeout + result TTL), the cancel flag (a
day + result TTL). A job that ran longer lost them while it ran: ``GET /v1/jobs/{id}``
and ``DELETE`` said 404, the events stream ended with no stage, a retry with the same
key enqueued a second job, and a newer delivery's epoch started at 1 again, so a zombie
delivery's answer passed the fence.

:class:`RunningJobs` is the holder's periodic work for that: every ``ttl_s / KEEP_SHARE``
seconds one ``keep_job`` write per job being served in this process (``PEXPIRE ... GT``
of its records to ``ttl_s``). Its cost is per running job (5 commands every 75 s with
the default 300 s result TTL), nothing per idle desktop. Chosen over riding the
heartbeat (per user, every 30 s: the owner record is in another slot, and a beat's
script would carry every running job's keys 10 times as often) and over refreshing on
the desktop's progress reports (a tool need not report any).

If the process dies, the records last at least ``ttl_s * (1 - 1 / KEEP_SHARE)`` (225 s)
after its last write: longer than the reclaim idle (180 s), after which the next
delivery refreshes them.

A caller-chosen job id's owner record (``bridge:job:{<job id>}``, in the id's slot) is
also kept ``forwarded_keep_s`` (a day + the result TTL) once its job is forwarded
(:meth:`RunningJobs.keep_id`): the mark keeps the job's state that long in the user's
slot, which its script cannot reach, and a holder that dies writes no ``interrupted``
mark, so the record lapsed first and ``GET /v1/jobs/{id}`` said 404 on every replica
while the state was kept. One ``PEXPIRE ... GT`` per forwarded chosen id, sent by this
loop (batched with the others pending, never on the caller's path); nothing for hub-minted
ids. The answer's write sets the record back to the result TTL and marks it answered;
a keep that lands after it keeps nothing (``_redis_finish.KEEP_ID``).
"""

from __future__ import annotations

import logging
from collections import Counter

import attrs
import trio

from ._errors import SubstrateUnavailable
from ._jobstate import forwarded_keep_s
from ._substrate import Substrate

log = logging.getLogger("deskbridge.hub.keepalive")

#: How long to wait before sending again an owner record's keep the store refused.
KEEP_ID_RETRY_S = 1.0

#: Writes per record lifetime: a running job's records are extended every
#: ``ttl_s / KEEP_SHARE`` seconds, so three writes in a row may fail before one lapses.
KEEP_SHARE = 4


@attrs.define(eq=False)
class RunningJobs:
    """The jobs this process's sessions are serving, and the loop that keeps their
    records alive.

    Attributes:
        substrate: where the records are.
        ttl_s: how long each write keeps them (the result TTL), seconds.
    """

    substrate: Substrate
    ttl_s: float
    #: (user id, job id, idempotency key) -> deliveries of it being served here
    _jobs: Counter[tuple[str, str, str | None]] = attrs.field(factory=Counter)
    #: an unexpected failure was logged, and no write has worked since (logged once)
    _failing: bool = attrs.field(default=False, init=False)
    #: chosen job ids forwarded here whose owner record is still to be kept a day
    _ids: set[str] = attrs.field(factory=set, init=False)
    _ids_added: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: as ``_failing``, for the owner records' keeps
    _ids_failing: bool = attrs.field(default=False, init=False)

    def add(self, user_id: str, job_id: str, idempotency_key: str | None) -> None:
        """A delivery of the job is being served here (synchronous)."""
        self._jobs[(user_id, job_id, idempotency_key)] += 1

    def keep_id(self, job_id: str) -> None:
        """A job with a caller-chosen id was forwarded (synchronous): its owner record
        is kept ``forwarded_keep_s`` by the loop, soon and off the caller's path."""
        self._ids.add(job_id)
        self._ids_added.set()

    def discard(self, user_id: str, job_id: str, idempotency_key: str | None) -> None:
        """That delivery ended (answered or not; synchronous)."""
        job = (user_id, job_id, idempotency_key)
        self._jobs[job] -= 1
        if self._jobs[job] <= 0:
            del self._jobs[job]

    def __len__(self) -> int:
        return len(self._jobs)

    async def run(self) -> None:
        """Every ``ttl_s / KEEP_SHARE`` seconds, extend the records of every job served
        then (one ``keep_job`` each), until cancelled. A store that does not answer is
        tried again at the next round (the round stops at the first failure); any other
        error is logged (once until a write works) and the round goes on.

        Cancellation: stops; the records keep what the last write gave them.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_ids)
            await self._keep_running()

    async def _keep_ids(self) -> None:
        """Send the owner records' keeps (``keep_id``) as they come, all pending in one
        write; refused ones are sent again ``KEEP_ID_RETRY_S`` later, while their delivery
        is still served here: an ended delivery's own write covers its record (the
        answer's sets it to the result TTL, the ``interrupted`` one keeps it as long as
        the state), and a keep landing after the answer would take the id a day. So the
        pending ids are never more than the deliveries served here. An unexpected
        failure is logged once until a keep works."""
        while True:
            await self._ids_added.wait()
            self._ids_added = trio.Event()
            served = {job_id for _, job_id, _ in self._jobs}
            ids, self._ids = sorted(self._ids & served), set()
            if not ids:
                continue
            try:
                await self.substrate.keep_job_ids(ids, ttl_s=forwarded_keep_s(self.ttl_s))
            except Exception as exc:  # never ends the loop; the ids are tried again
                if not isinstance(exc, SubstrateUnavailable) and not self._ids_failing:
                    log.exception("keeping chosen job ids' owner records failed; retrying")
                    self._ids_failing = True
                self._ids.update(ids)
                await trio.sleep(KEEP_ID_RETRY_S)
                self._ids_added.set()
            else:
                self._ids_failing = False

    async def _keep_running(self) -> None:
        while True:
            await trio.sleep(self.ttl_s / KEEP_SHARE)
            for user_id, job_id, key in list(self._jobs):
                try:
                    await self.substrate.keep_job(
                        user_id, job_id, ttl_s=self.ttl_s, idempotency_key=key
                    )
                except SubstrateUnavailable as exc:  # the rest would wait as long: next round
                    log.debug("running jobs' records not extended this round: %s", exc)
                    break
                except Exception:  # not an outage (a bug, an unmapped refusal): never
                    # ends the loop, whose nursery is the process reader's
                    if not self._failing:
                        log.exception("keeping job %s's records failed; retrying", job_id)
                    self._failing = True
                else:
                    self._failing = False


__all__ = ["KEEP_SHARE", "RunningJobs"]
