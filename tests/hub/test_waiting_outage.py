"""A waiting caller rides out a short substrate failure (``_waiting.ResultWaiters``, MockClock):
one connection killed under the process's mailbox read failed the caller reading it at
once while its job completed (a fault-injection helper: 2 of 12 callers, CLIENT KILL of
the BLMPOP); an outage that lasts is still reported within ``FAILURE_PATIENCE_S``."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._waiting import FAILURE_PATIENCE_S, ResultWaiters


class Flaky:
    """The two calls ResultWaiters makes; fails while ``down`` (until ``up_at``)."""

    def __init__(self, up_at: float) -> None:
        self.up_at = up_at
        self.results: dict[str, str] = {}
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if trio.current_time() < self.up_at:
            raise SubstrateUnavailable("Redis at x unavailable (BLMPOP notify): connection lost")

    async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
        self._check()
        await trio.sleep(block_ms / 1000)
        return []

    async def get_result(self, user_id, job_id):  # type: ignore[no-untyped-def]
        self._check()
        return self.results.get(job_id)


async def _wait(substrate: Flaky, *, timeout_s: float) -> str | None:
    """One caller's wait for job ``j1`` of ``u1`` through ``ResultWaiters``."""
    waiters = ResultWaiters(substrate)  # type: ignore[arg-type]
    waiter = waiters.register("u1", "j1")
    try:
        return await waiters.wait(waiter, timeout_s=timeout_s)
    finally:
        waiters.unregister(waiter)


async def test_a_connection_killed_under_the_read_is_ridden_out(autojump_clock):
    start = trio.current_time()
    substrate = Flaky(up_at=start + 0.5)
    substrate.results["j1"] = '{"ok": true}'
    assert await _wait(substrate, timeout_s=30) == '{"ok": true}'
    assert trio.current_time() - start < 1.0  # read again at once once it works
    assert substrate.calls > 2


async def test_an_outage_that_lasts_is_reported_within_the_patience(autojump_clock):
    start = trio.current_time()
    substrate = Flaky(up_at=start + 3600)
    with pytest.raises(SubstrateUnavailable):
        await _wait(substrate, timeout_s=90)
    assert FAILURE_PATIENCE_S <= trio.current_time() - start <= FAILURE_PATIENCE_S + 0.5


async def test_a_mailbox_that_keeps_failing_is_reported_though_the_results_answer(
    autojump_clock,
):
    """Under Cluster the mailbox and the result list may be on different nodes: the
    results answering must not hide a mailbox that keeps failing (a review found the
    waiter then waited its whole timeout, polling both ten times a second)."""

    class MailboxDown(Flaky):
        async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
            self.calls += 1
            raise SubstrateUnavailable("Redis at x unavailable (BLMPOP notify): node down")

        async def get_result(self, user_id, job_id):  # type: ignore[no-untyped-def]
            return None

    start = trio.current_time()
    substrate = MailboxDown(up_at=start + 3600)
    with pytest.raises(SubstrateUnavailable):
        await _wait(substrate, timeout_s=60)
    assert trio.current_time() - start <= FAILURE_PATIENCE_S + 0.5


