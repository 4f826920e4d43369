"""Callers waiting for results without a Redis connection each (issue 10 item 3).

One hub process has one notification mailbox (``bridge:notify:{<mailbox>}``, a Redis
list): the holder that publishes a job's result pushes ``<job_id> <payload>`` onto the
mailbox its caller named (``reply_to``), in the same write as the result itself. In the
process, exactly one waiting caller at a time reads the mailbox (``BLMPOP``, up to
``READ_BLOCK_S``) and hands each payload to whoever waits for that job; when the reader's
own answer arrives, or it stops waiting, it hands the reading over to another waiter.
So N concurrent callers in a process hold one blocking read between them, not N, and
nothing needs a background task (the public ``Bridge`` stays a plain object that works
under trio and asyncio).

The mailbox is a notification, the result list is the truth: a notification lost (the
reader cancelled mid-read, a process restarted) costs latency, never an answer. A read
that ended without its reply (an error, or cancelled in flight) may have popped other
waiters' notifications, so every waiter of the process then looks at its result list at
once (they waited 2-10 s for their own next look). Every
waiter also reads its job's result list itself (``LINDEX``, nothing popped) on a growing
interval (``CHECK_FIRST_S`` doubling to ``CHECK_MAX_S``) and once more when its time is
up; a waiter that attached to another caller's job (an idempotency-key retry, maybe on
another replica, whose holder notifies the original caller's mailbox) checks on a
shorter schedule (``ATTACHED_CHECK_FIRST_S`` growing to ``ATTACHED_CHECK_MAX_S``).
"""

from __future__ import annotations

import logging
import math
import uuid

import anyio
import attrs

from ._errors import SubstrateUnavailable
from ._substrate import Substrate

log = logging.getLogger("deskbridge.hub.waiting")

#: Longest single mailbox read, seconds: bounds how long a reader that has stopped
#: waiting can keep others from reading (it hands over on return).
READ_BLOCK_S = 1.0
#: A reader's read ends this long, seconds, before its own wait does: a read cut off by
#: its caller's timeout may have popped other waiters' notifications, and would send
#: every waiter of the process to its result list (the last READ_MARGIN_S of its wait,
#: the waiter reads nothing; its final look at its result list is the truth).
READ_MARGIN_S = 0.05
#: Most notifications taken per read.
READ_COUNT = 256
#: A waiter's own check of its result list: first after this many seconds, then doubling
#: up to ``CHECK_MAX_S`` (only matters when a notification was lost).
CHECK_FIRST_S = 2.0
CHECK_MAX_S = 10.0
#: The same for a waiter attached to another caller's job (nobody notifies it): a retry
#: after a pod kill or a cut, whose answer often comes a second or two later with the
#: redelivery; at most 4 LINDEX a second per attached waiter (they are few: retries), and
#: the answer reaches it within 0.25 s (the soak measured 1 s steps costing 0.5 s a retry).
ATTACHED_CHECK_FIRST_S = 0.05
ATTACHED_CHECK_MAX_S = 0.25
#: A waiter rides out substrate failures for this long, seconds, retrying every
#: ``FAILURE_RETRY_S``, before it reports the outage: one connection killed under the
#: mailbox read (a proxy's idle cut, CLIENT KILL) failed the caller at once while its
#: job completed; an outage that lasts is still told within seconds, with the job's id.
#: At least two reads in a row must have failed: one read that took longer than this to
#: fail by itself (it began before a stall of this process: SIGSTOP, a paused VM) is not
#: an outage; where every command hangs, it is told after two command timeouts.
FAILURE_PATIENCE_S = 2.0
FAILURE_RETRY_S = 0.1


@attrs.define(eq=False)
class Waiter:
    """One caller waiting for one job's first result payload."""

    user_id: str
    job_id: str
    payload: str | None = None
    wake: anyio.Event = attrs.Factory(anyio.Event)
    #: until when (``anyio.current_time()``) it may read the mailbox: its wait's end less
    #: ``READ_MARGIN_S`` (-inf while not in :meth:`ResultWaiters.wait`)
    reads_until: float = -math.inf


