"""``_disconnects.DisconnectWatch``: each waiting HTTP call's watcher starts only once the
call has waited ``after_s``, in one service per process; on the mock clock."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing
from deskbridge_hub._disconnects import DisconnectWatch

AFTER_S = 0.25


class Client:
    """A request's ``receive`` as the server gives it: messages pushed by the test."""

    def __init__(self) -> None:
        self.push, self._pull = trio.open_memory_channel[dict](10)
        self.reads: list[float] = []  # when ``receive`` was called (trio clock)
        self.cancelled = 0

    async def receive(self) -> dict:
        self.reads.append(trio.current_time())
        try:
            return await self._pull.receive()
        except trio.Cancelled:
            self.cancelled += 1
            raise

    def disconnect(self) -> None:
        self.push.send_nowait({"type": "http.disconnect"})


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[DisconnectWatch]:
    watch = DisconnectWatch(AFTER_S)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        yield watch
        nursery.cancel_scope.cancel()


async def test_a_call_is_watched_once_it_has_waited_after_s(autojump_clock):
    async with running() as service:
        client, call = Client(), trio.CancelScope()
        began = trio.current_time()
        service.watch(client.receive, call)
        await trio.sleep(AFTER_S / 2)
        assert client.reads == [] and service.statistics() == (1, 0)
        await trio.sleep(AFTER_S)
        assert client.reads == [pytest.approx(began + AFTER_S)]
        assert service.statistics() == (0, 1)


async def test_calls_are_watched_in_the_order_they_began(autojump_clock):
    async with running() as service:
        clients = [Client() for _ in range(3)]
        began = []
        for client in clients:
            began.append(trio.current_time())
            service.watch(client.receive, trio.CancelScope())
            await trio.sleep(0.1)
        await trio.sleep(1)
        assert [c.reads for c in clients] == [[pytest.approx(b + AFTER_S)] for b in began]


async def test_a_call_answered_first_is_never_watched(autojump_clock):
    async with running() as service:
        client = Client()
        watch = service.watch(client.receive, trio.CancelScope())
        await trio.sleep(AFTER_S / 2)
        watch.answered()
        watch.release(sent=True)
        await trio.sleep(10 * AFTER_S)
        assert client.reads == [] and service.statistics() == (0, 0)


async def test_a_disconnect_cancels_the_call_once_watched(autojump_clock):
    async with running() as service:
        client = Client()
        client.disconnect()  # gone before the watch starts: waits in the request's queue
        with trio.CancelScope() as call:
            service.watch(client.receive, call)
            await trio.sleep_forever()
        assert call.cancelled_caught
        assert trio.current_time() == pytest.approx(AFTER_S)
        await trio.testing.wait_all_tasks_blocked()
        assert service.statistics() == (0, 0)


async def test_a_disconnect_after_the_answer_cancels_nothing(autojump_clock):
    async with running() as service:
        client, call = Client(), trio.CancelScope()
        watch = service.watch(client.receive, call)
        await trio.sleep(2 * AFTER_S)
        watch.answered()
        client.disconnect()  # the server's, after the response
        watch.release(sent=True)
        await trio.testing.wait_all_tasks_blocked()
        assert not call.cancel_called
        assert client.cancelled == 0 and service.statistics() == (0, 0)


async def test_a_request_ended_unanswered_cancels_its_started_watcher(autojump_clock):
    async with running() as service:
        client = Client()
        watch = service.watch(client.receive, trio.CancelScope())
        await trio.sleep(2 * AFTER_S)
        watch.answered()
        watch.release(sent=False)  # no disconnect is promised: nothing was sent
        await trio.testing.wait_all_tasks_blocked()
        assert client.cancelled == 1 and service.statistics() == (0, 0)


async def test_stopping_cancels_the_watchers_and_forgets_the_waiting(autojump_clock):
    watch = DisconnectWatch(AFTER_S)
    started, waiting = Client(), Client()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        watch.watch(started.receive, trio.CancelScope())
        await trio.sleep(2 * AFTER_S)
        watch.watch(waiting.receive, trio.CancelScope())
        nursery.cancel_scope.cancel()
    assert started.cancelled == 1 and waiting.reads == []
    assert watch.statistics() == (0, 0)
    with pytest.raises(RuntimeError):
        watch.watch(Client().receive, trio.CancelScope())


async def test_the_service_sleeps_while_no_call_waits(autojump_clock):
    """No periodic wake-up: an idle hub spends nothing on it."""
    async with running() as service:
        steps: list[trio.lowlevel.Task] = []

        class Steps(trio.abc.Instrument):
            def before_task_step(self, task: trio.lowlevel.Task) -> None:
                steps.append(task)

        watch = service.watch(Client().receive, trio.CancelScope())
        watch.answered()
        await trio.sleep(2 * AFTER_S)  # the service wakes once, at the call's due time
        trio.lowlevel.add_instrument(Steps())
        await trio.sleep(3600)
        mine = trio.lowlevel.current_task()
        assert [t for t in steps if t is not mine] == []
