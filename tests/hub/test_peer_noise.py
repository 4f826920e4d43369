"""One sidecar cannot make the hub write a log line per frame it refuses or ignores
(``_peer_noise``): a budget per session, on trio's MockClock."""

from __future__ import annotations

import logging

import trio
import trio.testing
from deskbridge_common import Error, Hello, JobResult, Ping, Pong, Timings, Welcome, decode_frame
from deskbridge_hub import Bridge
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._peer_noise import BURST, INTERVAL_S, LogBudget
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import socket_pair

EPOCH = 1_700_000_000.0


def test_the_budget_logs_a_burst_then_one_line_an_interval_counting_what_it_left_out():
    budget = LogBudget(burst=3, interval_s=60.0)
    assert [budget.admit(0.0) for _ in range(3)] == [0, 0, 0]
    assert budget.admit(0.0) == 0  # the first after the burst: nothing left out yet
    assert [budget.admit(1.0) for _ in range(5)] == [None] * 5
    assert budget.held() == 5
    assert budget.admit(59.9) is None
    assert budget.admit(60.0) == 6  # one interval after the last line logged
    assert budget.held() == 0
    assert budget.admit(60.0) is None


def _wall() -> float:
    return EPOCH + trio.current_time()


async def _pong(peer) -> None:
    """Keep the flooding peer alive: answer the hub's pings."""
    async for raw in peer._inbox:
        frame = decode_frame(raw)
        if isinstance(frame, Ping):
            await peer.send(Pong(frame.nonce))


async def _flood(frames: int, caplog_records: list[logging.LogRecord]) -> None:
    state = HubState(
        substrate=MemorySubstrate(clock=_wall), timings=Timings(), consumer="hub-1",
        wall_clock=_wall,
    )  # fmt: skip
    bridge = Bridge(state.substrate, state.timings, wall_clock=_wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        for user in ("evil", "good"):
            hub_side, peer = socket_pair()
            nursery.start_soon(serve_sidecar, state, hub_side, user)
            await peer.send(Hello(protocol_version=1, sidecar_version="t"))
            assert isinstance(await peer.receive(), Welcome)
            if user == "evil":
                evil = peer
                nursery.start_soon(_pong, peer)
        for i in range(frames):
            await evil.send(JobResult(f"never-{i}", True, 1))
            await evil.send(Pong(f"no-ping-{i}"))
            await evil.send(Error("noise", f"n{i}"))
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(INTERVAL_S)  # one more line may follow, counting the rest
        await evil.send(JobResult("late", True, 1))
        await trio.testing.wait_all_tasks_blocked()
        del bridge
        nursery.cancel_scope.cancel()


def test_a_flood_of_refused_and_ignored_frames_writes_a_bounded_number_of_lines(caplog):
    """Before: one line per frame (3,000 here); one token wrote the shared log as fast as
    it could send (18,800 WARNING lines in 4 s against a real hub)."""
    caplog.set_level(logging.DEBUG, logger="deskbridge.hub.session")
    trio.run(_flood, 1000, caplog.records, clock=trio.testing.MockClock(autojump_threshold=0))
    about_frames = [
        r.getMessage()
        for r in caplog.records
        if "evil" not in r.getMessage() and "session" in r.getMessage()
        and ("refused" in r.getMessage() or "ignored" in r.getMessage()
             or "sidecar says" in r.getMessage())
    ]  # fmt: skip
    assert BURST <= len(about_frames) <= BURST + 2, len(about_frames)
    assert any("left out" in line for line in about_frames), about_frames[-3:]
