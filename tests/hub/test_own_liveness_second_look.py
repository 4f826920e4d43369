"""The second look before ``offline`` (``_own_liveness``, ``Bridge._submit`` and
``Bridge.presence``) on MemorySubstrate and MockClock (autojump): deterministic, no
real process. While this process's own writes are in doubt (its liveness refresh held
past ``STALLED_AFTER_S``, or one found its key lapsed), an absent presence is looked at
once more ``LIVENESS_RECHECK_S`` later: back by then is served, still absent is
``unavailable``; a healthy process answers ``offline`` at once. Each test fails if the
second look is removed (the call is told ``offline`` for a desktop whose presence this
process is rewriting). The same with real processes: tests/chaos/test_redis_unhealthy.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._own_liveness import STALLED_AFTER_S, own_liveness
from deskbridge_hub._retry import LIVENESS_RECHECK_S

from tests.hub.test_session import wall

CATALOGUE = '[{"name": "echo", "args_schema": {"type": "object"}}]'


@pytest.fixture
async def substrate() -> MemorySubstrate:
    s = MemorySubstrate(clock=wall)
    await s.set_catalogue("u1", CATALOGUE)  # presence absent: it lapsed in Redis
    return s


@pytest.fixture
def bridge(substrate: MemorySubstrate) -> Bridge:
    return Bridge(substrate, Timings(), wall_clock=wall)


async def _stall_own_writes() -> None:
    """This process's liveness refresh held past the stall bound, then answered late
    (a black hole, ``DEBUG SLEEP``, a demoted primary refusing writes)."""
    own_liveness().sending()
    await trio.sleep(STALLED_AFTER_S + 0.5)
    own_liveness().answered(kept=False)
    assert own_liveness().in_doubt()


async def _presence_back_after(substrate: MemorySubstrate, delay_s: float) -> None:
    await trio.sleep(delay_s)
    await substrate.set_presence("u1", "s1", 3600)  # the liveness loop rewrote it


async def test_a_call_in_doubt_looks_again_and_is_served_when_presence_is_back(
    autojump_clock: Any, substrate: MemorySubstrate, bridge: Bridge
) -> None:
    await _stall_own_writes()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_presence_back_after, substrate, LIVENESS_RECHECK_S / 2)
        outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)
    # enqueued on the second look (nobody serves it here: timeout at stage queued)
    assert outcome.status == "timeout", outcome
    assert outcome.detail["stage"] == "queued", outcome
    assert trio.current_time() - start >= LIVENESS_RECHECK_S  # it did wait to look again


async def test_a_call_in_doubt_with_presence_still_absent_is_unavailable_not_offline(
    autojump_clock: Any, bridge: Bridge
) -> None:
    await _stall_own_writes()
    start = trio.current_time()
    with pytest.raises(SubstrateUnavailable, match="cannot keep its own writes"):
        await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)
    assert trio.current_time() - start == pytest.approx(LIVENESS_RECHECK_S, abs=0.01)


async def test_the_second_look_waits_no_longer_than_the_callers_time(
    autojump_clock: Any, bridge: Bridge
) -> None:
    await _stall_own_writes()
    start = trio.current_time()
    outcome_or_error: object
    try:
        outcome_or_error = await bridge.dispatch("u1", "echo", {}, timeout_s=0.3)
    except SubstrateUnavailable as exc:
        outcome_or_error = exc
    assert trio.current_time() - start <= 0.3 + 0.01
    assert getattr(outcome_or_error, "status", None) != "offline", outcome_or_error


async def test_presence_in_doubt_looks_again_online_or_unavailable(
    autojump_clock: Any, substrate: MemorySubstrate, bridge: Bridge
) -> None:
    await _stall_own_writes()
    with pytest.raises(SubstrateUnavailable, match="cannot keep its own writes"):
        await bridge.presence("u1")  # was: "online": false
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_presence_back_after, substrate, LIVENESS_RECHECK_S / 2)
        seen = await bridge.presence("u1")
    assert seen.online and seen.session_id == "s1"


async def test_a_healthy_process_answers_offline_at_once(
    autojump_clock: Any, substrate: MemorySubstrate, bridge: Bridge
) -> None:
    own_liveness().sending()
    own_liveness().answered(kept=True)
    assert not own_liveness().in_doubt()
    start = trio.current_time()
    outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)
    assert outcome.status == "offline"
    assert not (await bridge.presence("u1")).online
    assert trio.current_time() - start < 0.01  # no second look


async def test_doubt_that_ends_before_the_second_look_answers_offline(
    autojump_clock: Any, bridge: Bridge
) -> None:
    """Doubt is about this process's writes: once they are kept again for
    ``DOUBT_AFTER_S``, an absent presence is the desktop's absence."""
    await _stall_own_writes()
    await trio.sleep(10)
    own_liveness().sending()
    own_liveness().answered(kept=True)
    assert not own_liveness().in_doubt()
    assert (await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)).status == "offline"


async def test_a_user_whose_beats_are_held_is_looked_at_again_not_told_offline(
    autojump_clock: Any, substrate: MemorySubstrate, bridge: Bridge
) -> None:
    """Only this user's beats are held (its Cluster slot migrating: TRYAGAIN retried for
    seconds), the process's own liveness is kept: its presence lapsed while its desktop
    stays connected here. Was ``offline`` (tests/chaos/test_redis_cluster_failover.py)."""
    own_liveness().beat_sending("u1")
    await trio.sleep(STALLED_AFTER_S + 0.5)
    assert own_liveness().in_doubt("u1") and not own_liveness().in_doubt()
    with pytest.raises(SubstrateUnavailable):
        await bridge.presence("u1")
    with pytest.raises(SubstrateUnavailable):
        await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)

    async def beat_lands() -> None:
        await trio.sleep(LIVENESS_RECHECK_S / 2)
        await substrate.set_presence("u1", "s1", 3600)
        own_liveness().beat_kept("u1", taken=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat_lands)
        outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)
    assert outcome.status == "timeout" and outcome.detail["stage"] == "queued", outcome
    # another user, whose beats are kept: an absent presence is offline at once
    await substrate.set_catalogue("u2", CATALOGUE)
    start = trio.current_time()
    assert (await bridge.dispatch("u2", "echo", {}, timeout_s=5.0)).status == "offline"
    assert trio.current_time() - start < 0.01