@attrs.define(eq=False)
class ResultWaiters:
    """The waiting callers of one process, and its mailbox.

    Attributes:
        substrate: where results and the mailbox live.
        mailbox: this process's mailbox name (a fresh UUID per object).
    """

    substrate: Substrate
    mailbox: str = attrs.Factory(lambda: uuid.uuid4().hex)
    _waiting: dict[str, list[Waiter]] = attrs.Factory(dict)
    _reader: Waiter | None = None
    #: Mailbox reads that ended without their reply (an error, or cancelled in flight):
    #: each may have popped other waiters' notifications, so every waiter looks at its
    #: result list when this changes.
    _lost_reads: int = 0
    _read_failing: bool = False

    def register(self, user_id: str, job_id: str) -> Waiter:
        """Start listening for ``job_id`` (before it is enqueued, so no answer can be
        missed); pair with :meth:`unregister`."""
        waiter = Waiter(user_id, job_id)
        self._waiting.setdefault(job_id, []).append(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        """Stop listening; if this waiter was reading, another one takes over."""
        waiters = self._waiting.get(waiter.job_id)
        if waiters is not None:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                del self._waiting[waiter.job_id]
        if self._reader is waiter:
            self._reader = None
            self._hand_over()

    def statistics(self) -> dict[str, int]:
        """``{"waiting": <callers>, "jobs": <distinct jobs>}``."""
        return {"waiting": sum(map(len, self._waiting.values())), "jobs": len(self._waiting)}

    async def wait(self, waiter: Waiter, *, timeout_s: float, attached: bool = False) -> str | None:
        """Wait up to ``timeout_s`` seconds for the job's first result payload.

        Args:
            waiter: from :meth:`register`.
            timeout_s: seconds (> 0).
            attached: the job belongs to another call (an idempotency-key retry): its
                result list is read first and then on the short schedule.

        Returns:
            The payload, or None if there was none when the time was up.

        Raises:
            SubstrateUnavailable: Redis unreachable (reading the mailbox or the result
                list failed for ``FAILURE_PATIENCE_S`` in a row, or when the time was up).

        Cancellation: stops waiting; a read of the mailbox in progress is abandoned
        (its connection closed) and another waiter takes the reading over.
        """
        first, most = (
            (ATTACHED_CHECK_FIRST_S, ATTACHED_CHECK_MAX_S)
            if attached
            else (CHECK_FIRST_S, CHECK_MAX_S)
        )
        deadline = anyio.current_time() + timeout_s
        read_until = waiter.reads_until = deadline - READ_MARGIN_S
        interval = first
        next_check = anyio.current_time() + (0.0 if attached else first)
        # When each of the two reads began failing in a row (the mailbox and the result
        # list may be on different Cluster nodes: one's success says nothing of the other)
        # and how many reads failed in those streaks: one read alone is never an outage.
        failing: dict[str, float] = {}
        strikes: dict[str, int] = {}
        lost_reads = self._lost_reads
        try:
            with anyio.move_on_after(timeout_s):
                while waiter.payload is None:
                    now = anyio.current_time()
                    if self._lost_reads != lost_reads:  # its notification may be gone
                        lost_reads = self._lost_reads
                        next_check = min(next_check, now)
                    what = "result" if now >= next_check else "mailbox"
                    try:
                        if what == "result":
                            payload = await self.substrate.get_result(waiter.user_id, waiter.job_id)
                            failing.pop(what, None)
                            strikes.pop(what, None)
                            if payload is not None:
                                return payload
                            interval = min(interval * 2, most)
                            next_check = anyio.current_time() + interval
                            continue
                        if self._reader is None and now < read_until:
                            await self._read_once(waiter, until=min(next_check, read_until))
                            failing.pop(what, None)
                            strikes.pop(what, None)
                            continue
                        if self._reader is None:  # it reads no more: another one does
                            self._hand_over()
                    except SubstrateUnavailable:
                        since = failing.setdefault(what, now)
                        strikes[what] = strikes.get(what, 0) + 1
                        # A second failed read too: one read that failed by its own
                        # timeout across a stall of this process (SIGSTOP, a paused VM)
                        # had spent the patience alone, while Redis answered throughout.
                        if (
                            anyio.current_time() - since >= FAILURE_PATIENCE_S
                            and sum(strikes.values()) >= 2
                        ):
                            raise
                        await anyio.sleep(FAILURE_RETRY_S)
                        if what == "mailbox":  # the result list is the truth: look at it
                            next_check = min(next_check, anyio.current_time())
                        continue
                    with anyio.move_on_after(next_check - now):
                        await waiter.wake.wait()
                    if waiter.wake.is_set():
                        waiter.wake = anyio.Event()
                return waiter.payload
            # Time is up: the result list is the truth, a notification may have been lost.
            if waiter.payload is not None:
                return waiter.payload
            return await self.substrate.get_result(waiter.user_id, waiter.job_id)
        finally:
            waiter.reads_until = -math.inf
            if self._reader is waiter:
                self._reader = None
            # (the reader's own read has ended, ``_read_once`` cleared it: leaving
            # without its answer, it hands the reading over too, as after its last read)
            self._hand_over()

    async def _read_once(self, waiter: Waiter, *, until: float) -> None:
        """Read the mailbox once as this process's reader, for at most ``READ_BLOCK_S``
        (and not past ``until``), and deliver what came."""
        self._reader = waiter
        try:
            block_s = min(READ_BLOCK_S, max(until - anyio.current_time(), 0.001))
            items = await self.substrate.read_notifications(
                self.mailbox, count=READ_COUNT, block_ms=max(1, math.ceil(block_s * 1000))
            )
        except anyio.get_cancelled_exc_class():  # cancelled in flight: what it popped is lost
            self._read_lost()
            raise
        except BaseException:
            # The first failure in a row may have lost a reply; the next ones (an outage:
            # the reader retries every FAILURE_RETRY_S) pop nothing: no need to wake all.
            if not self._read_failing:
                self._read_lost()
            self._read_failing = True
            raise
        finally:
            self._reader = None
        self._read_failing = False
        self._deliver(items)
        if waiter.payload is not None:
            self._hand_over()

    def _deliver(self, items: list[tuple[str, str]]) -> None:
        for job_id, payload in items:
            for w in self._waiting.get(job_id, ()):
                if w.payload is None:
                    w.payload = payload
                    w.wake.set()

    def _read_lost(self) -> None:
        self._lost_reads += 1
        for waiters in self._waiting.values():
            for w in waiters:
                if w.payload is None:
                    w.wake.set()

    def _hand_over(self) -> None:
        """Wake one waiter still without its answer that may still read (not in its
        last ``READ_MARGIN_S``) so it becomes the reader."""
        if self._reader is not None:
            return
        now = anyio.current_time()
        for waiters in self._waiting.values():
            for w in waiters:
                if w.payload is None and w.reads_until > now:
                    w.wake.set()
                    return
