"""A cancel's answer for a job that never reached a desktop, and the holder's handling of
a cancel notice (:class:`~._substrate_values.CancelAsked`).

A cancel of a job found ``queued`` while a live hub process holds the user's socket
leaves the answer to that holder (``Bridge.cancel``): only it knows whether the job runs
(a store that lost its last writes shows a running job ``queued``). The holder learned
of the cancel only from the job's control entry, read with the stream; but the control
entry is appended behind every job queued before it, and a session whose in-flight
window is full (``DESKBRIDGE_MAX_INFLIGHT`` deliveries not yet answered: one long tool
and a backlog) reads nothing. Found by a test with a real hub session and reader: the
caller of a cancelled queued job waited for the running tool to end (300 s) instead of
being answered at once, and a running job's ``cancel`` frame waited the same way behind
the jobs queued after it. The cancel now also pushes a notice to the holder's wake list,
handled whatever room the session has: a delivery of the job on the socket gets its
``cancel`` frame; a job the session never forwarded and still ``queued`` is answered
``cancelled`` (claim epoch 0: refused once any delivery is marked). The control entry
stays the fallback (a lost notice, a hub of an older version).

A delivery on the socket is also written back (``restore_delivery``) when the store
shows the job ``queued``: a store that lost its last writes rewinds a running job's
state and drops its claim epoch, and if this holder then died, the job's next reader
found the cancel flag and no delivery and answered ``cancelled`` about a tool that ran.
Written back, the next reader asks the desktop's ledger (``Marked`` ``in_doubt``, not
``elsewhere``: ``_delivery``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs

from ._errors import SubstrateUnavailable
from ._jobs import cancelled_before_start
from ._jobstate import JobState, MalformedState, Stage, forwarded_keep_s
from ._substrate import Finished, Substrate

log = logging.getLogger("deskbridge.hub.cancel")


@attrs.frozen
class Forwarded:
    """A delivery of a job on the holding session's socket (answered or not).

    Attributes:
        session_id: the session it went out on.
        daemon_id: the desktop that session serves (``hello.daemon_id``), or None.
        epoch: the delivery's claim epoch, or None when not known (nothing is written
            back then).
    """

    session_id: str
    daemon_id: str | None
    epoch: int | None


async def finish_cancelled_before_start(
    substrate: Substrate, user_id: str, job_id: str, state: JobState, *, at: float, ttl_s: float
) -> Finished:
    """Answer ``job_id``, read ``queued`` as ``state``, ``cancelled before it started``:
    the finish with claim epoch 0, refused (``stale``) once a delivery of the job was
    marked, and ``settled`` when it was answered otherwise first.

    Args:
        state: the job's state as read (its caller's mailbox, idempotency key).
        at: the answer's time, Unix seconds (the caller's wall clock).
        ttl_s: the answer's keep time, seconds (``result_ttl_s``).

    Raises:
        SubstrateUnavailable: Redis unreachable.
    """
    cancelled = state.advance(Stage.CANCELLED, at=at)
    return await substrate.finish(
        user_id, job_id, cancelled_before_start(), cancelled, ttl_s=ttl_s,
        notify=state.reply_to, epoch=0,
        idempotency_key=state.idempotency_key,  # its answer as long as the record
    )  # fmt: skip


async def answer_cancel_notice(
    substrate: Substrate,
    user_id: str,
    job_id: str,
    *,
    forwarded: Callable[[str], Forwarded | None],
    send_cancel: Callable[[str], Awaitable[None]],
    wall_clock: Callable[[], float],
    ttl_s: float,
) -> None:
    """The holding session's answer to a cancel of ``job_id`` (module docstring): when
    ``forwarded(job_id)`` names a delivery of it on the socket, its delivery written back
    over a state rewound to ``queued`` and the ``cancel`` frame; else ``cancelled`` if
    the job is still ``queued``. ``ttl_s``: the result TTL, seconds. Never raises for
    the store (an outage, a malformed state: the control entry and the cancel flag
    answer later); logs anything else.

    Cancellation: stops where it is; the flag and the control entry still answer.
    """
    try:
        delivery = forwarded(job_id)
        if delivery is not None:
            if delivery.epoch is not None:  # first: this holder may die at any time
                mine = JobState(
                    Stage.DELIVERED, user_id, at=wall_clock(),
                    session_id=delivery.session_id, daemon_id=delivery.daemon_id,
                )  # fmt: skip
                await substrate.restore_delivery(
                    user_id, job_id, mine, epoch=delivery.epoch, ttl_s=forwarded_keep_s(ttl_s)
                )
            await send_cancel(job_id)
            return
        state = await substrate.get_job_state(user_id, job_id)
        if state is None or state.stage is not Stage.QUEUED:
            return  # answered, or delivered somewhere: that delivery answers
        await finish_cancelled_before_start(
            substrate, user_id, job_id, state, at=wall_clock(), ttl_s=ttl_s
        )
    except (SubstrateUnavailable, MalformedState) as exc:
        log.debug("cancel notice for %s of %s left to the control entry: %s", job_id, user_id, exc)
    except Exception:  # a bug must not end the session serving the desktop
        log.exception("cancel notice for %s of %s failed", job_id, user_id)


__all__ = ["Forwarded", "answer_cancel_notice", "finish_cancelled_before_start"]
