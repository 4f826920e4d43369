"""Graceful shutdown of one hub process (a worker or a pod), and the request tracking
it needs.

On SIGTERM: stop reading new entries, refuse new dispatch requests and sidecar
handshakes with 503, let running jobs and waiting dispatch requests finish within the
grace period, close every sidecar socket with 1012 (service restart) so sidecars
reconnect at once to another replica, then exit. Entries still running when the grace
ends stay pending; the sidecar keeps running them (shielded) and answers their
redelivery from its dedupe cache. Dispatch calls (HTTP, MCP) still waiting in this
process when the grace ends are *released* (:meth:`Draining.release_calls`): each route
answers its caller 503 ``unavailable`` naming the job and its stage (the hub restarted;
the job may still run), and the drain waits up to ``ANSWER_WAIT_S`` for those answers to
be written before it closes the sockets and the process exits.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import CLOSE_SERVICE_RESTART

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.synchronize import Event

    from ._process import HubState

log = logging.getLogger("deskbridge.hub.shutdown")

#: Longest wait, once the grace is over, for the answers of the released calls to be
#: written (their routes look the job's stage up, bounded by ``STAGE_LOOKUP_S``).
ANSWER_WAIT_S = 2.0
#: Longest look-up of a released call's job stage; past it the stage is "unknown".
STAGE_LOOKUP_S = 0.5
#: Slack, seconds, past the drain's own bound (grace + ``ANSWER_WAIT_S`` + the timings'
#: ``close_timeout_s``) before the process exits with the drain unfinished.
OVERDUE_MARGIN_S = 1.0


@attrs.define(eq=False)
class WaitingCall:
    """A dispatch call (HTTP or MCP) waiting in this process for its outcome.

    Attributes:
        scope: cancelled when the call is released (the grace ended while it waited).
        released: set then; the route answers ``restarting_answer`` instead.
        job_id: the job the call named, once released (``_metrics.timed_dispatch`` sets
            it; None if the call was released before it chose one).
        elapsed_s: how long the call had waited when released.
        tool_known: its tool was found in the user's catalogue (its metrics label).
    """

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    released: bool = False
    job_id: str | None = None
    elapsed_s: float = 0.0
    tool_known: bool = False

    def release(self) -> None:
        self.released = True
        self.scope.cancel()


#: The waiting call of the running task, if a route registered one (``Draining.waiting``):
#: ``_metrics.timed_dispatch`` tells a released call (answered by its route) from one
#: whose caller went away (abandoned).
current_call: contextvars.ContextVar[WaitingCall | None] = contextvars.ContextVar(
    "deskbridge_waiting_call", default=None
)


@attrs.define(eq=False)
class Draining:
    """Whether this process is draining, and the dispatch requests waiting in it.

    Attributes:
        active: set once a graceful shutdown began; never cleared.
        requests: dispatch (HTTP) requests waiting in this process right now.
        released: set once the grace ended: waiting calls are released, and a call
            registered from then on is released at once.
    """

    active: bool = False
    requests: int = 0
    released: bool = False
    _requests_changed: trio.Event | None = attrs.field(default=None, init=False)
    _calls: set[WaitingCall] = attrs.field(factory=set, init=False)

    def waiting(self) -> _Waiting:
        """Run a dispatch call's wait in this block (``with drain.waiting() as call``):
        when the grace ends while it waits, the block is left (cancelled) with
        ``call.released`` set, and the route answers its caller ``restarting_answer``
        (the process is about to exit). ``call.scope`` is the block's cancel scope."""
        return _Waiting(self)

    def release_calls(self) -> int:
        """Release every waiting call (the grace is over); returns how many."""
        self.released = True
        calls = list(self._calls)
        for call in calls:
            call.release()
        return len(calls)

    def tracking_request(self) -> _Tracking:
        """Count a dispatch request waiting in this process for the block, so a graceful
        shutdown can let it get its answer (within the grace) instead of cutting it."""
        return _Tracking(self)

    async def wait_requests(self) -> None:
        """Return once no dispatch request is waiting in this process."""
        while self.requests:
            if self._requests_changed is None:
                self._requests_changed = trio.Event()
            await self._requests_changed.wait()

    def _request_ended(self) -> None:
        self.requests -= 1
        if self._requests_changed is not None:  # someone waits (nobody, but in a drain)
            self._requests_changed.set()
            self._requests_changed = None


