"""Newest wins across processes (the supersede notice, docs/architecture.md) without
ending the wrong thing: a socket gone before its welcome leaves no presence and kicks
nobody; the same daemon back on its first process after passing through another gets
its job redelivered, never a final ``in_doubt``. Two ``HubState`` on one substrate are
two hub processes; found by a review of the notice (both failed before)."""

from __future__ import annotations

import trio
from deskbridge_common import (
    CLOSE_SUPERSEDED,
    Hello,
    Job,
    Timings,
    Welcome,
)
from deskbridge_hub import Bridge
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import socket_pair

from .test_session import answer_jobs, make_state, wall


def two_processes():
    sub = MemorySubstrate(clock=wall)
    t = Timings()
    first = HubState(substrate=sub, timings=t, consumer="hub-1", wall_clock=wall)
    second = HubState(substrate=sub, timings=t, consumer="hub-2", wall_clock=wall)
    return sub, t, first, second


async def quiet(fn, *args):
    try:
        await fn(*args)
    except BaseException:  # noqa: BLE001 - a session that died in its handshake
        pass


async def welcomed(nursery, state, daemon_id: str):
    """A sidecar of daemon ``daemon_id`` for u1 on ``state``'s process, welcomed."""
    hub_side, peer = socket_pair()
    nursery.start_soon(quiet, serve_sidecar, state, hub_side, "u1")
    await peer.send(Hello(protocol_version=1, sidecar_version="t", daemon_id=daemon_id))
    assert isinstance(await peer.receive(), Welcome)
    return peer


async def _same_daemon_back(*, through_process_2: bool):
    sub, t, s1, s2 = two_processes()
    bridge = Bridge(sub, t, wall_clock=wall)
    outcome = []
    async with trio.open_nursery() as nursery:
        await nursery.start(s1.reader.run)
        await nursery.start(s2.reader.run)
        peer_a = await welcomed(nursery, s1, "d1")

        async def call():
            outcome.append(
                await bridge.dispatch("u1", "echo", {}, idempotency_key="J", timeout_s=120)
            )

        nursery.start_soon(call)
        assert isinstance(await peer_a.receive(), Job)  # J runs; A's socket now half-open
        if through_process_2:
            hub_b, peer_b = socket_pair()
            nursery.start_soon(quiet, serve_sidecar, s2, hub_b, "u1")
            await peer_b.send(Hello(protocol_version=1, sidecar_version="t", daemon_id="d1"))
            await peer_b.disconnect()  # gone before its welcome: no takeover there
            await trio.sleep(1)
        peer_c = await welcomed(nursery, s1, "d1")  # d1 back on process 1
        got: list[Job] = []
        nursery.start_soon(answer_jobs, peer_c, got)
        with trio.fail_after(130):
            while not outcome:  # noqa: ASYNC110 - mock clock
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    return outcome[0], got


async def test_the_same_daemon_back_on_its_process_gets_its_job_redelivered(autojump_clock):
    result, got = await _same_daemon_back(through_process_2=False)
    assert [j.idempotency_key for j in got] == ["J"]
    assert result.status == "completed"


async def test_the_same_daemon_back_after_passing_through_another_process_too(autojump_clock):
    result, got = await _same_daemon_back(through_process_2=True)
    assert [j.idempotency_key for j in got] == ["J"], (result, got)
    assert result.status == "completed", result


async def test_a_socket_gone_before_the_welcome_leaves_no_presence(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        hub_side, peer = socket_pair()
        nursery.start_soon(quiet, serve_sidecar, state, hub_side, "u1")
        await peer.send(Hello(protocol_version=1, sidecar_version="t"))
        await peer.disconnect()
        await trio.sleep(5)
        assert state.sessions == {}
        presence = await bridge.presence("u1")
        assert not presence.online, presence  # it named a session that never ran
        outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5)
        assert outcome.status == "offline"  # the truth, at once
        nursery.cancel_scope.cancel()


async def test_a_socket_gone_before_its_welcome_on_another_process_kicks_nobody(autojump_clock):
    sub, t, s1, s2 = two_processes()
    bridge = Bridge(sub, t, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(s1.reader.run)
        await nursery.start(s2.reader.run)
        peer_a = await welcomed(nursery, s1, "d1")
        nursery.start_soon(answer_jobs, peer_a, [])
        hub_b, peer_b = socket_pair()
        nursery.start_soon(quiet, serve_sidecar, s2, hub_b, "u1")
        await peer_b.send(Hello(protocol_version=1, sidecar_version="t", daemon_id="d2"))
        await peer_b.disconnect()
        await trio.sleep(2)
        assert not peer_a.closed.is_set()  # the working desktop stays
        # its heartbeat writes presence back (the gone one's was cleared)
        await trio.sleep(t.heartbeat_s + 1)
        presence = await bridge.presence("u1")
        assert presence.online and presence.session_id in s1.sessions, presence
        outcome = await bridge.dispatch("u1", "echo", {"k": 1}, timeout_s=5)
        assert outcome.status == "completed", outcome
        assert not peer_a.closed.is_set() or peer_a.close_code != CLOSE_SUPERSEDED
        nursery.cancel_scope.cancel()
