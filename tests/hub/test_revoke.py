"""Revoking one user's sidecar tokens (``_revocation``), in process on MockClock: a live
session holding a revoked token is closed with 4003 and a reason saying so, by the
holder process's notice at once or by its sweep within a heartbeat when the notice is
lost; a token issued after the cut-off is not affected; the handshake refuses a revoked
token with 401 (the sidecar stops on it) and reads one record for it; idle sessions cost
no revocation command each. Real Redis and real processes: tests/integration/test_revoke.py."""

from __future__ import annotations

import datetime
import json
import time
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_common import (
    CLOSE_TOKEN_EXPIRED,
    CLOSE_TRY_AGAIN_LATER,
    Hello,
    Ping,
    Pong,
    Timings,
    Welcome,
    decode_frame,
    encode_frame,
)
from deskbridge_hub import HubConfig, create_app, issue_token
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._revocation import revoke_user
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub._substrate_values import Revocation
from deskbridge_hub.testing import MemoryPeer, socket_pair
from quart.testing.connections import WebsocketDisconnectError, WebsocketResponseError

EPOCH = 1_700_000_000.0
SECRET = "revoke-test-secret-0123456789abcdef0123456"
AUTH = {"Authorization": "Bearer k1"}


def wall() -> float:
    return EPOCH + trio.current_time()


def make_state(substrate: Any = None) -> HubState:
    return HubState(
        substrate=substrate or MemorySubstrate(clock=wall),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=wall,
    )


async def connect(
    nursery: trio.Nursery, state: HubState, user: str, issued_at: float
) -> MemoryPeer:
    hub_side, peer = socket_pair()
    if not state.reader.running:
        await nursery.start(state.reader.run)
    nursery.start_soon(lambda: serve_sidecar(state, hub_side, user, issued_at=issued_at))
    await peer.send(Hello(protocol_version=1, sidecar_version="test"))
    assert isinstance(await peer.receive(), Welcome)
    nursery.start_soon(pong, peer)
    return peer


async def pong(peer: MemoryPeer) -> None:
    """Answer the hub's pings (an idle, healthy sidecar)."""
    try:
        async for raw in peer._inbox:
            frame = decode_frame(raw)
            if isinstance(frame, Ping):
                await peer.send(Pong(frame.nonce))
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


async def test_revoking_a_user_closes_its_live_session_at_once_with_4003_saying_revoked(
    autojump_clock,
):
    state = make_state()
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, "u1", issued_at=wall() - 60)
        other = await connect(nursery, state, "u2", issued_at=wall() - 60)
        await trio.sleep(5)
        start = trio.current_time()
        done = await revoke_user(state.substrate, "u1", now_s=wall())
        assert done.holder is not None and done.notified
        with trio.fail_after(1):  # the notice, not the sweep (a heartbeat: 30 s)
            await peer.closed.wait()
        assert trio.current_time() - start < 1
        assert peer.close_code == CLOSE_TOKEN_EXPIRED
        assert "revoked" in (peer.close_reason or "")
        await trio.testing.wait_all_tasks_blocked()
        assert await state.substrate.get_presence("u1") is None
        assert not other.closed.is_set()  # another user's session is not touched
        nursery.cancel_scope.cancel()


async def test_a_session_whose_token_was_issued_after_the_cut_off_stays(autojump_clock):
    state = make_state()
    async with trio.open_nursery() as nursery:
        await trio.sleep(10)
        done = await revoke_user(state.substrate, "u1", now_s=wall())
        await trio.sleep(2)
        # issued after the revocation (its iat is at or after the cut-off)
        peer = await connect(nursery, state, "u1", issued_at=done.revocation.before_s)
        await revoke_user_notice_again(state, "u1", done.revocation)
        await trio.sleep(state.timings.heartbeat_s * 2)  # notice and sweeps both seen
        assert not peer.closed.is_set()
        nursery.cancel_scope.cancel()


async def revoke_user_notice_again(state: HubState, user: str, revocation: Revocation) -> None:
    holder = await state.substrate.get_presence(user)
    assert holder is not None
    await state.substrate.notify_revoked(
        holder.rpartition(".")[0], user, revocation.before_s, ttl_s=30
    )


async def test_a_lost_notice_is_made_up_by_the_process_sweep_within_a_heartbeat(autojump_clock):
    """The record written, the notice never sent (the revoking command died, or the
    holder changed meanwhile): the holder's sweep, one read per process and heartbeat,
    closes the session."""
    state = make_state()
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, "u1", issued_at=wall() - 60)
        now = wall()
        await state.substrate.revoke_tokens("u1", Revocation(before_s=now, at_s=now))
        start = trio.current_time()
        with trio.fail_after(state.timings.heartbeat_s + 1):
            await peer.closed.wait()
        assert trio.current_time() - start <= state.timings.heartbeat_s + 0.5
        assert peer.close_code == CLOSE_TOKEN_EXPIRED
        assert "revoked" in (peer.close_reason or "")
        nursery.cancel_scope.cancel()