# The blocks of ``Draining`` as classes, not ``contextlib.contextmanager`` generators: they
# wrap every dispatch request, and a generator's set-up and its StopIteration cost more
# than the block's own work (issue 10, "HTTP adds").


class _Waiting:
    __slots__ = ("_call", "_drain", "_token")

    def __init__(self, drain: Draining) -> None:
        self._drain = drain
        self._call = WaitingCall()

    def __enter__(self) -> WaitingCall:
        call = self._call
        if self._drain.released:
            call.release()
        self._drain._calls.add(call)
        self._token = current_call.set(call)
        call.scope.__enter__()
        return call

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return self._call.scope.__exit__(kind, exc, tb)
        finally:
            current_call.reset(self._token)
            self._drain._calls.discard(self._call)


class _Tracking:
    __slots__ = ("_drain",)

    def __init__(self, drain: Draining) -> None:
        self._drain = drain

    def __enter__(self) -> None:
        self._drain.requests += 1

    def __exit__(self, *exc: object) -> None:
        self._drain._request_ended()


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
    released = state.drain.release_calls()  # also any call registered from now on
    if scope.cancelled_caught:
        log.warning(
            "grace of %.1f s over with jobs still running (they stay pending) and %d "
            "dispatch calls waiting (answered unavailable: the hub restarted)",
            grace_s,
            released,
        )
    if released:
        # let the routes write those answers (bounded: the process exits next)
        with trio.move_on_after(ANSWER_WAIT_S):
            await state.drain.wait_requests()
    async with trio.open_nursery() as nursery:
        for session in list(state.sessions.values()):
            nursery.start_soon(session.close, CLOSE_SERVICE_RESTART, "hub restarting")
    log.info("drained %d sessions in %.3f s", len(sessions), waited)


_supervisor_pipe: Connection[bytes, bytes] | None = None
"""The read end of the supervisor's requests when this process is one of
``serve --workers N``'s workers (``_supervisor.worker_main`` sets it); None otherwise."""


_serving: Event | None = None
"""Set once this worker serves, so the supervisor tells a crash (replace it) from a
failure to start (stop); None when not supervised."""


def supervised_by(pipe: Connection[bytes, bytes], serving: Event | None = None) -> None:
    """Mark this process as a supervised worker: :func:`drain_on_sigterm` also takes
    the supervisor's requests (``drain SIGNAME`` / ``stop SIGNAME`` lines) from ``pipe``,
    and :func:`announce_serving` sets ``serving``."""
    global _supervisor_pipe, _serving
    _supervisor_pipe, _serving = pipe, serving


def announce_serving() -> None:
    """Tell the supervisor, if any, that this worker serves: an abnormal exit from now on
    is a crash to recover from (``_supervisor.Restarts``), not a failure to start."""
    if _serving is not None:
        _serving.set()


@attrs.frozen
class _Request:
    """A request to stop: a signal to this process, or a line from the supervisor."""

    kind: str  # "signal", "drain", "stop" or "gone" (the supervisor's pipe ended)
    name: str  # the signal's name (SIGTERM, SIGINT), or what the supervisor said


