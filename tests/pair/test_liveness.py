"""Liveness with the real sidecar against the real hub, in-process (tests/pair/__init__.py): long
tools never starve status, pings or presence (invariant 4)."""

from __future__ import annotations

import trio

from tests.pair import sidecar_pair


async def test_status_is_answered_at_once_while_a_long_tool_runs(autojump_clock):
    async with sidecar_pair() as pair:
        results = {}

        async def long_job():
            results["sleep"] = await pair.bridge.dispatch("u1", "sleep", {"seconds": 60})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_job)
            await trio.sleep(5)
            asked = trio.current_time()
            status = await pair.bridge.status("u1")
            assert trio.current_time() == asked  # not queued behind the 60 s tool
            assert status.status == "completed" and status.result["running"] == "sleep"
        assert results["sleep"].status == "completed"
        assert results["sleep"].result == {"slept_s": 60}


async def test_a_ten_minute_tool_keeps_one_session_and_presence(autojump_clock):
    """Pings both ways and heartbeats flow while a tool runs for 600 s: no ping timeout,
    no reconnect, presence never lapses."""
    async with sidecar_pair() as pair:
        first = pair.daemon.statistics().session_id
        lapses = []

        async def watch_presence():
            while True:
                if not (await pair.bridge.presence("u1")).online:
                    lapses.append(trio.current_time())
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_presence)
            outcome = await pair.bridge.dispatch("u1", "sleep", {"seconds": 600}, timeout_s=700)
            nursery.cancel_scope.cancel()
        assert outcome.status == "completed"
        stats = pair.daemon.statistics()
        assert stats.session_id == first and stats.sessions_started == 1
        assert lapses == []


async def test_presence_clears_when_the_sidecar_goes_away_and_returns_with_it(autojump_clock):
    async with sidecar_pair() as pair:
        assert (await pair.bridge.presence("u1")).online
        pair.connector.down = True
        pair.drop()
        await trio.sleep(1)
        assert not (await pair.bridge.presence("u1")).online
        offline = await pair.bridge.dispatch("u1", "echo", {})
        assert offline.status == "offline"
        pair.connector.down = False
        await pair.wait_session(2)
        assert (await pair.bridge.presence("u1")).online
        echo = await pair.bridge.dispatch("u1", "echo", {"back": True})
        assert echo.status == "completed" and echo.result == {"back": True}


async def test_an_idle_real_sidecar_is_never_pinged_by_the_hub(autojump_clock):
    """Two frames an interval per idle desktop, not four: the real sidecar pings an
    interval after its last pong, and the hub takes those pings as proof of life
    instead of pinging back (it did, every interval: issue 10's idle cost)."""
    async with sidecar_pair() as pair:
        t = pair.state.timings
        await trio.sleep(10 * t.ping_interval_s + 1)
        (session,) = pair.state.sessions.values()
        assert session._pings_sent == 0
        assert session._peer_pings
        assert pair.daemon.statistics().sessions_started == 1  # and the session stands
