"""The hub side of the handshake of one sidecar socket: wait for ``hello`` within the
Connection's handshake deadline, check the tool schemas it lists, supersede this user's
older sessions in this process, announce presence (with the catalogue), send
``welcome``. Used by :meth:`deskbridge_hub._session.HubSession.run` only."""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING

import attrs
import trio
from deskbridge_common import (
    CLOSE_NORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TRY_AGAIN_LATER,
    Hello,
    RemoteProtocolError,
    Welcome,
    replace_lone_surrogates,
    replace_lone_surrogates_in,
)

from ._asleep import SleepRecord
from ._errors import EndSession, SocketClosed, SubstrateUnavailable
from ._logging import fields
from ._presence import PresenceKeeper
from ._schema import check_tool_schema

if TYPE_CHECKING:
    from ._session import HubSession

log = logging.getLogger("deskbridge.hub.session")

#: The close reason of 1013 when Redis cannot be used at the handshake.
UNAVAILABLE_REASON = "substrate unavailable; try again later"


def valid_text(hello: Hello) -> Hello:
    """``hello`` with U+FFFD for each lone surrogate in its catalogue's descriptions and
    schemas (an older sidecar's text built from a name that is not UTF-8): stored as
    sent, it made MCP ``tools/list`` fail for the user and ``GET .../tools`` answer an
    escape strict parsers refuse. Replaced rather than refused (1007): the sidecar would
    send the same hello at every reconnect, and the desktop would serve nothing."""
    tools = tuple(
        attrs.evolve(
            t,
            description=replace_lone_surrogates(t.description),
            args_schema=replace_lone_surrogates_in(t.args_schema),
        )
        for t in hello.tools
    )
    return hello if tools == hello.tools else attrs.evolve(hello, tools=tools)


async def handshake(session: HubSession) -> PresenceKeeper:
    """Run the handshake on ``session``'s socket; sets ``session.hello`` and its
    presence keeper.

    Returns:
        The session's ``PresenceKeeper``, presence announced.

    Raises:
        EndSession: the socket closed before ``hello`` (1000), the handshake deadline
            passed or the sidecar broke the protocol (the Connection's close code), a
            tool schema is refused (1008), or the substrate is unavailable (1013).
        SocketClosed: the socket broke while sending ``welcome``.

    Cancellation: nothing is undone here; the caller's cleanup clears presence.
    """
    t = session.state.timings
    deadline_s = session._conn.deadline_s
    frame: Hello | None = None
    with trio.move_on_at(math.inf if deadline_s is None else deadline_s):
        try:
            events = await session._receive()
        except SocketClosed:
            raise EndSession(CLOSE_NORMAL, "closed before hello") from None
        # Before the welcome the Connection lets a sidecar send only hello.
        assert len(events) == 1 and isinstance(events[0], Hello), events
        frame = events[0]
    if frame is None:
        try:
            session._conn.check_deadlines(trio.current_time())
        except RemoteProtocolError as exc:
            raise EndSession(exc.close_code, exc.reason) from None
        raise AssertionError("handshake deadline passed but the Connection disagrees")
    frame = valid_text(frame)
    for i, spec in enumerate(frame.tools):
        problem = check_tool_schema(spec.args_schema)
        if problem:
            raise EndSession(CLOSE_POLICY_VIOLATION, f"tools[{i}].args_schema: {problem}")
    async with session.state.handshakes:  # admission (``HubState.handshakes``)
        session.hello = frame
        older = list(session.state.by_user.get(session.user_id, {}).values())
        # A hello without tools (the field is optional) means "catalogue unknown":
        # stored as null, so callers are not refused for tools the sidecar never
        # listed. An entry's unset optional fields (approval_after_wait_s) are left
        # out, as on the wire.
        catalogue = json.dumps(
            [attrs.asdict(t, filter=lambda _, v: v is not None) for t in frame.tools] or None
        )
        presence = session._presence = PresenceKeeper(
            session.state.substrate, t, session.user_id, session.session_id, catalogue,
            on_superseded=session.stop_reading,
        )  # fmt: skip
        try:
            await presence.announce()
        except SubstrateUnavailable:
            raise EndSession(CLOSE_TRY_AGAIN_LATER, UNAVAILABLE_REASON) from None
        try:
            session.sleep = SleepRecord(
                session.state.substrate, session.user_id, session.state.wall_clock
            )
            await session.sleep.awake(frame)
        except BaseException:
            await presence.clear()  # no presence for a session that never ran
            raise
    # outside the admission: a peer that stops reading must not hold a slot
    welcome = Welcome(
        session_id=session.session_id,
        heartbeat_s=t.heartbeat_s,
        ping_interval_s=t.ping_interval_s,
        ping_timeout_s=t.ping_timeout_s,
    )
    try:
        await session.socket.send(session._encode(welcome))
    except BaseException:
        # Gone before its welcome (a reset, a cut): presence must not name a session
        # that never ran (callers were told "delivered, may be running" for up to the
        # presence TTL), and no older session is told it was superseded by it. An older
        # session of another process writes presence again at its next heartbeat.
        await presence.clear()
        raise
    for other in older:
        # Only once this session is welcomed: a newer sidecar refused with 1013 (Redis
        # down) or gone before its welcome must not close the working one with 4001,
        # which makes it stop for good. Same process: at once; other processes: at once
        # too, by the notice below. Another desktop of the user (both daemon ids known,
        # and different) is handed over as from another process: a job still running
        # on the old desktop at the end of its grace is answered in_doubt for good, never
        # redelivered to the new desktop, whose ledger has not seen it (found by review:
        # it ran a second time there).
        theirs = other.hello.daemon_id if other.hello is not None else None
        another = bool(frame.daemon_id and theirs and theirs != frame.daemon_id)
        other.supersede(local=not another)
        # The same daemon is back on this socket: its older socket is dead (a daemon
        # holds one session at a time; a half-open cut sent no FIN). End it now, after
        # presence names this session (its cleanup must not clear ours), instead of
        # after its ping deadline or the grace: its deliveries stay pending and this
        # session's drain redelivers them to the daemon's ledger at once (issue 16).
        same = other.hello is not None and other.hello.daemon_id == frame.daemon_id
        if frame.daemon_id and same:
            other.abandon()
    await presence.notify_replaced()
    log.info(
        "session %s: %s online (sidecar %s)",
        session.session_id,
        session.user_id,
        frame.sidecar_version,
        extra=fields(user_id=session.user_id, session_id=session.session_id),
    )
    return presence
