"""The store names an older session again (a replica promoted without the last writes,
an older snapshot restored) while the desktop is connected through a newer one: the
newer session's beat found presence "not ours" and handed over (4001), and the sidecar,
told a newer sidecar had taken over, stopped for good (exit status 3). A connected
desktop stayed offline until someone restarted it. Now the beat checks the holder first
(``_presence_doubt``): a session whose process is gone, or whose live process does not
hold it, is cleared and the current session takes presence back. The real sidecar
daemon against two hub "processes" sharing one ``MemorySubstrate``, MockClock."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_hub import Bridge
from deskbridge_hub._memory import MemorySubstrate

from tests.pair import USER, PairConnector, wall
from tests.pair.test_takeover import (
    TIMINGS,
    _desktop,
    _pod,
    _submit_tool,
    _two_pods,
    _wait_sessions,
)

SUBMIT, CALLS = _submit_tool()  # the desktop's one tool; CALLS: its start times


async def _moved_then_rewound(
    root: trio.Nursery, daemon_run: Any, *, kill_pod1: bool
) -> tuple[MemorySubstrate, Any, str, str]:
    """Two pods sharing one substrate, the real sidecar daemon on pod-1, then moved to
    pod-2 (after a kill -9 of pod-1 if ``kill_pod1``); then the store rewinds presence to
    the first session. ``daemon_run(daemon)`` runs the daemon. Returns the substrate, the
    daemon, the first and the second session's ids."""
    substrate, view1, pod1, pod2 = _two_pods()
    n1 = await root.start(_pod, pod1)
    n2 = await root.start(_pod, pod2)
    connector = PairConnector(pod1, n1, USER)
    daemon = _desktop(SUBMIT, connector)
    root.start_soon(daemon_run, daemon)
    await _wait_sessions(daemon, 1)
    await trio.sleep(1)
    first = await substrate.get_presence(USER)
    if kill_pod1:
        view1.dead = True  # kill -9 of the holding process
        n1.cancel_scope.cancel()
    connector.state, connector.nursery = pod2, n2
    connector.sockets[-1].abort()  # the desktop moves to pod-2
    await _wait_sessions(daemon, 2)
    await trio.sleep(1)
    second = await substrate.get_presence(USER)
    assert first is not None and second not in (None, first)
    await substrate.set_presence(USER, first, TIMINGS.presence_ttl_s)  # the rewind
    return substrate, daemon, first, second


@pytest.mark.parametrize("old_process", ["killed", "alive"])
async def test_a_rewound_presence_does_not_stop_the_connected_desktop(autojump_clock, old_process):
    CALLS.clear()
    stopped = []

    async def run(daemon: Any) -> None:
        await daemon.run()
        stopped.append(trio.current_time())

    with trio.fail_after(300):
        async with trio.open_nursery() as root:
            substrate, daemon, _, second = await _moved_then_rewound(
                root, run, kill_pod1=old_process == "killed"
            )
            await trio.sleep(TIMINGS.heartbeat_s + 5)  # past the next beat and its check
            assert not stopped, "the connected sidecar stopped"
            assert daemon.statistics().sessions_started == 2  # never cut off
            assert await substrate.get_presence(USER) == second
            bridge = Bridge(substrate, TIMINGS, wall_clock=wall)
            outcome = await bridge.dispatch(USER, "submit", {"form": "f"}, timeout_s=60)
            assert outcome.status == "completed", outcome
            assert len(CALLS) == 1
            root.cancel_scope.cancel()


@pytest.mark.parametrize("cancel", [False, True])
async def test_the_first_call_after_a_rewind_to_an_ended_session_is_told_queued(
    autojump_clock, cancel
):
    """The store rewinds presence to the desktop's previous session, which ended on
    pod-1 (alive). The first call is pushed to pod-1, marked delivered for that session,
    and no desktop receives it. Before: its caller was told ``timeout`` with the stage
    ``delivered`` ("on the desktop, may be running"), ``GET /v1/jobs`` said delivered, a
    cancel answered ``delivered`` and later ``in_doubt`` ("may have acted"), and without
    a cancel it was delivered past its deadline and answered as if it might have run.
    Now the stage is ``queued``, a cancel answers ``cancelled`` at once, and the job
    ends ``expired`` (or ``cancelled``); it never runs."""
    CALLS.clear()

    async def run(daemon: Any) -> None:
        await daemon.run()

    with trio.fail_after(600):
        async with trio.open_nursery() as root:
            substrate, *_ = await _moved_then_rewound(root, run, kill_pod1=False)
            bridge = Bridge(substrate, TIMINGS, wall_clock=wall)
            outcome = await bridge.dispatch(
                USER, "submit", {"form": "f"}, job_id="job-r", timeout_s=5
            )
            assert (outcome.status, outcome.detail) == ("timeout", {"stage": "queued"}), outcome
            state = await bridge.job_state("job-r")
            assert state is not None and state.stage.value == "queued", state
            if cancel:
                assert await bridge.cancel("job-r") == "queued"
            await trio.sleep(TIMINGS.reclaim_idle_s + 3 * TIMINGS.heartbeat_s)
            answer = json.loads(await bridge.answer_of("job-r") or "null")
            assert answer is not None, await bridge.job_state("job-r")
            assert answer["status"] == ("cancelled" if cancel else "expired"), answer
            assert CALLS == []
            root.cancel_scope.cancel()
