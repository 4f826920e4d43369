"""The deadlines of one sidecar socket on the hub, mixed into ``_session.HubSession``:
the application-level pinger (its deadline is the ``Connection``'s) and the token's
expiry. Each raises :class:`~deskbridge_hub._errors.EndSession` to end the session."""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, NoReturn

import trio
from deskbridge_common import CLOSE_TOKEN_EXPIRED, Connection, Frame, Ping, RemoteProtocolError

from ._errors import EndSession

if TYPE_CHECKING:
    from ._process import HubState


class SessionTimers:
    """Pinger and token expiry of ``HubSession`` (see the module docstring)."""

    state: HubState
    expires_at: float | None
    _ending: str | None
    _conn: Connection
    _pongs: dict[str, trio.Event]
    _send: trio.MemorySendChannel[str]

    def _encode(self, frame: Frame) -> str:  # pragma: no cover - HubSession's
        raise NotImplementedError

    async def _expiry(self) -> NoReturn:
        """Close the session when its token expires (checked against the wall clock at
        most every ``heartbeat_s``, so a wall-clock jump is noticed too)."""
        assert self.expires_at is not None
        while (left := self.expires_at - self.state.wall_clock()) > 0:  # noqa: ASYNC110 - wall clock
            await trio.sleep(min(left, self.state.timings.heartbeat_s))
        self._ending = "token expired"
        raise EndSession(CLOSE_TOKEN_EXPIRED, "token expired; issue a new one")

    async def _pinger(self) -> NoReturn:
        """A ping every ``ping_interval_s``; the Connection holds its deadline
        (``ping_timeout_s`` from when it is queued: a peer that stops reading fills the
        send queue, and must be timed out all the same) and the close code (4002)."""
        t = self.state.timings
        while True:
            await trio.sleep(t.ping_interval_s)
            nonce = uuid.uuid4().hex
            answered = self._pongs[nonce] = trio.Event()
            try:
                text = self._encode(Ping(nonce=nonce))
                deadline_s = self._conn.deadline_s
                with trio.move_on_at(math.inf if deadline_s is None else deadline_s):
                    await self._send.send(text)
                    await answered.wait()
                self._conn.check_deadlines(trio.current_time())
            except RemoteProtocolError as exc:
                raise EndSession(exc.close_code, exc.reason) from None
            finally:
                self._pongs.pop(nonce, None)
