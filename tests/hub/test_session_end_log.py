"""A session's end line says why it ended (newcomer walk-through): a graceful restart
(1012) and an abandoned socket (its daemon came back on a newer one) logged "ends (socket
gone)" and recorded that in the admin directory, as for a socket that vanished.
MemorySubstrate, memory sockets, MockClock (autojump)."""

from __future__ import annotations

import json
import logging

import trio
import trio.testing
from deskbridge_common import CLOSE_SERVICE_RESTART, Hello, Timings, Welcome
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub._shutdown import drain
from deskbridge_hub.testing import socket_pair

SESSION_LOG = "deskbridge.hub.session"


def make_state() -> HubState:
    return HubState(
        substrate=MemorySubstrate(clock=trio.current_time),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=trio.current_time,
    )


async def connect(nursery, state, daemon_id=None):
    hub_side, peer = socket_pair()
    if not state.reader.running:
        await nursery.start(state.reader.run)
    nursery.start_soon(serve_sidecar, state, hub_side, "u1")
    await peer.send(Hello(protocol_version=1, sidecar_version="test", daemon_id=daemon_id))
    welcome = await peer.receive()
    assert isinstance(welcome, Welcome)
    return peer, welcome.session_id


def ends(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == SESSION_LOG and " ends" in r.getMessage()
    ]


async def recorded_end(state, session_id):
    page = await state.substrate.list_desktops(offset=0, limit=10)
    ((_, info, _, _),) = await state.substrate.desktops_info([u for u, _ in page.rows])
    record = json.loads(info)
    assert record["session_id"] == session_id
    return record["end"]


async def test_a_graceful_restart_says_1012_hub_restarting(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger=SESSION_LOG)
    state = make_state()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peer, sid = await connect(nursery, state)
            await drain(state, grace_s=5.0)
            await trio.testing.wait_all_tasks_blocked()
            assert peer.close_code == CLOSE_SERVICE_RESTART
            assert ends(caplog) == [f"session {sid} of u1 ends: 1012 hub restarting"]
            assert await recorded_end(state, sid) == {"code": 1012, "reason": "hub restarting"}
            nursery.cancel_scope.cancel()


async def test_an_abandoned_session_says_its_daemon_is_back(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger=SESSION_LOG)
    state = make_state()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, old = await connect(nursery, state, daemon_id="d1")
            _, new = await connect(nursery, state, daemon_id="d1")
            await trio.testing.wait_all_tasks_blocked()
            assert ends(caplog) == [
                f"session {old} of u1 ends: abandoned: its daemon is back on a newer socket"
            ]
            nursery.cancel_scope.cancel()
    assert new != old