class Popped:
    """A mailbox whose first read pops every notification, then its reply is lost: an
    error (``cut``) or a read that never returns (the reader's caller gives up and
    cancels it). The payloads are in the result lists (the truth) all along."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut
        self.results = {"j1": "one", "j2": "two"}
        self.reads = 0

    async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.reads == 1:  # popped j1's and j2's notifications; the reply is lost
            await trio.sleep(0.01)
            if self.cut:
                raise SubstrateUnavailable("Redis at x unavailable (BLMPOP notify): cut")
            await trio.sleep_forever()
        await trio.sleep(block_ms / 1000)
        return []

    async def get_result(self, user_id, job_id):  # type: ignore[no-untyped-def]
        return self.results[job_id]


@pytest.mark.parametrize("cut", [True, False], ids=["reply-cut", "reader-cancelled"])
async def test_a_lost_mailbox_read_sends_every_waiter_to_its_result_list(autojump_clock, cut):
    """A mailbox read whose popped notifications were lost (its connection cut, or its
    reader's caller gone) left the *other* waiters of the process to their own next look
    at their result lists, 2 to 10 s later. Now every waiter looks at once."""
    substrate = Popped(cut)
    waiters = ResultWaiters(substrate)  # type: ignore[arg-type]
    answered: dict[str, float] = {}
    start = trio.current_time()

    async def wait(job_id: str, cancel_at_s: float | None = None) -> None:
        waiter = waiters.register("u1", job_id)
        try:
            with trio.move_on_after(cancel_at_s if cancel_at_s is not None else 60):
                payload = await waiters.wait(waiter, timeout_s=60)
                answered[job_id] = trio.current_time() - start
                assert payload == substrate.results[job_id]
        finally:
            waiters.unregister(waiter)

    async with trio.open_nursery() as nursery:
        # j1's waiter reads the mailbox first; without a cut its caller gives up at 5 ms
        nursery.start_soon(wait, "j1", None if cut else 0.005)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "j2")
    assert answered["j2"] < 0.5, answered  # was CHECK_FIRST_S (2 s) or later


async def test_a_reader_whose_wait_ends_lets_its_read_end_first(autojump_clock):
    """A reader's read used to block until the very instant its wait ended, so its
    caller's timeout cut it in flight (what it popped lost, every waiter sent to its
    result list); it now ends ``READ_MARGIN_S`` before, and the wait ends quietly."""

    class Counting(Flaky):
        cut_reads = 0

        async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
            try:
                return await super().read_notifications(mailbox, count=count, block_ms=block_ms)
            except trio.Cancelled:
                self.cut_reads += 1
                raise

    substrate = Counting(up_at=0)
    for timeout_s in (0.3, 1.7, 2.5):
        assert await _wait(substrate, timeout_s=timeout_s) is None
    assert substrate.cut_reads == 0


class Stalled(Flaky):
    """The process stalls (SIGSTOP, a VM paused) during its first mailbox read: that
    read fails once the process runs again, by its own timeout, ``stall_s`` after it
    began; Redis itself answers throughout (``block_s`` each black-holed command takes
    to fail, for the outage case)."""

    def __init__(self, stall_s: float, *, black_hole: bool = False) -> None:
        super().__init__(up_at=0.0)
        self.stall_s = stall_s
        self.black_hole = black_hole
        self.stalled = False

    async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.black_hole or not self.stalled:
            self.stalled = True
            await trio.sleep(self.stall_s)
            raise SubstrateUnavailable("Redis at x unavailable (BLMPOP notify): timed out")
        await trio.sleep(block_ms / 1000)
        return []

    async def get_result(self, user_id, job_id):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.black_hole:
            await trio.sleep(self.stall_s)
            raise SubstrateUnavailable("Redis at x unavailable (LINDEX): timed out")
        return self.results.get(job_id)


async def test_one_read_that_failed_across_a_stall_of_the_process_is_not_an_outage(
    autojump_clock,
):
    """Found by fault injection (a hub worker SIGSTOPped 40 s, a caller waiting in it):
    the mailbox read begun before the stall failed by its own timeout when the process
    ran again, and the patience, counted from when that read began, was already spent:
    the caller was answered 503 ``unavailable`` ("Redis ... BLMPOP timed out") although
    Redis answered throughout and its job's result was there. Now a failure is told only
    once a second read has failed too: the result list, read first, answers."""
    start = trio.current_time()
    substrate = Stalled(stall_s=40.0)

    async def publish() -> None:
        await trio.sleep(30)  # another replica answers the job meanwhile
        substrate.results["j1"] = '{"ok": true}'

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish)
        assert await _wait(substrate, timeout_s=90) == '{"ok": true}'
    assert trio.current_time() - start < 41


async def test_an_outage_where_every_read_hangs_is_told_after_a_second_read_fails(
    autojump_clock,
):
    start = trio.current_time()
    substrate = Stalled(stall_s=5.0, black_hole=True)  # each command: the 5 s timeout
    with pytest.raises(SubstrateUnavailable):
        await _wait(substrate, timeout_s=90)
    assert trio.current_time() - start <= 2 * 5.0 + 0.5
