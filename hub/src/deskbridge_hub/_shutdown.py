"""Graceful shutdown of one hub process (a worker or a pod), and the request tracking
it needs.

On SIGTERM: stop reading new entries, refuse new dispatch requests and sidecar
handshakes with 503, let running jobs and waiting dispatch requests finish within the
grace period, close every sidecar socket with 1012 (service restart) so sidecars
reconnect at once to another replica, then exit. Entries still running when the grace
ends stay pending; the sidecar keeps running them (shielded) and answers their
redelivery from its dedupe cache.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import CLOSE_SERVICE_RESTART

if TYPE_CHECKING:
    from ._process import HubState

log = logging.getLogger("deskbridge.hub.shutdown")


@attrs.define(eq=False)
class Draining:
    """Whether this process is draining, and the dispatch requests waiting in it.

    Attributes:
        active: set once a graceful shutdown began; never cleared.
        requests: dispatch (HTTP) requests waiting in this process right now.
    """

    active: bool = False
    requests: int = 0
    _requests_changed: trio.Event = attrs.field(factory=trio.Event, init=False)

    @contextlib.contextmanager
    def tracking_request(self) -> Iterator[None]:
        """Count a dispatch request waiting in this process, so a graceful shutdown can
        let it get its answer (within the grace) instead of cutting it."""
        self.requests += 1
        try:
            yield
        finally:
            self.requests -= 1
            self._requests_changed.set()
            self._requests_changed = trio.Event()

    async def wait_requests(self) -> None:
        """Return once no dispatch request is waiting in this process."""
        while self.requests:
            await self._requests_changed.wait()


async def drain(state: HubState, grace_s: float) -> None:
    """Stop relaying, wait up to ``grace_s`` seconds for jobs in flight on this
    process's sockets and for dispatch requests waiting in it, close sockets with 1012.

    Args:
        state: the process's hub state (``state.drain.active`` is set and stays set).
        grace_s: seconds running jobs get to finish (``DESKBRIDGE_GRACE_S``, default 20).

    Cancellation: stops waiting; sockets not closed yet stay open.
    """
    state.drain.active = True
    started = trio.current_time()
    sessions = list(state.sessions.values())
    for session in sessions:
        session.stop_reading()
    with trio.move_on_after(grace_s) as scope:
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(session.wait_idle)
            nursery.start_soon(state.drain.wait_requests)
    waited = trio.current_time() - started
    if scope.cancelled_caught:
        log.warning(
            "grace of %.1f s over with jobs still running (they stay pending) and %d "
            "dispatch requests waiting (cut)",
            grace_s,
            state.drain.requests,
        )
    async with trio.open_nursery() as nursery:
        for session in list(state.sessions.values()):
            nursery.start_soon(session.close, CLOSE_SERVICE_RESTART, "hub restarting")
    log.info("drained %d sessions in %.3f s", len(sessions), waited)


async def drain_on_sigterm(
    state: HubState, grace_s: float, exit_process: Callable[[], None]
) -> None:
    """Wait for SIGTERM or SIGINT (Ctrl-C), then :func:`drain` and call ``exit_process``.

    Ctrl-C drains like SIGTERM (sockets closed with 1012, so sidecars reconnect at once,
    not after a back-off); a second signal during the drain exits at once.
    Must run in the main thread's trio run (Hypercorn worker processes do).
    """
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            again = "; Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
            log.info("%s: draining (grace %.1f s)%s", name, grace_s, again)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_exit_on_next_signal, signals, exit_process)
                await drain(state, grace_s)
                nursery.cancel_scope.cancel()
            exit_process()
            return


async def _exit_on_next_signal(
    signals: AsyncIterator[int], exit_process: Callable[[], None]
) -> None:
    async for signum in signals:
        log.warning(
            "%s again: stopping without waiting for running jobs", signal.Signals(signum).name
        )
        exit_process()
        return
