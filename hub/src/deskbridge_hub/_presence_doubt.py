"""A beat found presence naming another session: is that session real?

Newest wins: a session whose beat finds presence held by another session hands over
(4001), and its sidecar stops for good (exit status 3: two sidecars must not take the
user from each other in turn). That is right when the other session is newer. But a
store that lost its last writes (a replica promoted without them, a snapshot restored)
can name an *older* session again: the desktop's previous socket, on a process that is
gone or that ended it. Handing over then stopped a connected desktop for good. So the
first beat that finds presence not ours checks first (:func:`check_holder`); only a
holder that may be real supersedes the session:

- a session of this process that it does not hold, or of a process whose liveness key
  is gone (dead: it holds no socket), is no session at all: its presence is cleared
  (only while it still names that session) and the next beat takes presence back;
- a session of another live process: that process is asked (a ``check`` notice on its
  wake list) and clears it if it does not hold it (:func:`clear_unheld`); a session
  still not ours at the beat after that hands over, as before.

A newer session's own handshake still tells the older one at once (its ``superseded``
notice); this check only delays the heartbeat's fallback by about a second.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from ._keys import holder_of
from ._logging import fields
from ._substrate import Substrate, Superseded

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
    ttl_s: float,
) -> Verdict:
    """Look at who holds ``user_id``'s presence instead of session ``session_id`` (of
    this process, ``holder_id``), and clear it when it names a session nobody holds.

    Args:
        held_here: whether this process holds a session id (its live sessions).
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
    if process != holder_id and await substrate.holder_alive(process):
        await substrate.notify_superseded(process, user_id, holder, ttl_s=ttl_s, check=True)
        return Verdict.ASKED
    if await substrate.clear_presence(user_id, holder):
        why = "this process does not hold it" if process == holder_id else "its process is gone"
        _cleared(user_id, holder, why)
    return Verdict.CLEARED


async def clear_unheld(
    substrate: Substrate, notice: Superseded, held_here: Callable[[str], bool]
) -> None:
    """A ``check`` notice (another process's session found presence naming
    ``notice.session_id``, one of ours): clear it unless this process holds it.

    Raises:
        SubstrateUnavailable: Redis unreachable (the asking session's next beat hands
            over, as it did before the check).
    """
    if held_here(notice.session_id):
        return
    if await substrate.clear_presence(notice.user_id, notice.session_id):
        _cleared(notice.user_id, notice.session_id, "its process (this one) does not hold it")


def _cleared(user_id: str, session_id: str, why: str) -> None:
    log.warning(
        "presence of %s named session %s, but %s (the store lost its last writes: "
        "a replica promoted without them, an older snapshot restored?): cleared, so the "
        "desktop's current session takes it back",
        user_id, session_id, why,
        extra=fields(user_id=user_id, session_id=session_id),
    )  # fmt: skip
