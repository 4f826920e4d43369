"""Ending on purpose (issue 11 item 4): SIGTERM / Ctrl-C mid-job. The running tool may
finish within the grace; past it, the hub is told ``in_doubt`` at once (so its caller is
answered within a second, not at its timeout) and the ledger says so; queued jobs never
start and stay with the hub for the next session."""

from __future__ import annotations

import pytest
import trio
from deskbridge_sidecar import tool
from deskbridge_sidecar._ledger import Ledger

from .conftest import settle


def slow_tool(seconds: float):
    calls: list[str] = []

    @tool(side_effects=True)
    async def submit(form: str) -> dict:
        calls.append(form)
        await trio.sleep(seconds)
        calls.append(f"{form} done")
        return {"submitted": form}

    return submit, calls


async def test_a_tool_that_finishes_within_the_grace_is_answered_then_the_sidecar_stops(
    autojump_clock, nursery, start_daemon
):
    submit, calls = slow_tool(5)
    daemon, s = await start_daemon(tools=[submit])
    job = await s.send_job("submit", {"form": "a"}, key="k-a")
    await settle()
    await daemon.shutdown(20, why="the sidecar was stopped (SIGTERM)")
    result = await s.wait_result(job.id)
    assert result.ok and trio.current_time() == pytest.approx(5, abs=0.05)
    closed = await s.wait_closed()
    assert (closed.by, closed.code) == ("sidecar", 1001)
    assert calls == ["a", "a done"]


async def test_past_the_grace_the_hub_is_told_in_doubt_at_once(autojump_clock, start_daemon):
    submit, calls = slow_tool(300)
    ledger = Ledger.memory()
    daemon, s = await start_daemon(tools=[submit], ledger=ledger)
    running = await s.send_job("submit", {"form": "a"}, key="k-run")
    queued = await s.send_job("submit", {"form": "b"}, key="k-queued")
    await settle()
    await daemon.shutdown(2, why="the sidecar was stopped (SIGTERM)")
    result = await s.wait_result(running.id)
    assert trio.current_time() == pytest.approx(2, abs=0.05)  # at the end of the grace, not at 300
    assert not result.ok and result.error.code == "in_doubt"
    assert "was running when the sidecar was stopped (SIGTERM)" in result.error.message
    closed = await s.wait_closed()
    assert closed.code == 1001
    assert queued.id not in s.results  # left to the hub: redelivered to the next session
    assert calls == ["a"]  # b never started; a was given up, not finished
    entry = await ledger.get("k-run")
    assert entry.outcome.code == "in_doubt"  # a redelivery after a restart says the same
    assert await ledger.get("k-queued") is None


async def test_a_second_signal_ends_the_grace(autojump_clock, nursery, start_daemon):
    submit, calls = slow_tool(300)
    daemon, s = await start_daemon(tools=[submit])
    job = await s.send_job("submit", {"form": "a"}, key="k-a")
    await settle()
    now = trio.Event()
    nursery.start_soon(lambda: daemon.shutdown(60, why="Ctrl-C", now=now))
    await trio.sleep(1)
    now.set()
    result = await s.wait_result(job.id)
    assert result.error.code == "in_doubt" and trio.current_time() == pytest.approx(1, abs=0.05)


async def test_idle_shutdown_stops_at_once(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    await daemon.shutdown(20, why="SIGTERM")
    closed = await s.wait_closed()
    assert closed.code == 1001 and trio.current_time() == 0
