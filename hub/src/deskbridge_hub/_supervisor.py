"""The supervisor of ``deskbridge-hub serve --workers N`` (N > 1): N Hypercorn trio
workers sharing the listening sockets, and one graceful drain per operator action.

Why not Hypercorn's own supervisor (``hypercorn.run.run``, 0.17): on SIGINT/SIGTERM it
sets a shared event that starts Hypercorn's graceful shutdown in each worker (not the
hub's drain), waits for the *first* worker to exit, then SIGTERMs the others. A worker
already draining (a Ctrl-C reaches the whole process group) counted that SIGTERM as a
second Ctrl-C and stopped at once: the call in flight lost its answer, the socket closed
1006 instead of 1012. An idle worker drains in milliseconds, so this was the rule.

Here one operator action is one drain in every worker:

* SIGINT or SIGTERM to the supervisor: each worker is asked to drain over its pipe
  (``drain SIGNAME``). A worker takes that request and a signal of its own (a Ctrl-C to
  the process group reaches it too) as the same request (``_shutdown``); only a second
  signal to the worker, or ``stop`` (the supervisor got a second signal), stops it at
  once. The supervisor waits for every worker; one still running ``grace_s`` +
  :data:`STOP_MARGIN_S` after the first request is killed (SIGKILL).
* SIGTERM to one worker: it drains and exits 0; the supervisor starts a replacement.
* SIGHUP: every worker drains and is replaced (what Hypercorn's supervisor called reload).
* A worker killed (a signal, the OOM killer) or crashed after it served (it tells the
  supervisor once its app serves: ``_shutdown.announce_serving``) is replaced at once,
  as gunicorn's arbiter does: the other workers keep their sockets and calls (draining
  them all, as Hypercorn's supervisor did, cut every desktop of the pod for one lost
  process). Its desktops reconnect to the others; the jobs it held are the recovery's
  (docs/outcomes.md). A worker that exits before it served (a configuration error, an
  import failing), or more than ``workers`` + :data:`RESTART_SPARE` workers in a row
  that each exit within :data:`STABLE_S` of their start (a crash loop, :class:`Restarts`),
  make the supervisor drain the others and exit 1: a restart would fail the same way,
  and the process manager above should see it.
* A worker whose pipe ends (the supervisor is gone, e.g. SIGKILLed) drains and exits.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.synchronize import Event

    from hypercorn.config import Config, Sockets

log = logging.getLogger("deskbridge.hub.supervisor")

STOP_MARGIN_S = 10.0
"""Seconds a worker gets beyond the grace to close its sockets and exit before the
supervisor kills it (closing is bounded in the worker; this only catches a wedged one)."""

STABLE_S = 60.0
"""Seconds a worker must run for its abnormal exit to end a crash loop's count."""

RESTART_SPARE = 2
"""More than ``workers`` + ``RESTART_SPARE`` abnormal exits in a row, each of a worker
that ran less than :data:`STABLE_S`, is a crash loop (room for every worker OOM-killed at
once, and two more)."""

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@attrs.define
class Restarts:
    """Whether a worker's abnormal exit is replaced or stops the supervisor (pure).

    Args:
        workers (int): the number of worker processes (sets the crash-loop bound).
    """

    workers: int
    #: Abnormal exits in a row of workers that ran less than ``STABLE_S``.
    short: int = 0

    def replace(self, *, served: bool, lived_s: float) -> bool:
        """Note an abnormal exit of a worker that had run ``lived_s`` seconds and had
        (``served``) or had not yet announced that it serves. True: start a
        replacement; False: stop (it never started, or the workers crash in a loop)."""
        if not served:
            return False
        self.short = self.short + 1 if lived_s < STABLE_S else 0
        return self.short <= self.workers + RESTART_SPARE


@attrs.define(eq=False)
class _Worker:
    process: BaseProcess
    pipe: Connection[bytes, bytes]  # the write end; the worker reads the other (``_shutdown``)
    serving: Event  # set by the worker once its app serves (``_shutdown.announce_serving``)
    started_s: float = attrs.Factory(time.monotonic)

    def tell(self, line: str) -> None:
        with contextlib.suppress(OSError):  # gone already: nothing left to tell
            os.write(self.pipe.fileno(), line.encode() + b"\n")


