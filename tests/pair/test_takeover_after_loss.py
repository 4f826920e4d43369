"""Instant takeover after Redis lost its data (restarted empty, FLUSHALL) while the
desktop stayed connected: the daemon record (``bridge:daemons:{u}``: consumer -> daemon
id) was written only at a session's start, so after the loss it named nobody. A job
delivered after the loss, on a holder process then killed (kill -9), was not taken over
at once when the same daemon reconnected to another process: it waited for the reclaim
idle (180 s), its caller with it. The beat that takes lost presence back now records the
daemon again. The real sidecar daemon against two hub "processes" sharing one
``MemorySubstrate`` (``tests/pair/test_takeover.py``), MockClock (autojump)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub import Bridge
from deskbridge_hub._memory import MemorySubstrate

from tests.pair import USER, PairConnector, wall
from tests.pair.test_takeover import (
    JOB_S,
    TIMINGS,
    _desktop,
    _pod,
    _submit_tool,
    _two_pods,
    _wait_sessions,
)


def lose_everything(substrate: MemorySubstrate) -> None:
    """What a Redis restarted without persistence (or FLUSHALL) does to the store: every
    key gone, streams with their groups and pending entries too."""
    substrate._kv.clear()
    substrate._daemon_records.clear()
    substrate._index.clear()
    substrate._results.clear()
    substrate._progress.clear()
    for user_id in list(substrate._streams):
        substrate.delete_stream(user_id)
    substrate.__dict__.get("_directory_index", {}).clear()


async def test_same_daemon_takes_over_at_once_after_the_store_lost_its_data(autojump_clock):
    substrate, view1, pod1, pod2 = _two_pods()
    submit, calls = _submit_tool()
    outcomes = []
    with trio.fail_after(900):
        async with trio.open_nursery() as root:
            n1 = await root.start(_pod, pod1)
            n2 = await root.start(_pod, pod2)
            connector = PairConnector(pod1, n1, USER)
            daemon = _desktop(submit, connector)
            await root.start(daemon.run)
            bridge = Bridge(substrate, TIMINGS, wall_clock=wall)
            await trio.sleep(1)
            lose_everything(substrate)
            with trio.fail_after(5):  # presence back within the documented second or so
                while await substrate.get_presence(USER) is None:  # noqa: ASYNC110
                    await trio.sleep(0.1)

            async def caller() -> None:
                outcomes.append(await bridge.dispatch(USER, "submit", {"form": "f"}, timeout_s=600))

            root.start_soon(caller)
            await trio.sleep(5)  # the job runs on the desktop (30 s), delivered by pod-1
            assert daemon.statistics().running == "submit"
            view1.dead = True  # kill -9 of the holding process
            n1.cancel_scope.cancel()
            connector.state, connector.nursery = pod2, n2
            connector.sockets[-1].abort()
            await _wait_sessions(daemon, 2)
            while not outcomes:  # noqa: ASYNC110 - test poll
                await trio.sleep(0.5)
            root.cancel_scope.cancel()
    (outcome,) = outcomes
    assert outcome.status == "completed", outcome
    assert len(calls) == 1  # ran once
    # the redelivery joined the running run at once: not the reclaim idle (180 s) later
    assert outcome.elapsed_s <= JOB_S + 2.0, outcome.elapsed_s
