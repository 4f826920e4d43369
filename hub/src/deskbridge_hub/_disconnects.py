"""Watching waiting HTTP calls for their client going away: one service per process
(issue 10, "HTTP adds").

A call waiting over HTTP is cancelled when its client disconnects, as quart-trio does it:
a task reads the request's ASGI ``receive`` until ``http.disconnect``. That task used to
be started for every call, in a nursery of the request's own, and cancelled once the
answer was ready: about 0.34 M of the 4.55 M instructions HTTP added per call (callgrind,
``bench/README.md``), most calls being answered within milliseconds.

Here one :class:`DisconnectWatch` per process (started with the app) takes each waiting
call (:meth:`DisconnectWatch.watch`) and starts its watcher only once the call has waited
``WATCH_AFTER_S``: a call answered sooner costs a dictionary entry, not a task. A client
that goes away is therefore noticed within ``WATCH_AFTER_S`` (its ``http.disconnect``
waits in the request's queue meanwhile), and a call answered before then is answered (the
server drops the answer) and counted as answered, not ``abandoned``. The job runs to its
outcome either way: cancelling a call only stops its wait.

A started watcher is not cancelled when its call is answered: it ends on the
``http.disconnect`` the server sends once the response has been sent (ASGI: ``receive``
then returns it; Hypercorn queues it as the response's last body message goes out), which
costs a task step, where cancelling cost trio's cancellation. A request that ends without
having sent its answer (given up after ``RESPONSE_TIMEOUT``, failed, cancelled) cancels its
started watcher itself: nothing then promises a disconnect. Watchers still running when
the app stops serving are cancelled with the service.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

log = logging.getLogger("deskbridge.hub.http")

#: A call waiting this long (seconds) gets its disconnect watcher; one answered sooner never
#: does (module docstring). Also the longest a client's going away goes unnoticed.
WATCH_AFTER_S = 0.25


class Watch:
    """One waiting call's watch (:meth:`DisconnectWatch.watch`)."""

    __slots__ = ("_call", "_owner", "_receive", "_scope", "_seen")

    def __init__(self, owner: DisconnectWatch, receive: Any, call: trio.CancelScope) -> None:
        self._owner = owner
        self._receive = receive
        self._call: trio.CancelScope | None = call
        self._scope: trio.CancelScope | None = None  # set once its watcher started
        self._seen = False

    async def _run(self) -> None:
        with self._scope:  # type: ignore[union-attr]
            try:
                while (await self._receive())["type"] != "http.disconnect":
                    pass
            except Exception:
                # nothing left to watch: end the call, as the request's nursery did
                log.exception("receiving an HTTP request's messages failed")
            self._seen = True
            if self._call is not None:
                self._call.cancel()

    def answered(self) -> None:
        """The call is over (answered, or failed): a disconnect from now on cancels
        nothing, and a watcher not started yet never starts."""
        self._call = None
        self._owner._pending.pop(self, None)

    def release(self, *, sent: bool) -> None:
        """The request is over. ``sent``: its answer's last body message was sent, so
        the server will send ``http.disconnect`` and a started watcher ends with it;
        otherwise a started watcher is cancelled now."""
        self.answered()
        if not sent and not self._seen and self._scope is not None:
            self._scope.cancel()


class DisconnectWatch:
    """The process's watches of waiting HTTP calls (module docstring).

    Args:
        after_s: how long a call waits before its watcher starts (``WATCH_AFTER_S``).
    """

    def __init__(self, after_s: float = WATCH_AFTER_S) -> None:
        self._after_s = after_s
        self._nursery: trio.Nursery | None = None
        #: calls not watched yet -> when they began waiting (trio clock): oldest first
        self._pending: dict[Watch, float] = {}
        self._wake = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start each call's watcher once it has waited ``after_s``, until cancelled
        (the app stops serving: every watcher left is cancelled with it). Started once
        ready for :meth:`watch`; asleep while no call waits."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    if not self._pending:
                        self._wake = trio.Event()
                        await self._wake.wait()
                        continue
                    await trio.sleep_until(next(iter(self._pending.values())) + self._after_s)
                    self._start_due(nursery, trio.current_time())
        finally:
            self._nursery = None
            self._pending.clear()

    def _start_due(self, nursery: trio.Nursery, now: float) -> None:
        while self._pending:
            watch, began = next(iter(self._pending.items()))
            if began + self._after_s > now:  # the sum sleep_until waited for, not now - after_s
                return
            del self._pending[watch]
            watch._scope = trio.CancelScope()
            nursery.start_soon(watch._run, name="deskbridge_hub.http-disconnect-watcher")

    def watch(self, receive: Any, call: trio.CancelScope) -> Watch:
        """Watch a waiting call: once it has waited ``after_s``, read ``receive`` (an
        ASGI HTTP request's, its body read) in a task of this service until
        ``http.disconnect``, then cancel ``call`` unless the call is over
        (:meth:`Watch.answered`). Never blocks; starts no task now.

        Raises:
            RuntimeError: the service is not running (the app is not serving).
        """
        if self._nursery is None:
            raise RuntimeError("the disconnect watch is not running")
        watch = Watch(self, receive, call)
        self._pending[watch] = trio.current_time()
        if not self._wake.is_set():
            self._wake.set()
        return watch

    def statistics(self) -> tuple[int, int]:
        """(calls waiting for their watcher, watchers running)."""
        running = 0 if self._nursery is None else len(self._nursery.child_tasks)
        return len(self._pending), running


__all__ = ["WATCH_AFTER_S", "DisconnectWatch", "Watch"]
