"""Helpers for the process reader's exact tests (``test_reader_exact.py``,
``test_reader_loops.py``): a scripted substrate that records every call the reader makes
and answers from per-method queues, and a desk (a ``Listener`` whose callbacks record
what the reader did to it)."""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import trio
from deskbridge_common import Timings
from deskbridge_hub._beats import Listener
from deskbridge_hub._reader import ProcessReader
from deskbridge_hub._substrate_values import BeatReply, Claimed, Entry, Pushed
from prometheus_client import REGISTRY

#: Distinct values, so a mixed-up timing shows in the call it reaches.
TIMINGS = Timings(heartbeat_s=30.0, presence_ttl_s=90.0, reclaim_idle_s=180.0, result_ttl_s=300.0)
READER_LOG = "deskbridge.hub.reader"


class Hang:
    """A scripted reply: wait ``seconds`` (forever if None), then answer ``then``."""

    def __init__(self, seconds: float | None = None, then: Any = None) -> None:
        self.seconds, self.then = seconds, then


class Script:
    """The substrate methods the reader calls. Each call is recorded as
    ``(trio time, name, args, kwargs)``; its reply is the next one queued for the method
    in ``replies[name]`` (an exception is raised, a ``Hang`` waits), else the default."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, tuple[Any, ...], dict[str, Any]]] = []
        self.replies: dict[str, deque[Any]] = defaultdict(deque)
        self.done: list[str] = []  # names of the calls that returned or raised
        self.presence: dict[str, str] = {}
        self.history = 0  # ``history_changes()``: failovers the probe saw
        self.wakes_in, self._wakes_out = trio.open_memory_channel[list[str]](100)

    def queue(self, name: str, *replies: Any) -> None:
        self.replies[name].extend(replies)

    def of(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kw) for _, n, args, kw in self.calls if n == name]

    def times(self, name: str) -> list[float]:
        return [t for t, n, _, _ in self.calls if n == name]

    def names(self, *skip: str) -> list[str]:
        return [n for _, n, _, _ in self.calls if n not in skip]

    async def _answer(self, name: str, default: Any, *args: Any, **kw: Any) -> Any:
        self.calls.append((trio.current_time(), name, args, kw))
        await trio.lowlevel.checkpoint()
        queue = self.replies[name]
        reply = queue.popleft() if queue else default
        if isinstance(reply, Hang):
            if reply.seconds is None:
                await trio.sleep_forever()
            await trio.sleep(reply.seconds)
            reply = reply.then
        self.done.append(name)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def history_changes(self) -> int:  # not recorded: looked at every liveness refresh
        return self.history

    async def set_liveness(
        self, holder_id: str, ttl_s: float, *, consumer: str | None = None, max_pending: int = 32
    ) -> bool:
        reply = await self._answer(
            "set_liveness", True, holder_id, ttl_s, consumer=consumer, max_pending=max_pending
        )
        return bool(reply)

    async def clear_liveness(self, holder_id: str) -> None:
        await self._answer("clear_liveness", None, holder_id)

    async def get_presence(self, user_id: str) -> str | None:
        reply = await self._answer("get_presence", self.presence.get(user_id), user_id)
        return reply  # type: ignore[no-any-return]

    async def holder_alive(self, holder_id: str) -> bool:
        return await self._answer("holder_alive", True, holder_id)  # type: ignore[no-any-return]

    async def clear_presence(self, user_id: str, session_id: str) -> bool:
        cleared = self.presence.get(user_id) == session_id
        if cleared:
            del self.presence[user_id]
        return await self._answer("clear_presence", cleared, user_id, session_id)  # type: ignore[no-any-return]

    async def notify_superseded(self, *args: Any, **kw: Any) -> None:
        await self._answer("notify_superseded", None, *args, **kw)

    async def wait_wakes(
        self, holder_id: str, *, timeout_s: float, count: int
    ) -> list[str | Pushed]:
        self.calls.append((trio.current_time(), "wait_wakes", (holder_id,),
                           {"timeout_s": timeout_s, "count": count}))  # fmt: skip
        queue = self.replies["wait_wakes"]
        if queue:
            reply = queue.popleft()
            await trio.lowlevel.checkpoint()
            if isinstance(reply, BaseException):
                raise reply
            return reply  # type: ignore[no-any-return]
        with trio.move_on_after(timeout_s):
            return await self._wakes_out.receive()
        return []

    async def heartbeat(self, beats: Any, **kw: Any) -> list[BeatReply]:
        default = [BeatReply(ours=True) for _ in beats]
        return await self._answer("heartbeat", default, list(beats), **kw)  # type: ignore[no-any-return]

    async def take_over(self, *args: Any, **kw: Any) -> Claimed:
        default = Claimed("0-0", (), (), quiet=True)
        return await self._answer("take_over", default, *args, **kw)  # type: ignore[no-any-return]

    async def read_pending(self, *args: Any, **kw: Any) -> list[Entry]:
        return await self._answer("read_pending", [], *args, **kw)  # type: ignore[no-any-return]

    async def autoclaim(self, *args: Any, **kw: Any) -> Claimed:
        default = Claimed("0-0", (), ())
        return await self._answer("autoclaim", default, *args, **kw)  # type: ignore[no-any-return]

    async def read_new(self, *args: Any, **kw: Any) -> list[Entry]:
        return await self._answer("read_new", [], *args, **kw)  # type: ignore[no-any-return]

    async def read_new_delivered(self, *args: Any, **kw: Any) -> list[Entry]:
        return await self._answer("read_new_delivered", [], *args, **kw)  # type: ignore[no-any-return]


class Desk:
    """One session's ``Listener`` whose callbacks record what the reader asked of it in
    ``events``: ``("dispatch", entry_id)``, ``("deleted", [ids])``, ``("superseded",)``.
    ``capacity`` is read at every call; ``block``, if set, holds every dispatch until it
    is set; ``fail``, if set, is raised by the next dispatch."""

    def __init__(self, user: str = "u1", session: str | None = None, **listener: Any) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.capacity = 8
        self.block: trio.Event | None = None
        self.fail: BaseException | None = None
        self.listener = Listener(
            user,
            session or f"h1.{user}",
            f"[catalogue of {user}]",
            dispatch=self._dispatch,
            on_deleted=self._deleted,
            on_superseded=lambda: self.events.append(("superseded",)),
            capacity=lambda: self.capacity,
            **listener,
        )

    async def _dispatch(self, entry: Entry) -> None:
        self.events.append(("dispatch", entry.entry_id))
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        if self.block is not None:
            await self.block.wait()

    async def _deleted(self, ids: list[str]) -> None:
        self.events.append(("deleted", list(ids)))

    def dispatched(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "dispatch"]


def entries(*ids: str) -> list[Entry]:
    return [Entry(i, {"job_id": f"job-{i}"}) for i in ids]


def make_reader(
    script: Script | None = None, timings: Timings = TIMINGS, **kw: Any
) -> ProcessReader:
    return ProcessReader(
        script or Script(),  # type: ignore[arg-type]
        timings,
        consumer="c1",
        holder_id="h1",
        inflight={},
        **kw,
    )


def attached(reader: ProcessReader, *desks: Desk) -> None:
    """Start ``reader`` (``running``) with ``desks`` attached and nothing due or queued:
    the reads an attach schedules are dropped, so a test sees only what it causes."""
    reader.running = True
    for desk in desks:
        reader.attach(desk.listener)
    reader._due.clear()
    reader._queue.clear()


def recorded(desk: Desk) -> list[Entry]:
    """The entries dispatched to ``desk`` from now on, in order, as the session got them
    (marks included); the desk still records and blocks as before."""
    got: list[Entry] = []
    real = desk.listener.dispatch

    async def dispatch(entry: Entry) -> None:
        got.append(entry)
        await real(entry)

    desk.listener.dispatch = dispatch
    return got


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def lines(caplog: Any, level: int | None = None) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == READER_LOG and (level is None or r.levelno == level)
    ]


def levels(caplog: Any, contains: str) -> list[int]:
    return [
        r.levelno for r in caplog.records if r.name == READER_LOG and contains in r.getMessage()
    ]


__all__ = [
    "READER_LOG",
    "TIMINGS",
    "Desk",
    "Hang",
    "Script",
    "attached",
    "entries",
    "levels",
    "lines",
    "make_reader",
    "recorded",
    "sample",
]
