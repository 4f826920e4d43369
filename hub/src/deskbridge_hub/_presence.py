"""Presence of one session: announce, supersede and hand-over, clear (the refresh is
the process reader's pipelined heartbeat, ``_reader``).

Invariant 1 (DESIGN.md): presence is a Redis key with a TTL that every replica reads the
same way; its value names the holder session. The holder refreshes it every
``heartbeat_s`` (TTL ``presence_ttl_s`` = 3 heartbeats), only while it is still its own,
so a heartbeat never steals presence back from a newer session: the newest session of a
user wins, and the older one hands over (stops reading new entries, lets its running
jobs finish within ``grace_s``, then closes with 4001).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import attrs
import trio
from deskbridge_common import CLOSE_SUPERSEDED, Timings

from . import _metrics
from ._errors import EndSession, SubstrateUnavailable
from ._keys import holder_of
from ._retry import CLEANUP_TIMEOUT_S
from ._substrate import Substrate

log = logging.getLogger("deskbridge.hub.presence")

#: The close reason sent with 4001 (CLOSE_SUPERSEDED): the sidecar that receives it backs
#: off instead of taking presence back (docs/protocol.md).
SUPERSEDED_REASON = "superseded by a newer sidecar session"
#: A user's supersedes are logged at WARNING once per this many seconds (INFO between).
SUPERSEDE_WARN_WINDOW_S = 600.0
#: Users remembered for that (then the memory starts over).
SUPERSEDE_WARN_USERS = 10_000
_supersedes_warned: dict[str, float] = {}


@attrs.define(eq=False)
class PresenceKeeper:
    """Keeps one session's presence and catalogue true in the substrate.

    Attributes:
        substrate: the shared substrate.
        timings: ``heartbeat_s``, ``presence_ttl_s``, ``grace_s``.
        user_id: whose presence.
        session_id: the value presence holds while this session is the holder.
        catalogue: the tool catalogue (JSON text) from the sidecar's hello.
        on_superseded: called once a newer session is known (the session stops reading
            new entries).
    """

    substrate: Substrate
    timings: Timings
    user_id: str
    session_id: str
    catalogue: str
    on_superseded: Callable[[], None] = lambda: None
    #: The session :meth:`announce` took presence from (None: none, or this one).
    replaced: str | None = attrs.field(default=None, init=False)
    _superseded: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def announce(self) -> None:
        """Write the catalogue and take presence (newest wins), at the handshake.

        Raises:
            SubstrateUnavailable: the substrate cannot be reached.
        """
        try:
            await self.substrate.set_catalogue(self.user_id, self.catalogue)
            replaced = await self.substrate.set_presence(
                self.user_id, self.session_id, self.timings.presence_ttl_s
            )
        except SubstrateUnavailable:
            _metrics.presence_failed("unavailable")
            raise
        _metrics.presence_written("set")
        self.replaced = replaced if replaced != self.session_id else None

    async def notify_replaced(self) -> None:
        """Tell the process of the session :meth:`announce` replaced, if it is another
        process, that its session is superseded: newest wins at once on every process,
        not at that session's next heartbeat (up to ``heartbeat_s``; meanwhile a
        connected desktop read offline if this newer session ended first). Called once
        this session is welcomed (a socket gone before its welcome must not end a
        working one). Best effort: that heartbeat stays the fallback. (This process's own
        older sessions are told directly by the handshake.)"""
        replaced = self.replaced
        older = holder_of(replaced) if replaced else None
        if not replaced or older is None or older == holder_of(self.session_id):
            return
        try:
            await self.substrate.notify_superseded(
                older, self.user_id, replaced, ttl_s=self.timings.presence_ttl_s
            )
        except SubstrateUnavailable as exc:
            log.info(
                "session %s: could not tell %s's process it was superseded (%s); its "
                "heartbeat will",
                self.session_id, replaced, exc,
            )  # fmt: skip

    def supersede(self) -> None:
        """A newer session of this user started in this process: hand over at once."""
        self._superseded.set()

    @property
    def superseded(self) -> bool:
        return self._superseded.is_set()

    async def watch(self, wait_idle: Callable[[], Awaitable[None]]) -> NoReturn:
        """Wait until superseded (a newer session in this process, or the process
        heartbeat found presence held by another session), then hand over.

        The refresh itself is pipelined for every session of the process by
        ``_reader.ProcessReader`` (one round trip per ``heartbeat_s``).

        Args:
            wait_idle: returns once no job is being served on this session.

        Raises:
            EndSession: 4001 after the hand-over (running jobs finished, or the grace
                passed).
        """
        await self._superseded.wait()
        await self._hand_over(wait_idle)

    async def _hand_over(self, wait_idle: Callable[[], Awaitable[None]]) -> NoReturn:
        self._superseded.set()
        self.on_superseded()  # stop reading new entries
        # Two sidecars for one user fight (issue 11.5): say it at WARNING once per user
        # and window, not on every flip; the sidecar told 4001 backs off.
        now = trio.current_time()
        warned = _supersedes_warned.get(self.user_id)
        level = logging.INFO
        if warned is None or not 0 <= now - warned < SUPERSEDE_WARN_WINDOW_S:
            _supersedes_warned[self.user_id] = now
            level = logging.WARNING
            if len(_supersedes_warned) > SUPERSEDE_WARN_USERS:
                _supersedes_warned.clear()
        log.log(
            level,
            "session %s of %s superseded by a newer sidecar session of the same user; "
            "finishing running jobs, then closing %d (if two sidecars keep taking over from "
            "each other, stop one)",
            self.session_id,
            self.user_id,
            CLOSE_SUPERSEDED,
        )
        with trio.move_on_after(self.timings.grace_s):
            await wait_idle()
        raise EndSession(CLOSE_SUPERSEDED, SUPERSEDED_REASON)

    async def clear(self) -> None:
        """Delete presence if it is still ours (shielded, bounded by
        ``CLEANUP_TIMEOUT_S``); a failure is logged, never raised."""
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            try:
                await self.substrate.clear_presence(self.user_id, self.session_id)
            except SubstrateUnavailable as exc:
                log.warning("could not clear presence of %s: %s", self.user_id, exc)
