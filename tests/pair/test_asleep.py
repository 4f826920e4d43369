"""Sleep-aware presence (issue 12.6), end to end on MockClock: the real sidecar daemon
against the real hub session and Bridge, with a wall clock that can jump (a lid closed:
the wall clock moves, trio's does not)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import Bridge
from deskbridge_hub._asleep import RECENT_SLEEP_S
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState
from deskbridge_sidecar import Daemon, ToolRegistry

from tests.pair import EPOCH, TOKEN, USER, PairConnector

TIMINGS = Timings()


class Wall:
    """Unix time following trio's clock, plus whatever the machine slept."""

    def __init__(self) -> None:
        self.slept_s = 0.0

    def __call__(self) -> float:
        return EPOCH + trio.current_time() + self.slept_s

    def jump(self, seconds: float) -> None:
        self.slept_s += seconds


async def _status(bridge: Bridge) -> str:
    return (await bridge.presence(USER)).status


async def _wait_status(bridge: Bridge, status: str, *, within_s: float = 60) -> None:
    with trio.fail_after(within_s):
        while await _status(bridge) != status:  # noqa: ASYNC110 - polling what callers see
            await trio.sleep(0.1)


async def _run(scenario) -> None:
    wall = Wall()
    substrate = MemorySubstrate(clock=wall)
    state = HubState(substrate=substrate, timings=TIMINGS, consumer="hub-1", wall_clock=wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        connector = PairConnector(state, nursery, USER)
        daemon = Daemon(
            "ws://hub.pair:8080", TOKEN, registry=ToolRegistry([]), timings=TIMINGS,
            wall_clock=wall, connector=connector, random=lambda: 0.5,
        )  # fmt: skip
        await nursery.start(daemon.run)
        bridge = Bridge(substrate, TIMINGS, wall_clock=wall)
        await scenario(bridge, daemon, connector, wall, substrate)
        nursery.cancel_scope.cancel()


async def test_an_announced_sleep_reads_asleep_at_once_until_the_wake_up(autojump_clock):
    async def scenario(bridge, daemon, connector, wall, substrate):
        assert (await bridge.presence(USER)).status == "online"
        said_at = wall()
        daemon.going_to_sleep()
        await _wait_status(bridge, "asleep", within_s=1)  # not at the ping timeout
        presence = await bridge.presence(USER)
        assert presence.online is False
        assert said_at <= presence.asleep_since <= said_at + 1
        outcome = await bridge.dispatch(USER, "echo", {"x": 1}, timeout_s=30)
        assert outcome.status == "offline"  # the public status; the reason says more
        assert outcome.detail == {"reason": "asleep", "since": presence.asleep_since}
        assert "asleep" in outcome.error["message"]
        await trio.sleep(50)  # asleep it stays (no reconnect while going to sleep)
        assert await _status(bridge) == "asleep"
        wall.jump(8 * 3600)  # a night
        await _wait_status(bridge, "online", within_s=5)
        assert await substrate.get_asleep(USER) is None  # the session start cleared it
        assert (await bridge.dispatch(USER, "echo", {"x": 2})).result == {"x": 2}

    await _run(scenario)


async def test_a_socket_missing_soon_after_a_detected_sleep_reads_asleep(autojump_clock):
    async def scenario(bridge, daemon, connector, wall, substrate):
        await trio.sleep(3.5)
        wall.jump(1800)  # the lid was closed, no notification: the watchdog notices after
        await _wait_status(bridge, "online")
        with trio.fail_after(10):
            while daemon.statistics().sessions_started < 2:  # noqa: ASYNC110 - test poll
                await trio.sleep(0.1)
        await trio.sleep(60)
        connector.down = True  # the lid closed again (no notification): the socket dies
        gone_at = wall()
        connector.sockets[-1].abort()
        await _wait_status(bridge, "asleep", within_s=1)
        presence = await bridge.presence(USER)
        assert gone_at <= presence.asleep_since <= gone_at + 1
        await trio.sleep(RECENT_SLEEP_S + 1)  # a detection is short-lived
        assert await _status(bridge) == "offline"

    await _run(scenario)


async def test_a_socket_missing_without_any_sleep_reads_offline(autojump_clock):
    async def scenario(bridge, daemon, connector, wall, substrate):
        await trio.sleep(60)
        connector.down = True
        connector.sockets[-1].abort()
        await _wait_status(bridge, "offline", within_s=1)
        outcome = await bridge.dispatch(USER, "echo", {})
        assert outcome.status == "offline" and outcome.detail == {}
        assert outcome.error == {"code": "offline", "message": f"desktop of {USER} is offline"}

    await _run(scenario)


async def test_a_detected_sleep_long_ago_does_not_make_a_later_drop_asleep(autojump_clock):
    async def scenario(bridge, daemon, connector, wall, substrate):
        await trio.sleep(3.5)
        wall.jump(1800)
        await _wait_status(bridge, "online")
        await trio.sleep(RECENT_SLEEP_S + 10)  # awake and connected for a long while
        connector.down = True
        connector.sockets[-1].abort()
        await _wait_status(bridge, "offline", within_s=1)

    await _run(scenario)
