"""Sleep-aware presence, the hub's side (issue 12.6): one session's record of whether its
desktop went to sleep.

While a desktop's socket is missing, presence reads ``asleep`` (with ``since``) instead
of ``offline`` when

* the sidecar said ``sleeping`` before the socket went (an OS notification, or its
  embedder said so): ``announced``, kept ``ASLEEP_TTL_S``;
* or the socket went missing (closed by the sidecar, broken, or its pings timed out)
  within ``RECENT_SLEEP_S`` of a session start whose ``hello.slept_s`` reported a sleep
  the clock watchdog detected: a desktop that just woke up and is gone again most likely
  went back to sleep (a lid closed again, a dark wake): ``detected``, kept
  ``RECENT_SLEEP_S``.

The record is ``bridge:asleep:{<user_id>}`` (``_substrate.DesktopSubstrate``), a key of
its own beside presence, so the presence heartbeat never touches it; a session start
deletes it (the desktop is awake). Every write is best effort: a failure reads
``offline``, which is true too. Callers: docs/outcomes.md, "Asleep".
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio
from deskbridge_common import CLOSE_NORMAL, CLOSE_PING_TIMEOUT, Hello

from ._errors import EndSession, SubstrateUnavailable
from ._retry import CLEANUP_TIMEOUT_S
from ._substrate import Asleep, Substrate

log = logging.getLogger("deskbridge.hub.session")

#: How long an announced sleep reads ``asleep`` while the socket stays missing, seconds
#: (3 days: a weekend's sleep; a desktop away longer reads ``offline``).
ASLEEP_TTL_S = 3 * 86_400.0
#: How soon after a reported sleep a missing socket counts as a sleep again, and how
#: long that reads ``asleep``, seconds (10 minutes: dark wakes and a lid closed again
#: right after opening it happen within minutes).
RECENT_SLEEP_S = 600.0
#: End codes that mean "the socket went missing", not "the hub ended it on purpose"
#: (supersede, restart, token expiry and protocol violations are not sleeps).
_MISSING = frozenset({CLOSE_NORMAL, CLOSE_PING_TIMEOUT})


@attrs.define(eq=False)
class SleepRecord:
    """The asleep record of one session's desktop.

    Attributes:
        substrate: the shared substrate.
        user_id: whose desktop.
        wall_clock: Unix time source (``since``).
        woke_at: trio time of the session's start if its hello reported a sleep, else None.
        announced: the sidecar said ``sleeping`` on this session.
    """

    substrate: Substrate
    user_id: str
    wall_clock: Callable[[], float]
    woke_at: float | None = None
    announced: bool = False

    async def awake(self, hello: Hello) -> None:
        """A session started (handshake, after presence): the desktop is awake; delete
        the record. Remembers a sleep the hello reports. Best effort, bounded."""
        if hello.slept_s is not None and hello.slept_s > 0:
            self.woke_at = trio.current_time()
            log.info(
                "%s's desktop reports %.1f s asleep before this session",
                self.user_id,
                hello.slept_s,
            )
        await self._write(None, 0.0)

    async def going_to_sleep(self) -> None:
        """The sidecar said ``sleeping``: record ``announced`` since now."""
        self.announced = True
        await self._write(Asleep(self.wall_clock(), "announced"), ASLEEP_TTL_S)

    async def ended(self, end: EndSession | None, *, on_purpose: bool) -> None:
        """The session ends (before presence is cleared): record ``detected`` if the
        socket went missing soon after a reported sleep.

        Args:
            end: why, or None when the socket just went away.
            on_purpose: the hub ended it (``HubSession.ended_reason`` is set).
        """
        if self.announced or on_purpose or self.woke_at is None:
            return
        if end is not None and end.code not in _MISSING:
            return
        if trio.current_time() - self.woke_at > RECENT_SLEEP_S:
            return
        await self._write(Asleep(self.wall_clock(), "detected"), RECENT_SLEEP_S)

    async def _write(self, asleep: Asleep | None, ttl_s: float) -> None:
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            try:
                if asleep is None:
                    await self.substrate.clear_asleep(self.user_id)
                else:
                    await self.substrate.set_asleep(self.user_id, asleep, ttl_s=ttl_s)
                    log.info("%s's desktop is asleep (%s)", self.user_id, asleep.source)
            except SubstrateUnavailable as exc:
                log.warning("could not record whether %s's desktop sleeps: %s", self.user_id, exc)
