"""Issue 16: after a hand-over, a retry with the same idempotency key gets the job's real
outcome, not the ``in_doubt`` its first caller was told when the session ended.

The real sidecar against the real hub, in-process (tests/pair/__init__.py), MockClock
(autojump). A session the hub ends on purpose while a job runs answers that job's caller
``in_doubt`` at once (issue 11.4). Whether that answer is the job's last word depends on
who comes back:

* 1012 (the hub restarting, its grace spent) and 4003 (the token expired): the same
  desktop reconnects, the entry stays pending and its redelivery is answered from the
  desktop's ledger. So the ``in_doubt`` is provisional (``detail.pending``) and is not
  stored as the key's answer: a retry attaches to the job and gets its real outcome;
* 4001 (a newer session of the user took over through another hub process; it may be
  another desktop): the ``in_doubt`` is final, stored, and the entry acknowledged, so the
  job is never delivered again (another desktop's ledger would not know it).
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import CLOSE_SERVICE_RESTART

from tests.pair import sidecar_pair, wall
from tests.pair.test_recovery import counting_tool

KEY = "pay-16h"


async def _handed_over_then_retried(end_session) -> tuple[list, list[float], object]:
    """Attempt 1 of a 30 s job; 5 s in, ``end_session(session)`` ends its session on
    purpose; the sidecar comes back; at 40 s (past the tool's end) a retry with the same
    key. Returns (outcomes, tool starts, pair substrate's pending count at the end)."""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def attempt_1():
            outcomes.append(
                await pair.bridge.dispatch(
                    "u1", "submit", {"form": "f"}, idempotency_key=KEY, timeout_s=120
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt_1)
            await trio.sleep(5)
            assert pair.daemon.statistics().running == "submit"
            [session] = pair.state.sessions.values()
            await end_session(session)
            with trio.fail_after(5):
                while not outcomes:  # noqa: ASYNC110 - test poll, bounded
                    await trio.sleep(0.05)
            await pair.wait_session(2)
            await trio.sleep(40 - trio.current_time())
            with trio.fail_after(10):
                outcomes.append(
                    await pair.bridge.dispatch(
                        "u1", "submit", {"form": "f"}, idempotency_key=KEY, timeout_s=5
                    )
                )
        await trio.testing.wait_all_tasks_blocked()
        return outcomes, calls, pair.substrate.pending_count("u1")


async def test_a_retry_after_a_restart_close_gets_the_real_outcome(autojump_clock):
    async def restart(session):
        await session.close(CLOSE_SERVICE_RESTART, "hub restarting")

    outcomes, calls, pending = await _handed_over_then_retried(restart)
    first, retry = outcomes
    assert first.status == "in_doubt" and first.elapsed_s < 6  # told at the close
    assert first.detail == {"stage": "interrupted", "reason": "hub restarting", "pending": True}
    assert retry.status == "completed", retry
    assert retry.result == {"submitted": "f", "n": 1}
    assert len(calls) == 1 and pending == 0


async def test_a_retry_after_a_token_expiry_close_gets_the_real_outcome(autojump_clock):
    async def expire(session):
        session.expires_at = wall()  # as a token's exp passing: the pacer ends it (4003)
        session.state.pacer.add(session, trio.current_time())

    outcomes, calls, pending = await _handed_over_then_retried(expire)
    first, retry = outcomes
    assert first.status == "in_doubt"
    assert first.detail == {"stage": "interrupted", "reason": "token expired", "pending": True}
    assert retry.status == "completed", retry
    assert len(calls) == 1 and pending == 0


async def test_in_doubt_after_a_takeover_by_another_process_is_final_and_acked(
    autojump_clock,
):
    """4001: the session's user is held through another process now, perhaps by another
    desktop. After the grace the caller is told ``in_doubt`` for good, the entry is
    acknowledged (never delivered again) and a retry gets the same answer. (The socket is
    dropped too, so the session ends at once and the 4001 close never reaches the
    sidecar, which would stop for good.)"""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        outcomes = []

        async def attempt(timeout_s: float):
            outcomes.append(
                await pair.bridge.dispatch(
                    "u1", "submit", {"form": "f"}, idempotency_key=KEY, timeout_s=timeout_s
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, 120)
            await trio.sleep(5)
            [session] = pair.state.sessions.values()
            session.supersede()  # found by the process heartbeat: presence names another
            pair.connector.down = True  # this desktop is away (the other one holds the user)
            pair.drop()  # its socket goes: the session ends at once, still on purpose
            with trio.fail_after(5):
                while not outcomes:  # noqa: ASYNC110 - test poll, bounded
                    await trio.sleep(0.05)
            await trio.testing.wait_all_tasks_blocked()
            assert pair.substrate.pending_count("u1") == 0  # acked: not delivered again
            await attempt(5)
        first, retry = outcomes
        assert first.status == "in_doubt"
        assert first.detail == {
            "stage": "interrupted",
            "reason": "superseded by a newer sidecar session",
        }
        assert retry.status == "in_doubt" and retry.detail == first.detail
        assert len(calls) == 1