async def drain_on_sigterm(
    state: HubState, grace_s: float, exit_process: Callable[[], None]
) -> None:
    """Wait for SIGTERM or SIGINT (Ctrl-C), or the supervisor's request to drain, then
    :func:`drain` and call ``exit_process``.

    Ctrl-C drains like SIGTERM (sockets closed with 1012, so sidecars reconnect at once,
    not after a back-off). One operator action is one drain: a Ctrl-C to the process
    group of ``serve --workers N`` reaches this worker both as its own SIGINT and as the
    supervisor's ``drain``; that is one request, not two. A second *signal* to this
    process, or the supervisor's ``stop`` (it got a second signal), exits at once. The
    drain has its own bound (``grace_s`` + ``ANSWER_WAIT_S`` + the timings'
    ``close_timeout_s`` + ``OVERDUE_MARGIN_S``): past it the process exits, drained or not.
    Must run in the main thread's trio run (Hypercorn worker processes do).
    """
    send, receive = trio.open_memory_channel[_Request](math.inf)
    with _bare_cancel(), trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as watchers:
            watchers.start_soon(_pass_signals, signals, send.clone())
            if _supervisor_pipe is not None:
                watchers.start_soon(_pass_supervisor, _supervisor_pipe, send.clone())
            first = await receive.receive()
            if first.kind == "signal":
                again = "; Ctrl-C again to stop at once" if first.name == "SIGINT" else ""
                log.info("%s: draining (grace %.1f s)%s", first.name, grace_s, again)
            elif first.kind == "gone":
                log.warning("the supervisor is gone: draining (grace %.1f s)", grace_s)
            else:  # "drain"; a "stop" first (not sent so) drains too
                log.info("the supervisor asks (%s): draining (grace %.1f s)", first.name, grace_s)
            overdue_s = grace_s + ANSWER_WAIT_S + state.timings.close_timeout_s + OVERDUE_MARGIN_S
            exit_once = _once(exit_process)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_exit_on_second_request, receive, first, exit_once)
                nursery.start_soon(_exit_when_overdue, overdue_s, exit_once)
                await drain(state, grace_s)
                nursery.cancel_scope.cancel()
            exit_once()
            watchers.cancel_scope.cancel()  # exit_process returned: a test's


def _once(exit_process: Callable[[], None]) -> Callable[[], None]:
    """``exit_process`` called at most once (it returns only in tests)."""
    called: list[bool] = []

    def exit_once() -> None:
        if not called:
            called.append(True)
            exit_process()

    return exit_once


async def _exit_when_overdue(overdue_s: float, exit_process: Callable[[], None]) -> None:
    """Exit once the drain has run ``overdue_s`` seconds: its own waits are bounded, but a
    socket's write is not (Hypercorn writes shielded, so no cancel scope ends it: a peer
    that stopped reading, its TCP window shut, holds the write of its close frame as long
    as it stays connected), and a process that does not exit holds its replica's port and
    its Redis consumer until the orchestrator kills it."""
    await trio.sleep(overdue_s)
    log.error(
        "drain still not done after %.1f s (grace + answers + socket closes): a socket "
        "takes no bytes; exiting without it",
        overdue_s,
    )
    exit_process()


@contextlib.contextmanager
def _bare_cancel() -> Iterator[None]:
    """Re-raise a group holding only ``trio.Cancelled`` as its first ``Cancelled``.

    Stopped from outside (a bare ``hypercorn -w 1`` on Ctrl-C cancels the app's tasks),
    the watcher's nursery raised a group of ``Cancelled``, and quart-trio's background
    task wrapper logs any exception group as an error: 60 lines of tracebacks on every
    such stop. A bare ``Cancelled`` passes that wrapper to its cancel scope.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        cancelled, rest = group.split(trio.Cancelled)
        if rest is not None or cancelled is None:
            raise
        first: BaseException = cancelled
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


async def _pass_signals(
    signals: AsyncIterator[int], send: trio.MemorySendChannel[_Request]
) -> None:
    async with send:
        async for signum in signals:
            await send.send(_Request("signal", signal.Signals(signum).name))


async def _pass_supervisor(
    pipe: Connection[bytes, bytes], send: trio.MemorySendChannel[_Request]
) -> None:
    async with send, trio.lowlevel.FdStream(os.dup(pipe.fileno())) as stream:
        buffered = b""
        while chunk := await stream.receive_some():
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                kind, _, name = line.decode(errors="replace").partition(" ")
                if kind in ("drain", "stop"):
                    await send.send(_Request(kind, name))
                else:
                    log.warning("the supervisor said %r: ignored", line[:80])
        await send.send(_Request("gone", ""))


async def _exit_on_second_request(
    requests: trio.MemoryReceiveChannel[_Request],
    first: _Request,
    exit_process: Callable[[], None],
) -> None:
    signals = int(first.kind == "signal")
    async for request in requests:
        if request.kind == "signal":
            signals += 1
            if signals < 2:  # the group's Ctrl-C after the supervisor's drain: the same
                log.debug("%s: already draining (the supervisor asked first)", request.name)
                continue
            log.warning("%s again: stopping without waiting for running jobs", request.name)
        elif request.kind == "stop":
            log.warning(
                "the supervisor got %s again: stopping without waiting for running jobs",
                request.name,
            )
        else:  # the supervisor's drain (or its end) while draining already: the same
            continue
        exit_process()
        return
