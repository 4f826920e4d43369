"""Recovery with the real sidecar against the real hub, in-process (tests/pair/__init__.py).

The same scenarios as the fake-peer suites (tests/sidecar/test_dedupe.py,
tests/hub/test_outcomes.py), end to end: a caller dispatches through the real Bridge, the
hub's relay and delivery serve the entry, the real daemon runs the tool. Invariant 6:
every recovery path asserts *executed exactly once* and a terminal answer for the caller.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import CLOSE_SERVICE_RESTART

from tests.pair import counting_tool, sidecar_pair


async def test_socket_dropped_mid_job_is_redelivered_and_answered_from_the_cache(
    autojump_clock,
):
    """The network dies 5 s into a 30 s job. The run goes on in the daemon's nursery; the
    sidecar reconnects; the hub's new session drains its pending entry and redelivers it
    under a new delivery id; the daemon answers from its dedupe cache. One execution, and
    the caller gets the original's result."""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def caller():
            outcomes.append(
                await pair.bridge.dispatch("u1", "submit", {"form": "f"}, timeout_s=120)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(5)
            assert pair.daemon.statistics().running == "submit"
            first = pair.daemon.statistics().session_id
            pair.drop()
            second = await pair.wait_session(2)
            assert second != first
        assert [o.status for o in outcomes] == ["completed"]
        assert outcomes[0].result == {"submitted": "f", "n": 1}
        assert len(calls) == 1 and pair.daemon.statistics().executions["submit"] == 1
        assert pair.daemon.statistics().dedupe_hits >= 1
        await trio.testing.wait_all_tasks_blocked()
        assert pair.substrate.pending_count("u1") == 0


async def test_hub_restart_close_mid_job_reconnects_at_once_and_joins_the_orphaned_run(
    autojump_clock,
):
    """The hub closes with 1012 mid-job (its grace already spent): the caller is answered
    ``in_doubt`` at once (issue 11.4: a session ended on purpose never leaves its caller
    waiting), the sidecar reconnects without backoff, and the redelivery joins the run still
    going: the tool starts once and runs to its end, never twice."""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def caller():
            outcomes.append(await pair.bridge.dispatch("u1", "submit", {"form": "g"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(5)
            [session] = pair.state.sessions.values()
            await session.close(CLOSE_SERVICE_RESTART, "hub restarting")
            await pair.wait_session(2)
            assert trio.current_time() < 6  # 1012: reconnected without backoff
        assert [o.status for o in outcomes] == ["in_doubt"]
        assert outcomes[0].detail.get("reason") == "hub restarting"
        assert outcomes[0].elapsed_s < 6  # answered at the close, not at the caller's timeout
        await trio.sleep(40)  # past the tool's end, and past any redelivery
        assert len(calls) == 1  # started once; the redelivery joined the orphaned run


async def test_desktop_gone_for_good_mid_job_is_told_interrupted(autojump_clock):
    """The socket drops and the hub stays unreachable: the caller's timeout says the job
    was delivered and running when the desktop went away (outcome unknown)."""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def caller():
            outcomes.append(await pair.bridge.dispatch("u1", "submit", {"form": "h"}, timeout_s=20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(5)
            pair.connector.down = True
            pair.drop()
        [outcome] = outcomes
        assert outcome.status == "timeout"
        assert outcome.detail == {"stage": "interrupted"}
        assert "went away" in outcome.error["message"]
        assert len(calls) == 1  # it ran once, on the desktop, unobserved


async def test_an_orphaned_run_holds_the_tool_lock_and_the_next_job_runs_after_it(
    autojump_clock,
):
    """The socket drops 5 s into a 30 s job; once reconnected a second job arrives. The
    orphaned run still owns the daemon-wide tool lock, so the second job starts only when
    the first has ended (one browser, one tool at a time), and each runs exactly once."""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes: dict[str, object] = {}

        async def caller(form: str) -> None:
            outcomes[form] = await pair.bridge.dispatch(
                "u1", "submit", {"form": form}, idempotency_key=f"k-{form}", timeout_s=120
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller, "first")
            await trio.sleep(5)
            pair.drop()
            await pair.wait_session(2)
            nursery.start_soon(caller, "second")
        assert {form: o.status for form, o in outcomes.items()} == {
            "first": "completed",
            "second": "completed",
        }
        assert len(calls) == 2
        assert calls[1] >= calls[0] + 30  # the second started after the orphan's end
        assert pair.daemon.statistics().executions["submit"] == 2


async def test_the_same_idempotency_key_from_two_callers_runs_once(autojump_clock):
    """Two callers send the same request under one idempotency key (a retry racing its
    original): one execution, and both get its result."""
    submit, calls = counting_tool(seconds=3)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def caller() -> None:
            outcomes.append(
                await pair.bridge.dispatch(
                    "u1", "submit", {"form": "once"}, idempotency_key="order-42", timeout_s=60
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(1)
            nursery.start_soon(caller)
        assert [o.status for o in outcomes] == ["completed", "completed"]
        assert [o.result for o in outcomes] == [{"submitted": "once", "n": 1}] * 2
        assert len(calls) == 1


async def test_a_sidecar_stopped_past_its_grace_tells_the_caller_in_doubt_at_once(
    autojump_clock,
):
    """SIGTERM on the desktop 5 s into a 300 s job with a 2 s grace: the caller is answered
    ``in_doubt`` about 2 s later (not at its 600 s timeout), and the tool started once."""
    submit, calls = counting_tool(seconds=300)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def caller() -> None:
            outcomes.append(
                await pair.bridge.dispatch("u1", "submit", {"form": "s"}, timeout_s=600)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(5)
            await pair.daemon.shutdown(2, why="the sidecar was stopped (SIGTERM)")
        [outcome] = outcomes
        assert outcome.status == "in_doubt"
        assert 6.5 <= trio.current_time() <= 8.5  # at the grace's end, not the timeout
        assert len(calls) == 1
