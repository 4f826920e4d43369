"""``catalogue_changed`` across restarts, with the real Daemon against the FakeHub on
MockClock: a queued job meets the tool the hub validated it against, or is refused.

The hub validates a call against the catalogue of the last *welcomed* hello. The sidecar
used to store each start's fingerprints at start-up, welcomed or not, and to compare only
with the run just before: a restart the hub never heard of (hub unreachable, stopped at
once) used the change up, and so did a welcomed restart stopped before the old jobs came.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from deskbridge_sidecar import Tool
from deskbridge_sidecar._ledger import Ledger
from deskbridge_sidecar.testing import FakeHub, FakeWallClock

from .conftest import make_daemon

#: a job enqueued this long before it is delivered (``waited_s``): before any restart here
OLD_S = 3000.0


def _submit(config: str, runs: list[tuple[str, Any]]) -> Tool:
    """A tool named ``submit`` whose configuration (a toolset's root, origins) is
    ``config``: what a queued call means depends on it."""

    async def submit(form: str = "") -> str:
        runs.append((config, form))
        return config

    return attrs.evolve(Tool.from_function(submit), config=config)


async def _welcomed(
    nursery: trio.Nursery, hub: FakeHub, wall: FakeWallClock, ledger: Ledger, config: str,
    runs: list[tuple[str, Any]],
):  # fmt: skip
    daemon = make_daemon(hub, wall, tools=[_submit(config, runs)], ledger=ledger)
    await nursery.start(daemon.run)
    return daemon, await hub.next_session()


async def _never_welcomed(
    nursery: trio.Nursery, hub: FakeHub, wall: FakeWallClock, ledger: Ledger, config: str
) -> None:
    """A start the hub never hears of (unreachable), stopped after a while."""
    hub.down = True
    daemon = make_daemon(hub, wall, tools=[_submit(config, [])], ledger=ledger)
    nursery.start_soon(daemon.run)
    await trio.sleep(30)
    assert daemon.statistics().sessions_started == 0
    daemon.stop()
    await trio.sleep(1)
    hub.down = False


async def _stop(daemon) -> None:
    daemon.stop()
    await trio.sleep(1)


async def test_a_change_outlives_a_restart_the_hub_never_welcomed(
    autojump_clock, nursery, hub, wall
):
    runs: list[tuple[str, Any]] = []
    ledger = Ledger.memory(wall_clock=wall)
    first, _ = await _welcomed(nursery, hub, wall, ledger, "root-a", runs)  # hub: root a
    await _stop(first)
    await _never_welcomed(nursery, hub, wall, ledger, "root-b")
    third, s = await _welcomed(nursery, hub, wall, ledger, "root-b", runs)
    await trio.sleep(5)
    old = await s.send_job("submit", {"form": "for a"}, waited_s=OLD_S)
    result = await s.wait_result(old.id)
    assert not result.ok and result.error is not None
    assert result.error.code == "catalogue_changed"
    new = await s.send_job("submit", {"form": "for b"}, waited_s=1.0)  # after the welcome
    assert (await s.wait_result(new.id)).ok
    assert runs == [("root-b", "for b")]


async def test_a_change_outlives_a_welcomed_restart_stopped_before_the_old_jobs_came(
    autojump_clock, nursery, hub, wall
):
    runs: list[tuple[str, Any]] = []
    ledger = Ledger.memory(wall_clock=wall)
    first, _ = await _welcomed(nursery, hub, wall, ledger, "root-a", runs)
    await _stop(first)
    await trio.sleep(10)
    second, _ = await _welcomed(nursery, hub, wall, ledger, "root-b", runs)  # hub: root b
    await trio.sleep(2)
    await _stop(second)  # the jobs queued for root a have not come yet
    await trio.sleep(60)
    third, s = await _welcomed(nursery, hub, wall, ledger, "root-b", runs)
    await trio.sleep(5)
    before = await s.send_job("submit", {"form": "for a"}, waited_s=80.0)  # before run 2
    result = await s.wait_result(before.id)
    assert not result.ok and result.error is not None
    assert result.error.code == "catalogue_changed"
    after = await s.send_job("submit", {"form": "for b"}, waited_s=60.0)  # during run 2
    assert (await s.wait_result(after.id)).ok
    assert runs == [("root-b", "for b")]


async def test_a_change_the_hub_never_heard_of_and_undone_refuses_nothing(
    autojump_clock, nursery, hub, wall
):
    """The other side: the hub still has root a's catalogue, and the tool is root a's
    again, so jobs queued for it run (they used to be refused: the unwelcomed start had
    stored root b)."""
    runs: list[tuple[str, Any]] = []
    ledger = Ledger.memory(wall_clock=wall)
    first, _ = await _welcomed(nursery, hub, wall, ledger, "root-a", runs)
    await _stop(first)
    await _never_welcomed(nursery, hub, wall, ledger, "root-b")
    third, s = await _welcomed(nursery, hub, wall, ledger, "root-a", runs)
    old = await s.send_job("submit", {"form": "for a"}, waited_s=OLD_S)
    assert (await s.wait_result(old.id)).ok
    assert runs == [("root-a", "for a")]


async def test_a_change_is_refused_in_the_run_that_made_it_then_not_again(
    autojump_clock, nursery, hub, wall
):
    """A welcomed change is acknowledged once: jobs enqueued after that welcome run in
    every later restart with the same configuration."""
    runs: list[tuple[str, Any]] = []
    ledger = Ledger.memory(wall_clock=wall)
    first, _ = await _welcomed(nursery, hub, wall, ledger, "root-a", runs)
    await _stop(first)
    second, s = await _welcomed(nursery, hub, wall, ledger, "root-b", runs)
    old = await s.send_job("submit", {"form": "for a"}, waited_s=OLD_S)
    assert (await s.wait_result(old.id)).error.code == "catalogue_changed"  # type: ignore[union-attr]
    await trio.sleep(100)
    await _stop(second)
    third, s = await _welcomed(nursery, hub, wall, ledger, "root-b", runs)
    queued = await s.send_job("submit", {"form": "for b"}, waited_s=50.0)  # during run 2
    assert (await s.wait_result(queued.id)).ok
    assert runs == [("root-b", "for b")]
