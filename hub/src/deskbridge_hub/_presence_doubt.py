"""A beat found presence naming another session: is that session real?

Newest wins: a session whose beat finds presence held by another session hands over
(4001), and its sidecar stops for good (exit status 3: two sidecars must not take the
user from each other in turn). That is right when the other session is newer. But a
store that lost its last writes (a replica promoted without them, a snapshot restored)
can name an *older* session again: the desktop's previous socket, on a process that is
gone or that ended it. Handing over then stopped a connected desktop for good. So the
first beat that finds presence not ours checks first (:func:`check_holder`); only a
holder that may be real supersedes the session:

- a session of this process that has ended here, or of a process whose liveness key is
  gone (dead: it holds no socket), is no session at all: its presence is cleared (only
  while it still names that session) and the next beat takes presence back;
- a session of another live process: that process is asked (a ``check`` notice on its
  wake list) and clears it if that session has ended there (:func:`clear_ended`); a
  session still not ours after a few such checks hands over, as before.

"Ended here", not "not held here": a session of this process between its presence write
and its attach to the reader (its welcome being sent) is held by nobody yet, and is the
newest. A process remembers the sessions that ended in it (bounded); one it forgot counts
as possibly real.

A newer session's own handshake still tells the older one at once (its ``superseded``
notice); this check only delays the heartbeat's fallback by about a second.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from ._errors import SubstrateUnavailable
from ._jobs import JobEnvelope, MalformedEntry
from ._jobstate import JobState, Stage
from ._keys import holder_of
from ._logging import fields
from ._substrate import Pushed, Substrate

log = logging.getLogger("deskbridge.hub.reader")


class Verdict(enum.Enum):
    """What :func:`check_holder` found (and did)."""

    OURS = "ours"  # presence is absent or ours again: beat now
    REAL = "real"  # held by a session that may be real: hand over
    CLEARED = "cleared"  # named a session nobody holds, now cleared: beat now
    ASKED = "asked"  # its live process was asked to clear it if it does not hold it


async def check_holder(
    substrate: Substrate,
    *,
    user_id: str,
    session_id: str,
    holder_id: str,
    held_here: Callable[[str], bool],
    ended_here: Callable[[str], bool],
    ttl_s: float,
) -> Verdict:
    """Look at who holds ``user_id``'s presence instead of session ``session_id`` (of
    this process, ``holder_id``), and clear it when it names a session nobody holds.

    Args:
        held_here: whether this process holds a session id (its live sessions).
        ended_here: whether a session id is one that ended in this process.
        ttl_s: the wake list's TTL for the ``check`` notice, seconds (> 0).

    Raises:
        SubstrateUnavailable: Redis unreachable (nothing concluded; retry).
    """
    holder = await substrate.get_presence(user_id)
    if holder is None or holder == session_id:
        return Verdict.OURS
    process = holder_of(holder)
    if process is None or held_here(holder):
        return Verdict.REAL
    if process == holder_id:
        if not ended_here(holder):
            return Verdict.REAL  # starting (not attached yet), or forgotten
        why = "it ended in this process"
    elif await substrate.holder_alive(process):
        await substrate.notify_superseded(process, user_id, holder, ttl_s=ttl_s, check=True)
        return Verdict.ASKED
    else:
        why = "its process is gone"
    if await substrate.clear_presence(user_id, holder):
        _cleared(user_id, holder, why)
    return Verdict.CLEARED


async def clear_ended(
    substrate: Substrate, user_id: str, session_id: str, ended_here: Callable[[str], bool]
) -> None:
    """Presence of ``user_id`` is said to name ``session_id``, one of this process's (a
    ``check`` notice; a wake-up for a user this process holds no session of): clear it
    if that session ended here (a store that lost its last writes names it again).

    Raises:
        SubstrateUnavailable: Redis unreachable (the asking session hands over after its
            checks, as it did before; a caller's next wake-up looks again).
    """
    if ended_here(session_id) and await substrate.clear_presence(user_id, session_id):
        _cleared(user_id, session_id, "it ended in this process")


async def unmark_unheld(substrate: Substrate, pushed: Pushed, *, ttl_s: float) -> None:
    """A caller pushed ``pushed`` to this process for a session it no longer holds (its
    presence named an ended session: a store that lost its last writes), marked
    delivered for it. No desktop received it: its state goes back to ``queued``
    (``Substrate.unmark_delivered``), so its caller's timeout, ``GET /v1/jobs/{id}`` and a
    cancel tell the truth ("queued", ``cancelled``), not "delivered, may be running" or
    ``in_doubt``. The entry stays pending on this consumer (the next session's drain,
    the daemon's takeover or the reclaim serves it). A newer mark (a drain here
    delivered it since) is left alone. Redis unreachable: logged, left as it is.

    ``ttl_s``: the answer's keep time (``result_ttl_s``); the state lasts until the
    job's deadline plus that.
    """
    entry, marked = pushed.entry, pushed.entry.marked
    if marked is None or marked.verdict != "delivered" or marked.epoch is None:
        return
    try:
        envelope = JobEnvelope.from_fields(entry.fields or {})
    except MalformedEntry:
        return
    queued = JobState(Stage.QUEUED, pushed.user_id, reply_to=envelope.reply_to)
    keep_s = max(0.0, envelope.deadline - marked.server_time) + ttl_s
    try:
        undone = await substrate.unmark_delivered(
            pushed.user_id, envelope.job_id, queued, epoch=marked.epoch, ttl_s=keep_s
        )
    except SubstrateUnavailable as exc:
        log.info("job %s: its delivery mark for a gone session stays: %s", envelope.job_id, exc)
        return
    if undone:
        log.info(
            "job %s of %s was pushed for a session that ended here; queued again",
            envelope.job_id, pushed.user_id, extra=fields(user_id=pushed.user_id),
        )  # fmt: skip


def _cleared(user_id: str, session_id: str, why: str) -> None:
    log.warning(
        "presence of %s named session %s, but %s (the store lost its last writes: "
        "a replica promoted without them, an older snapshot restored?): cleared, so the "
        "desktop's current session takes it back",
        user_id, session_id, why,
        extra=fields(user_id=user_id, session_id=session_id),
    )  # fmt: skip
