"""The daemon's graceful stop (SIGTERM, Ctrl-C): let a running tool finish within the
grace, then answer ``in_doubt`` for what is still running (``Daemon.shutdown``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ._runner import ToolRunner
from ._session import Session

log = logging.getLogger("deskbridge.sidecar")

#: After giving up on a running tool at shutdown, how long its in_doubt answer may take
#: to reach the hub before the socket closes, seconds.
ANSWER_FLUSH_S = 1.0


async def give_up_gracefully(
    runner: ToolRunner | None,
    session: Callable[[], Session | None],
    grace_s: float,
    *,
    why: str,
    now: trio.Event | None = None,
) -> None:
    """Admit no new tool; wait up to ``grace_s`` (or until ``now`` is set) for the
    running one; then answer it ``in_doubt`` (recorded so in the ledger) and wait up to
    ``ANSWER_FLUSH_S`` for the answers to be on the current session's socket.

    Args:
        runner: the daemon's runner (None: nothing ran yet).
        session: returns the current session, or None between sessions.
        grace_s: seconds a running tool may take to finish.
        why: what stopped the sidecar, for the ``in_doubt`` message.
        now: an event that ends the grace early (a second Ctrl-C).

    Cancellation: stops waiting; tools given up on are already answered.
    """
    if runner is None:
        return
    runner.close()
    if not runner.busy:
        return
    keys = runner.started_keys()
    with trio.move_on_after(grace_s):
        async with trio.open_nursery() as nursery:

            async def early() -> None:
                if now is not None:
                    await now.wait()
                    nursery.cancel_scope.cancel()

            nursery.start_soon(early)
            await runner.wait_idle()
            nursery.cancel_scope.cancel()
    if runner.busy:
        given_up = runner.interrupt(why)
        log.warning("gave up on %s: answered in_doubt", ", ".join(name for _, name in given_up))
    with trio.move_on_after(ANSWER_FLUSH_S):
        await runner.wait_idle()  # outcomes (real or in_doubt) are recorded
        current = session()
        if current is not None:  # and their answers are on the socket
            await current.wait_flushed(keys)
