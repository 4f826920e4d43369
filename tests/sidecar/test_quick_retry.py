"""Reconnecting after a hub restart (1012/1001): the restarting process itself refuses
(503 while draining) or drops the next attempts; a few quick retries with 0-100 ms of
jitter land on a live replica before full-jitter backoff takes over. Plus the real
connector's prompt failure when the server closes during the upgrade."""

from __future__ import annotations

import functools

import pytest
import trio
from deskbridge_sidecar import (
    ConnectFailed,
    TokenRefused,
    WebSocketConnector,
    WebSocketSettings,
)
from deskbridge_sidecar._daemon import QUICK_RETRIES, QUICK_RETRY_JITTER_S

from .conftest import make_daemon

JITTER = 0.999


def _gaps(attempts) -> list[float]:
    return [b.at - a.at for a, b in zip(attempts, attempts[1:], strict=False)]


@pytest.mark.parametrize("code", [1012, 1001])
@pytest.mark.parametrize("status", [503, 502, 504])
async def test_a_draining_hub_is_retried_quickly_after_a_restart_close(
    autojump_clock, start_daemon, hub, code, status
):
    daemon, s = await start_daemon(random=lambda: JITTER)
    await trio.sleep(3)
    hub.reject_status = status
    await s.close(code, "hub restarting")
    await hub.wait_attempts(1 + 1 + 2)  # first session, at-once retry, two quick retries
    hub.reject_status = None
    second = await hub.next_session()
    attempts = hub.attempts
    assert [a.outcome for a in attempts] == ["accepted"] + [f"rejected {status}"] * 3 + ["accepted"]
    assert attempts[1].at == s.closed.at  # at once
    assert _gaps(attempts)[1:] == pytest.approx([JITTER * QUICK_RETRY_JITTER_S] * 3)
    assert second.attempt.at - s.closed.at == pytest.approx(3 * JITTER * QUICK_RETRY_JITTER_S)
    assert daemon.statistics().sessions_started == 2


async def test_quick_retries_are_bounded_then_backoff(autojump_clock, start_daemon, hub):
    daemon, s = await start_daemon(random=lambda: JITTER)
    hub.reject_status = 503
    await s.close(1012, "hub restarting")
    attempts = await hub.wait_attempts(1 + 1 + QUICK_RETRIES + 3)
    gaps = _gaps(attempts)
    quick = [JITTER * QUICK_RETRY_JITTER_S] * QUICK_RETRIES
    assert gaps[1:] == pytest.approx(quick + [JITTER * 0.5, JITTER * 1, JITTER * 2])


async def test_connection_failures_are_retried_quickly_after_a_restart_close(
    autojump_clock, start_daemon, hub
):
    daemon, s = await start_daemon(random=lambda: JITTER)
    hub.down = True
    await s.close(1012, "hub restarting")
    await hub.wait_attempts(3)
    hub.down = False
    second = await hub.next_session()
    assert [a.outcome for a in hub.attempts] == ["accepted", "down", "down", "accepted"]
    assert second.attempt.at - s.closed.at == pytest.approx(2 * JITTER * QUICK_RETRY_JITTER_S)


async def test_without_a_restart_close_503_backs_off(autojump_clock, nursery, hub, wall):
    hub.reject_status = 503
    daemon = make_daemon(hub, wall, random=lambda: JITTER)
    nursery.start_soon(daemon.run)
    attempts = await hub.wait_attempts(4)
    assert _gaps(attempts) == pytest.approx([JITTER * 0.5, JITTER * 1, JITTER * 2])


@pytest.mark.parametrize("code", [1000, 4002, 1006])
async def test_other_closes_get_no_quick_retries(autojump_clock, start_daemon, hub, code):
    daemon, s = await start_daemon(random=lambda: JITTER)
    hub.reject_status = 503
    if code == 1006:
        s.abort()
    else:
        await s.close(code, "bye")
    attempts = await hub.wait_attempts(4)
    assert _gaps(attempts)[1:] == pytest.approx([JITTER * 1, JITTER * 2])
    assert attempts[1].at - s.closed.at == pytest.approx(JITTER * 0.5)


async def test_a_token_refused_after_a_restart_still_stops(autojump_clock, nursery, hub, wall):
    daemon = make_daemon(hub, wall)
    refused: list[TokenRefused] = []

    async def run() -> None:
        try:
            await daemon.run()
        except TokenRefused as exc:
            refused.append(exc)

    nursery.start_soon(run)
    s = await hub.next_session()
    hub.reject_status = 403
    await s.close(1012, "hub restarting")
    await hub.wait_attempts(2)
    await trio.sleep(60)
    assert len(hub.attempts) == 2
    assert [r.status_code for r in refused] == [403]


async def test_a_server_that_closes_during_the_upgrade_fails_at_once(nursery):
    """A hub worker that accepted the TCP connection and then exited: ConnectFailed at
    once, not after connect_timeout_s (trio-websocket alone would wait for it)."""

    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the upgrade request
        await stream.aclose()

    with trio.fail_after(10):
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        connector = WebSocketConnector(settings=WebSocketSettings(connect_timeout_s=5.0))
        started = trio.current_time()
        with pytest.raises(ConnectFailed, match="closed the connection during the WebSocket"):
            async with connector.connect(f"ws://127.0.0.1:{port}/v1/sidecar", []):
                pytest.fail("upgraded by a server that hung up")
        assert trio.current_time() - started < 1.0
