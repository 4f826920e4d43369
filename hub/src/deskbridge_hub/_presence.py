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
from ._retry import CLEANUP_TIMEOUT_S
from ._substrate import Substrate

log = logging.getLogger("deskbridge.hub.presence")


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
    _superseded: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def announce(self) -> None:
        """Write the catalogue and take presence (newest wins), at the handshake.

        Raises:
            SubstrateUnavailable: the substrate cannot be reached.
        """
        try:
            await self.substrate.set_catalogue(self.user_id, self.catalogue)
            await self.substrate.set_presence(
                self.user_id, self.session_id, self.timings.presence_ttl_s
            )
        except SubstrateUnavailable:
            _metrics.presence_failed("unavailable")
            raise
        _metrics.presence_written("set")

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
        log.info(
            "session %s of %s superseded; finishing running jobs", self.session_id, self.user_id
        )
        with trio.move_on_after(self.timings.grace_s):
            await wait_idle()
        raise EndSession(CLOSE_SUPERSEDED, "superseded by a newer sidecar session")

    async def clear(self) -> None:
        """Delete presence if it is still ours (shielded, bounded by
        ``CLEANUP_TIMEOUT_S``); a failure is logged, never raised."""
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            try:
                await self.substrate.clear_presence(self.user_id, self.session_id)
            except SubstrateUnavailable as exc:
                log.warning("could not clear presence of %s: %s", self.user_id, exc)
