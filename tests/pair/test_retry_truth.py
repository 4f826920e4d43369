"""Issue 16: a retry (or any caller) is never told "it did not run" about a job that ran.

The real sidecar against the real hub, in-process (tests/pair/__init__.py), MockClock
(autojump). The soak (tests/chaos/test_soak.py) found these interleavings with real
processes; here each one is replayed deterministically.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub import Bridge

from tests.pair import sidecar_pair, wall
from tests.pair.test_recovery import counting_tool


async def test_a_retry_attached_to_a_job_cut_mid_run_gets_its_result_not_expired(
    autojump_clock,
):
    """The soak's false ``expired``. Attempt 1 (timeout 10 s) is delivered and starts; at
    1 s its pod dies: the caller's HTTP request is cut and the socket with it, the desktop
    cannot reconnect for a while. The run finishes on the desktop (its ledger has the
    outcome). A retry with the same key, through another replica, attaches to the job.
    The desktop comes back after the job's deadline and the entry is redelivered: the hub
    used to answer that redelivery ``expired`` (its deadline had passed) without asking
    the desktop, so the retry was told "it did not run" about a job that ran once. Now the
    redelivery of a job already delivered goes to the desktop, whose ledger answers."""
    submit, calls = counting_tool(seconds=2)
    async with sidecar_pair(tools=[submit]) as pair:
        other_replica = Bridge(pair.substrate, pair.state.timings, wall_clock=wall)
        outcomes = []

        async def attempt_1(task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await pair.bridge.dispatch(
                    "u1", "submit", {"form": "f"}, idempotency_key="pay-16", timeout_s=10
                )

        async with trio.open_nursery() as nursery:
            cut = await nursery.start(attempt_1)
            await trio.sleep(1)
            assert pair.daemon.statistics().running == "submit"
            cut.cancel()  # the caller's pod died: its HTTP request is gone
            pair.connector.down = True
            pair.drop()  # ... and the socket it held
            await trio.sleep(2)
            outcomes.append(
                await other_replica.dispatch(
                    "u1", "submit", {"form": "f"}, idempotency_key="pay-16", timeout_s=2
                )
            )  # the desktop is away: the retry times out, and says the job may be running
            nursery.start_soon(
                lambda: _append(
                    outcomes,
                    other_replica.dispatch(
                        "u1", "submit", {"form": "f"}, idempotency_key="pay-16", timeout_s=60
                    ),
                )
            )
            await trio.sleep(12)  # past attempt 1's deadline (10 s)
            pair.connector.down = False  # the desktop reconnects; the entry is redelivered
        assert len(calls) == 1
        assert outcomes[0].status == "timeout"
        assert outcomes[0].detail == {"stage": "interrupted"}
        assert outcomes[1].status == "completed", outcomes[1]
        assert outcomes[1].result == {"submitted": "f", "n": 1}
        await trio.testing.wait_all_tasks_blocked()
        assert pair.substrate.pending_count("u1") == 0


async def _append(outcomes, call):
    outcomes.append(await call)
