"""Issue 16 item 2: presence follows the process holding the socket, not the 30 s TTL.

A presence names its hub process (``"<holder>.<random>"``); the process keeps
``bridge:proc:{<holder>}`` alive (TTL 3 s, refreshed every second). When the process dies
without cleaning up (kill -9), its presences stop counting within the liveness TTL plus the
caller's 1 s cache, and calls are answered ``offline`` without enqueueing anything.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub import Bridge
from deskbridge_hub._retry import (
    HOLDER_ALIVE_CACHE_S,
    LIVENESS_RECHECK_S,
    PROCESS_LIVENESS_RETRY_S,
    PROCESS_LIVENESS_TTL_S,
)

from tests.hub.test_session import answer_jobs, connect, make_state, wall


async def test_a_dead_holders_presence_stops_counting_within_its_liveness_ttl(autojump_clock):
    state = make_state()  # presence TTL 30 s
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    await state.substrate.set_presence("u1", "deadbeef.0123", 30.0)
    await state.substrate.set_liveness("deadbeef", PROCESS_LIVENESS_TTL_S)  # its last refresh
    killed_at = trio.current_time()
    assert (await bridge.presence("u1")).online
    while (await bridge.presence("u1")).online:  # noqa: ASYNC110 - mock clock
        await trio.sleep(0.1)
    gone_after = trio.current_time() - killed_at
    assert gone_after <= PROCESS_LIVENESS_TTL_S + HOLDER_ALIVE_CACHE_S + LIVENESS_RECHECK_S + 0.1
    assert await state.substrate.get_presence("u1") == "deadbeef.0123"  # the key is still there
    outcome = await bridge.dispatch("u1", "echo", {})
    assert outcome.status == "offline" and outcome.job_id is None
    assert state.substrate.pending_count("u1") == 0


async def test_a_holder_whose_key_lapsed_in_an_outage_is_alive_once_it_rewrites_it(
    autojump_clock,
):
    """Redis refused writes past the liveness TTL, then takes them again: the holder's
    key is gone for up to ``PROCESS_LIVENESS_RETRY_S`` until its retry rewrites it. A
    caller in that instant read the holder dead and its desktop ``offline`` (a
    fault-injection helper: 6-7 per outage's end); the second look finds it alive."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    await state.substrate.set_presence("u1", "cafe.0123", 30.0)  # its key lapsed

    async def rewrite() -> None:
        await trio.sleep(PROCESS_LIVENESS_RETRY_S)  # the holder's retry
        await state.substrate.set_liveness("cafe", PROCESS_LIVENESS_TTL_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rewrite)
        presence = await bridge.presence("u1")
    assert presence.online and presence.session_id == "cafe.0123"


async def test_a_live_holder_keeps_its_presence_for_many_liveness_ttls(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, welcome = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [])
        for _ in range(60):
            await trio.sleep(1.7)
            presence = await bridge.presence("u1")
            assert presence.online and presence.session_id == welcome.session_id
        nursery.cancel_scope.cancel()


async def test_a_stopping_process_clears_its_liveness_at_once(autojump_clock):
    state = make_state()
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        assert await state.substrate.holder_alive(state.holder_id)
        nursery.cancel_scope.cancel()
    assert not await state.substrate.holder_alive(state.holder_id)


# -- issue 11 item 4: a session that ends on purpose mid-job still answers the caller ----


async def test_token_expiry_mid_job_answers_the_caller_in_doubt_at_once(autojump_clock):
    from deskbridge_common import CLOSE_TOKEN_EXPIRED
    from deskbridge_hub._session import serve_sidecar
    from deskbridge_hub.testing import socket_pair

    from tests.hub.test_session import Hello, Welcome

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    hub_side, peer = socket_pair()
    outcomes = []
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        expires = wall() + 20.0
        nursery.start_soon(lambda: serve_sidecar(state, hub_side, "u1", expires_at=expires))
        await peer.send(Hello(protocol_version=1, sidecar_version="test"))
        assert isinstance(await peer.receive(), Welcome)
        nursery.start_soon(answer_jobs, peer, [], 60.0)  # a 60 s job, token ends at 20 s

        async def call():
            outcomes.append(await bridge.dispatch("u1", "long", {}, timeout_s=300))

        nursery.start_soon(call)
        await peer.closed.wait()
        closed_at = trio.current_time()
        assert peer.close_code == CLOSE_TOKEN_EXPIRED
        while not outcomes:  # noqa: ASYNC110 - mock clock
            await trio.sleep(0.05)
        assert trio.current_time() - closed_at <= 1.0  # not the caller's 300 s
        (outcome,) = outcomes
        assert outcome.status == "in_doubt"
        assert outcome.detail["stage"] == "interrupted"
        assert outcome.detail["reason"] == "token expired"
        nursery.cancel_scope.cancel()


async def test_drain_past_the_grace_answers_running_jobs_in_doubt(autojump_clock):
    from deskbridge_hub._shutdown import drain

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    outcomes = []
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [], 600.0)

        async def call():
            outcomes.append(await bridge.dispatch("u1", "sleep", {}, timeout_s=900))

        nursery.start_soon(call)
        await trio.sleep(1)
        await drain(state, grace_s=5.0)
        drained_at = trio.current_time()
        while not outcomes:  # noqa: ASYNC110 - mock clock
            await trio.sleep(0.05)
        assert trio.current_time() - drained_at <= 1.0
        assert outcomes[0].status == "in_doubt"
        assert outcomes[0].detail["reason"] == "hub restarting"
        assert state.substrate.pending_count("u1") == 1  # the desktop's ledger answers later
        nursery.cancel_scope.cancel()


# -- issue 11 item 5: two sidecars for one user ------------------------------------------


async def test_sidecars_taking_over_from_each_other_are_warned_about_once(autojump_clock, caplog):
    import logging

    from deskbridge_common import CLOSE_SUPERSEDED

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    caplog.set_level(logging.INFO, logger="deskbridge.hub.presence")
    user = f"fight-{trio.current_time()}-{id(state)}"
    async with trio.open_nursery() as nursery:
        peers = []
        for _ in range(4):  # each newer sidecar takes over from the previous one
            peer, welcome = await connect(nursery, state, user=user)
            nursery.start_soon(answer_jobs, peer, [])
            peers.append(peer)
            await trio.testing.wait_all_tasks_blocked()
            presence = await bridge.presence(user)
            assert presence.session_id == welcome.session_id  # the newest holds it
        for older in peers[:-1]:
            assert older.close_code == CLOSE_SUPERSEDED
            assert older.close_reason == "superseded by a newer sidecar session"
        nursery.cancel_scope.cancel()
    records = [r for r in caplog.records if r.name == "deskbridge.hub.presence"]
    assert [r.levelno for r in records].count(logging.WARNING) == 1, records
    assert len(records) == 3


async def test_the_second_look_at_a_dead_holder_keeps_within_the_callers_time(autojump_clock):
    """A review: the 1 s second look made ``dispatch(timeout_s=0.2)`` answer after 1 s."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    await state.substrate.set_presence("u1", "deadbeef.0123", 30.0)  # its key long gone
    start = trio.current_time()
    outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=0.2)
    assert outcome.status == "offline"
    assert trio.current_time() - start <= 0.21
