"""Progress reports from a running tool: the :class:`Progress` callback a tool may ask
for, and the per-run state the session turns into ``progress`` frames.

A tool asks for progress by declaring a parameter annotated :class:`Progress` (any name;
it is left out of the tool's schema and never taken from ``args``)::

    @tool
    async def export(folder: str, progress: Progress) -> dict:
        for i, name in enumerate(files):
            ...
            progress(i + 1, total=len(files), message=name)

It works from ``async def`` tools and from sync tools running in a worker thread.

Rate limit: a report only records the latest value (never blocks, never queues). Each
delivery waiting on the run follows that value and sends a ``progress`` frame when it
changed, at most one every ``PROGRESS_INTERVAL_S``; intermediate values are coalesced. So a
tool reporting in a tight loop costs at most a few small frames a second, and those go
through the writer like every other frame, never ahead of or in place of a ``status``
answer or a ``pong``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import attrs
import trio
from deskbridge_common import MAX_PROGRESS_MESSAGE_CHARS, replace_lone_surrogates

#: Least time between two ``progress`` frames for one delivery, seconds (5 a second).
PROGRESS_INTERVAL_S = 0.2


@attrs.frozen
class ProgressUpdate:
    """One progress report: ``progress`` so far, ``total`` when known, ``message``, and
    the run's ``stage`` on the desktop once one was set (``progress.stage`` on the wire)."""

    progress: float
    total: float | None = None
    message: str | None = None
    stage: str | None = None


@attrs.define(eq=False)
class ProgressState:
    """The latest report of one run, and a way to wait for the next.

    Attributes:
        stage: the run's stage on the desktop (``deskbridge_common.DESK_STAGES``) once
            :meth:`set_stage` set one, else None. Sticky: every later report carries it,
            so coalescing never hides a stage change from the hub.
    """

    latest: ProgressUpdate | None = None
    version: int = 0
    stage: str | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def set_stage(self, stage: str, message: str) -> None:
        """Enter ``stage`` (``awaiting_approval``, ``running``): a report of it now."""
        self.stage = stage
        self.set(ProgressUpdate(0.0, None, message))

    def set(self, update: ProgressUpdate) -> None:
        """Record ``update`` (from the trio thread), with the run's stage if it has one."""
        if self.stage is not None:
            update = attrs.evolve(update, stage=self.stage)
        self.latest = update
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def follow(
        self,
        send: Callable[[ProgressUpdate], Awaitable[None]],
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        """Call ``send`` with each new latest value, at most once per ``interval_s``;
        runs until cancelled."""
        seen = 0
        while True:
            if self.version == seen:
                await self._changed.wait()
                continue
            seen = self.version
            assert self.latest is not None
            await send(self.latest)
            await trio.sleep(interval_s)


class Progress:
    """The callback a tool receives: ``progress(progress, total=None, message=None)``:
    how far it has got and, when known, out of how much (any unit, the same for both:
    items, bytes, percent), and a short message (cut to 1024 characters; a lone surrogate
    in it replaced by U+FFFD).

    Raises (when called):
        ValueError: ``progress`` or ``total`` not a finite number, or a negative ``total``.
    """

    def __init__(
        self, state: ProgressState | None = None, token: trio.lowlevel.TrioToken | None = None
    ):
        self._state = state
        self._token = token

    @classmethod
    def discard(cls) -> Progress:
        """A callback that records nothing (a tool called outside a session)."""
        return cls(None, None)

    def __call__(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        for name, value in (("progress", progress), ("total", total)):
            if value is None and name == "total":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total!r}")
        if message is not None:
            message = replace_lone_surrogates(str(message)[:MAX_PROGRESS_MESSAGE_CHARS])
        update = ProgressUpdate(float(progress), None if total is None else float(total), message)
        if self._state is None:
            return
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # a sync tool's worker thread
            if self._token is not None:
                trio.from_thread.run_sync(self._state.set, update, trio_token=self._token)
            return
        self._state.set(update)


__all__ = ["PROGRESS_INTERVAL_S", "Progress", "ProgressState", "ProgressUpdate"]
