"""State shared by every session of one hub process."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import Timings

from ._handshake_pace import HandshakeBudget, TokenLog, token_log
from ._keepalive import RunningJobs
from ._logging import fields
from ._pacer import Pacer
from ._reader import ProcessReader
from ._revocation import RevocationWatch
from ._shutdown import Draining
from ._substrate import Substrate

if TYPE_CHECKING:
    from ._session import HubSession

log = logging.getLogger("deskbridge.hub.session")

#: Handshakes of one process doing their Redis work at once (``HubState.handshakes``).
#: Each holds a few round trips (~1-5 ms on loopback), so 32 admit thousands a second
#: while bounding what a reconnect storm puts in flight.
HANDSHAKE_CONCURRENCY = 32


@attrs.define(eq=False)
class HubState:
    """Process-wide state shared by every session in this hub process.

    Attributes:
        substrate: the shared substrate.
        timings: timing knobs.
        consumer: this process's consumer name in group ``bridge-workers`` (unique per
            process).
        wall_clock: Unix time source (deadlines).
        max_inflight_per_session: most unanswered deliveries per socket.
        inflight: per user, entry IDs being served in this process right now.
        sessions: the open sessions of this process, by session id.
        by_user: the same sessions by user id, then session id (a handshake supersedes
            its user's older sessions without a scan of every session).
        drain: graceful shutdown: whether it began, and the requests waiting.
        holder_id: this process's id in session ids and its wake list
            (``bridge:wake:{holder_id}``): the enqueuer finds the holder from presence.
        reader: the process's reader (run it: ``await nursery.start(state.reader.run)``);
            it runs ``pacer`` and ``running_jobs`` too.
        running_jobs: the jobs this process's sessions are serving, whose records it keeps
            alive while they run (``_keepalive``).
        pacer: every session's ping and token-expiry timers, in one task (``_pacer``).
        revocations: applies token revocations to this process's sessions (``_revocation``:
            a notice at once, a sweep once per heartbeat); run by the reader.
        handshakes: admission of handshakes past ``hello`` (presence, catalogue,
            ``welcome``): at most ``HANDSHAKE_CONCURRENCY`` at once; the others wait their
            turn (within the sidecar's handshake deadline) instead of piling Redis work
            onto a saturated event loop when thousands of desktops connect at once.
        handshake_budget: each user's handshakes admitted by this process, per second
            (``_handshake_pace``: past it, 429 with ``Retry-After`` before the upgrade).
        token_log: the budgets of WARNING lines about refused sidecar tokens (per kind).
    """

    substrate: Substrate
    timings: Timings
    consumer: str
    wall_clock: Callable[[], float]
    max_inflight_per_session: int = 32
    inflight: dict[str, set[str]] = attrs.field(factory=dict)
    sessions: dict[str, HubSession] = attrs.field(factory=dict)
    by_user: dict[str, dict[str, HubSession]] = attrs.field(factory=dict)
    drain: Draining = attrs.field(factory=Draining)
    holder_id: str = attrs.field(factory=lambda: uuid.uuid4().hex[:16])
    reader: ProcessReader = attrs.field(init=False)
    running_jobs: RunningJobs = attrs.field(init=False)
    revocations: RevocationWatch = attrs.field(init=False)
    pacer: Pacer = attrs.field(factory=Pacer)
    handshakes: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(HANDSHAKE_CONCURRENCY)
    )
    handshake_budget: HandshakeBudget = attrs.field(factory=HandshakeBudget)
    token_log: TokenLog = attrs.field(factory=token_log)

    def __attrs_post_init__(self) -> None:
        self.running_jobs = RunningJobs(self.substrate, self.timings.result_ttl_s)
        self.revocations = RevocationWatch(
            self.substrate, self.timings.heartbeat_s, self.wall_clock, self.revoke_sessions
        )
        self.reader = ProcessReader(
            self.substrate, self.timings, self.consumer, self.holder_id, self.inflight,
            timers=self.pacer, max_pending=self.max_inflight_per_session,
            running_jobs=self.running_jobs, revocations=self.revocations,
        )  # fmt: skip

    def add_session(self, session: HubSession) -> None:
        """Index an open session (``sessions`` and ``by_user``)."""
        self.sessions[session.session_id] = session
        self.by_user.setdefault(session.user_id, {})[session.session_id] = session

    def remove_session(self, session: HubSession) -> None:
        """Drop a session from both indexes (nothing if it is not there)."""
        self.sessions.pop(session.session_id, None)
        mine = self.by_user.get(session.user_id)
        if mine is not None:
            mine.pop(session.session_id, None)
            if not mine:
                del self.by_user[session.user_id]

    def revoke_sessions(self, user_id: str, before_s: float) -> int:
        """Close this process's sessions of ``user_id`` whose token was issued before
        ``before_s`` (``HubSession.revoke``: 4003 "token revoked"); returns how many.
        Never blocks."""
        ended = 0
        for session in list(self.by_user.get(user_id, {}).values()):
            if session.revoke(before_s):
                ended += 1
                log.warning(
                    "session %s of %s: its token was revoked; closing it (4003)",
                    session.session_id,
                    user_id,
                    extra=fields(user_id=user_id, session_id=session.session_id),
                )
        return ended

    def new_session_id(self) -> str:
        """A session id naming this process: ``"<holder_id>.<random>"``."""
        return f"{self.holder_id}.{uuid.uuid4().hex}"
