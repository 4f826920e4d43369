"""Run asyncio coroutines from trio: one dedicated thread with its own asyncio loop.

Playwright's Python API is asyncio (or greenlet-based sync, bound to one thread); the
sidecar is trio. The browser toolset therefore owns one thread running an asyncio event
loop, and every browser operation is a coroutine submitted to it with
:meth:`AsyncioHost.run`. One thread, one loop: operations on the browser are serialised
by construction (and by the daemon's tool lock before that).

Cancellation crosses over: cancelling the trio task that awaits :meth:`AsyncioHost.run`
cancels the asyncio task (``Future.cancel`` via ``run_coroutine_threadsafe``), then waits
(shielded, at most ``CANCEL_GRACE_S``) for it to unwind, so a cancelled browser tool does
not leave a half-finished operation running into the next one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

T = TypeVar("T")

#: How long a cancelled operation may take to unwind in the asyncio thread, seconds.
CANCEL_GRACE_S = 5.0


class AsyncioHost:
    """A thread running an asyncio event loop, started on first use.

    Args:
        name: the thread's name (shows in stack dumps).
    """

    def __init__(self, name: str = "deskbridge-asyncio"):
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.close()

                self._thread = threading.Thread(target=main, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run ``fn(*args)`` (a coroutine function) on the asyncio loop; return its value.

        Raises:
            Whatever ``fn`` raises.
            trio.Cancelled: the asyncio task was cancelled too (and given
                ``CANCEL_GRACE_S`` to unwind).
        """
        loop = self._ensure_started()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(fn(*args), loop)
        future.add_done_callback(lambda _: token.run_sync_soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            future.cancel()
            with trio.move_on_after(CANCEL_GRACE_S) as grace:
                grace.shield = True
                await done.wait()
            raise
        return future.result()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and join the thread (from any thread but the loop's)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)

    def run_sync(
        self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, timeout_s: float = 30.0
    ) -> T:
        """Run ``fn(*args)`` on the loop from a thread that is not trio's (shutdown paths)."""
        loop = self._ensure_started()
        return asyncio.run_coroutine_threadsafe(fn(*args), loop).result(timeout_s)


__all__ = ["AsyncioHost"]