def worker_main(
    config: Config, sockets: Sockets, pipe: Connection[bytes, bytes], serving: Event
) -> None:
    """The target of each worker process: Hypercorn's trio worker, told where the
    supervisor's requests arrive and what to set once it serves
    (``_shutdown.supervised_by``), with no shutdown event of Hypercorn's (the hub's drain
    is the only shutdown)."""
    from hypercorn.trio.run import trio_worker

    from . import _shutdown

    # The supervisor blocks SIGINT and SIGTERM (and ignores them) around the start:
    # unblock them here; they stay ignored until the drain listens for them, once the
    # app serves (the supervisor, reached by the same group signal, asks over the pipe).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_STOP_SIGNALS))
    _shutdown.supervised_by(pipe, serving)
    trio_worker(config, sockets)


def run(config: Config, workers: int, grace_s: float) -> int:
    """Serve with ``workers`` worker processes until an operator stops them.

    Args:
        config: Hypercorn's configuration (``worker_class`` trio); must pickle.
        workers (int): how many worker processes; at least 2.
        grace_s (float): seconds a worker's drain may wait for running jobs
            (``DESKBRIDGE_GRACE_S``); bounds how long the supervisor waits.

    Returns:
        0 once every worker drained and exited 0 after SIGINT/SIGTERM (workers killed
        and replaced before that do not count); 2 when the workers that exited refused
        their configuration before they served (each exited 2: a usage error, as
        ``serve --workers 1`` reports it); 1 when a worker could not start otherwise or
        kept crashing (:class:`Restarts`), or had to be killed.

    Raises:
        OSError: the listening sockets could not be created (address in use, ...).
    """
    ctx = multiprocessing.get_context("spawn")
    # multiprocessing starts its resource tracker with the first worker, blocking
    # SIGINT/SIGTERM around that and *unblocking* them after: a stop pending then met
    # our SIG_IGN of the start (below) and was lost; the workers were never asked to
    # drain. Started here, before any of that, it is already running at each start.
    resource_tracker.ensure_running()
    sockets = listening_sockets(config)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    handled = (*_STOP_SIGNALS, signal.SIGHUP)
    previous = {signum: signal.signal(signum, _note) for signum in handled}
    previous_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    live: list[_Worker] = []
    status = 0
    kill_at: float | None = None  # monotonic; set when the drain is requested
    killed = False
    stop_signals = 0
    restarts = Restarts(workers)

    def start_one() -> None:
        reader, writer = ctx.Pipe(duplex=False)
        serving = ctx.Event()
        process = ctx.Process(
            target=worker_main,
            kwargs={"config": config, "sockets": sockets, "pipe": reader, "serving": serving},
        )
        # Ignored by the child (and blocked here, so none is lost by the supervisor)
        # while it starts: a Ctrl-C during its imports would be a KeyboardInterrupt
        # traceback, and a SIGTERM (systemd stops the whole group) would kill it by the
        # default action, not drain it; the supervisor, reached by the same signal, asks
        # it to drain over the pipe once it serves.
        stops = set(_STOP_SIGNALS)
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        caught: list[signal.Signals] = []
        try:
            for signum in _STOP_SIGNALS:
                # Setting SIG_IGN drops a pending signal (POSIX): take it first, so a
                # stop that came just now is not lost (it was, about one start-up
                # SIGTERM in twenty: the workers were never asked to drain). Blocked,
                # one that comes after is kept pending (Linux) until the unblock.
                if signal.sigtimedwait({signum}, 0) is not None:
                    caught.append(signum)
                signal.signal(signum, signal.SIG_IGN)
            process.start()
        finally:
            for signum in _STOP_SIGNALS:
                signal.signal(signum, _note)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            for signum in caught:
                signal.raise_signal(signum)  # to ``_note``, as if it came now
        reader.close()
        live.append(_Worker(process, writer, serving))

    try:
        for _ in range(workers):
            start_one()
        while live:
            timeout = None if kill_at is None or killed else max(0.0, kill_at - time.monotonic())
            ready = wait([wake_r, *(w.process.sentinel for w in live)], timeout)
            if wake_r in ready:
                for signum in _received(wake_r):
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        if kill_at is None:
                            log.info("SIGHUP: every worker drains and is replaced")
                            for worker in live:
                                worker.tell(f"drain {name}")
                        continue
                    stop_signals += 1
                    if stop_signals == 1:
                        again = "; Ctrl-C again to stop at once" if name == "SIGINT" else ""
                        log.info(
                            "%s: draining %d workers (grace %.1f s)%s",
                            name,
                            len(live),
                            grace_s,
                            again,
                        )
                        if kill_at is None:
                            kill_at = time.monotonic() + grace_s + STOP_MARGIN_S
                        for worker in live:
                            worker.tell(f"drain {name}")
                    else:
                        log.warning("%s again: workers stop without waiting for running jobs", name)
                        for worker in live:
                            worker.tell(f"stop {name}")
            for worker in [w for w in live if not w.process.is_alive()]:
                worker.process.join()
                worker.pipe.close()
                live.remove(worker)
                code = worker.process.exitcode
                if code == 0 and kill_at is None:
                    start_one()  # a worker restarted on its own (SIGTERM to it, SIGHUP)
                elif code != 0:
                    lived_s = time.monotonic() - worker.started_s
                    served = worker.serving.is_set()
                    pid, how = worker.process.pid, _describe(code)
                    if kill_at is None and restarts.replace(served=served, lived_s=lived_s):
                        log.error(
                            "worker %d exited with %s after %.1f s: starting a replacement "
                            "(its desktops reconnect; the jobs it held are recovered)",
                            pid, how, lived_s,
                        )  # fmt: skip
                        start_one()
                        continue
                    # a worker refusing its configuration before it served exits 2 (a
                    # usage error, as `serve --workers 1` does); passed on, so a service
                    # manager that leaves 2 alone does not restart a hub that cannot start
                    refused = code == 2 and not served and status in (0, 2)
                    status = 2 if refused else 1
                    log.error("worker %d exited with %s after %.1f s", pid, how, lived_s)
                    if kill_at is None:
                        if not served:
                            log.error("it exited before it served: see its output above")
                        else:
                            log.error(
                                "%d workers in a row exited within %.0f s of their start: "
                                "a crash loop",
                                restarts.short, STABLE_S,
                            )  # fmt: skip
                        kill_at = time.monotonic() + grace_s + STOP_MARGIN_S
                        log.error("stopping: draining the other %d workers", len(live))
                        for other in live:
                            other.tell("drain worker-exit")
            if kill_at is not None and not killed and live and time.monotonic() >= kill_at:
                log.error(
                    "%d workers still running %.1f s after the drain began: killing them",
                    len(live),
                    grace_s + STOP_MARGIN_S,
                )
                for worker in live:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.process.pid or 0, signal.SIGKILL)
                killed = True
                status = 1
    finally:
        signal.set_wakeup_fd(previous_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        wake_r.close()
        wake_w.close()
        for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
            sock.close()
    return status


def _note(signum: int, frame: Any) -> None:
    """The Python-level handler: the signal number reaches the loop through the wakeup
    fd (``signal.set_wakeup_fd``); nothing to do here."""


def listening_sockets(config: Config) -> Sockets:
    """Bind ``config``'s addresses once, for every worker to inherit, without SO_REUSEPORT.

    Hypercorn's ``create_sockets`` sets SO_REUSEPORT when ``config.workers`` > 1 (for its
    own workers, which do not need it either: they inherit the one bound socket). With it
    a second ``serve --workers N`` on the same port started without a word and the kernel
    shared the connections between the two hubs; without it that bind fails with
    "Address already in use", as for ``--workers 1``.

    Raises:
        OSError: an address could not be bound (in use, a host that does not resolve).
    """
    single = copy.copy(config)
    single.workers = 1
    return single.create_sockets()


def _received(wake: socket.socket) -> list[int]:
    signums: list[int] = []
    with contextlib.suppress(BlockingIOError):
        while True:
            data = wake.recv(64)
            if not data:
                break
            signums.extend(data)
    return signums


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"