async def test_idle_sessions_cost_no_revocation_command_each(autojump_clock):
    """Off the idle path: over three heartbeats, 20 idle desktops cost the sweep's one
    read per heartbeat for the whole process, and no per-desktop revocation read."""
    substrate = MemorySubstrate(clock=wall)
    calls: Counter[str] = Counter()
    for name in ("get_revocation", "recent_revocations"):
        method = getattr(substrate, name)

        def counted(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
            calls[_n] += 1
            return _m(*args, **kwargs)

        setattr(substrate, name, counted)
    state = make_state(substrate)
    async with trio.open_nursery() as nursery:
        for i in range(20):
            await connect(nursery, state, f"u{i}", issued_at=wall())
        calls.clear()
        beats = 3
        await trio.sleep(state.timings.heartbeat_s * beats)
        assert calls["get_revocation"] == 0
        assert 1 <= calls["recent_revocations"] <= beats + 1
        nursery.cancel_scope.cancel()


# -- the handshake (the ASGI entry) --------------------------------------------------------


async def _upgrade(client: Any, token: str) -> tuple[int, Any]:
    """101 and the welcome's session id, or the refusal's status and JSON body."""
    headers = {"Authorization": f"Bearer {token}"}
    async with client.websocket("/v1/sidecar", headers=headers) as ws:
        try:
            await ws.send(encode_frame(Hello(protocol_version=1, sidecar_version="t")))
            welcome = decode_frame(await ws.receive())
        except WebsocketResponseError as exc:
            response = exc.response
            return response.status_code, json.loads(await response.get_data(as_text=True))
        assert isinstance(welcome, Welcome)
        return 101, welcome.session_id


async def test_the_handshake_refuses_a_revoked_token_with_401_and_takes_one_issued_after(
    autojump_clock,
):
    """Tokens are verified on the wall clock (``time.time``), as the hub does."""
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(SECRET,), api_keys=("k1",)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        old = issue_token(SECRET, "alice", now=time.time() - 60)
        status, _ = await _upgrade(client, old)
        assert status == 101
        done = await revoke_user(substrate, "alice", now_s=time.time())
        status, body = await _upgrade(client, old)
        assert status == 401  # final for the sidecar: it stops retrying
        assert isinstance(body, dict) and body["error"]["code"] == "unauthorized"
        assert "revoked" in body["error"]["message"]
        assert await substrate.get_presence("alice") is None  # nothing written
        # another user's token is not affected
        assert (await _upgrade(client, issue_token(SECRET, "bob", now=time.time() - 60)))[0] == 101
        # re-issued after the revocation (``iat`` at the cut-off): accepted
        token = issue_token(SECRET, "alice", now=done.revocation.before_s)
        assert (await _upgrade(client, token))[0] == 101


async def test_a_token_without_iat_is_refused_once_its_user_is_revoked(autojump_clock):
    import jwt
    from deskbridge_hub._tokens import key_id

    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(SECRET,), api_keys=("k1",)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        token = jwt.encode(
            {"sub": "alice", "exp": int(time.time() + 3600)},
            SECRET,
            algorithm="HS256",
            headers={"kid": key_id(SECRET)},
        )
        assert (await _upgrade(client, token))[0] == 101
        await revoke_user(substrate, "alice", now_s=time.time())
        assert (await _upgrade(client, token))[0] == 401  # when it was issued is unknown


async def test_the_handshake_closes_1013_when_the_revocation_cannot_be_read(autojump_clock):
    """As when the handshake's other Redis work fails (docs/protocol.md): the sidecar
    retries within its short window; nothing is let in unchecked."""
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(SECRET,), api_keys=("k1",)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        substrate.set_unavailable(True)
        token = issue_token(SECRET, "alice", now=time.time())
        async with client.websocket(
            "/v1/sidecar", headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            with pytest.raises(WebsocketDisconnectError) as info:
                await ws.receive()
        assert info.value.args[0] == CLOSE_TRY_AGAIN_LATER
        assert "revoked" not in str(info.value.args)


async def test_inspect_user_shows_the_revocation(autojump_clock):
    from deskbridge_hub._inspect_cli import user_text

    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(SECRET,), api_keys=("k1",)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        body = await (await client.get("/v1/admin/users/alice", headers=AUTH)).get_json()
        assert body["revoked"] is None
        assert "revoked" not in user_text(body)
        done = await revoke_user(substrate, "alice", now_s=time.time())
        body = await (await client.get("/v1/admin/users/alice", headers=AUTH)).get_json()
        assert body["revoked"] == {
            "before": done.revocation.before_s,
            "at": done.revocation.at_s,
        }
        text = user_text(body)
        before = datetime.datetime.fromtimestamp(done.revocation.before_s, datetime.UTC)
        assert "revoked" in text and before.strftime("%Y-%m-%d %H:%M:%S") in text


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.999])
async def test_the_cut_off_is_the_next_whole_second(autojump_clock, fraction):
    """``iat`` is whole seconds: every token issued up to the revoking second is
    refused, and one issued from the next second on is not."""
    substrate = MemorySubstrate()
    now = EPOCH + 100 + fraction
    done = await revoke_user(substrate, "u1", now_s=now)
    assert done.revocation.before_s == EPOCH + 101
    assert done.revocation.at_s == now
