"""The mailbox reading is handed over when its reader stops reading without its own
answer (``_waiting.ResultWaiters``, MockClock): a reader whose wait ended (its caller's
timeout) left the process's mailbox unread, and the other waiters found their answers
only at their own next look at their result lists, up to ``CHECK_MAX_S`` (10 s) later
(found by review: the hand-over in ``wait``'s ``finally`` never ran, ``_read_once`` had
cleared the reader already)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub._waiting import ResultWaiters


class Mailbox:
    """The two calls ResultWaiters makes, on one in-process mailbox."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.results: dict[str, str] = {}
        self._changed = trio.Event()

    async def read_notifications(self, mailbox, *, count, block_ms):  # type: ignore[no-untyped-def]
        with trio.move_on_after(block_ms / 1000):
            while not self.items:
                await self._changed.wait()
        out, self.items = self.items[:count], self.items[count:]
        await trio.lowlevel.checkpoint()
        return out

    async def get_result(self, user_id, job_id):  # type: ignore[no-untyped-def]
        await trio.lowlevel.checkpoint()
        return self.results.get(job_id)

    def publish(self, job_id: str, payload: str) -> None:
        self.results[job_id] = payload
        self.items.append((job_id, payload))
        self._changed.set()
        self._changed = trio.Event()


async def test_a_reader_whose_wait_ends_without_its_answer_hands_the_reading_over(
    autojump_clock,
):
    mailbox = Mailbox()
    waiters = ResultWaiters(mailbox)  # type: ignore[arg-type]
    got: dict[str, tuple[str | None, float]] = {}

    async def wait(job_id: str, timeout_s: float) -> None:
        waiter = waiters.register("u1", job_id)
        try:
            payload = await waiters.wait(waiter, timeout_s=timeout_s)
        finally:
            waiters.unregister(waiter)
        got[job_id] = (payload, trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "short", 15.0)  # the reader: its answer never comes
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.5)
        nursery.start_soon(wait, "long", 60.0)  # waits while "short" reads
        await trio.sleep(16.0 - (trio.current_time() - start))
        assert got["short"] == (None, start + 15.0)
        mailbox.publish("long", '{"ok": true}')
        published = trio.current_time()
    payload, at = got["long"]
    assert payload == '{"ok": true}'
    # read from the mailbox at once (was: at its own next look, 8.5 s later)
    assert at - published < 0.1, at - published
