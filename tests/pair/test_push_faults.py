"""Push delivery's fault kinds, real sidecar against the real hub (tests/pair/__init__.py).

Push delivery (docs/architecture.md, "Push delivery: the caller's step reads for the
holder") reads and marks an entry for the holder process in the caller's own step, so
the entry is read (pending, ``delivered``) before the holder forwards it. These tests
put a fault between the push and the forward and check the promises that held before:
at most one execution, no start after the deadline, a terminal and truthful answer.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub._substrate import Pushed

from tests.pair import counting_tool, sidecar_pair


async def after_push(pair, fault):
    """Run ``fault()`` (async) right after the holder's wake-up wait pops a pushed
    entry, before the reader hands it on: the fault lands between push and forward.
    (A wake-up of nobody moves the reader's wait, already running, onto the wrapper.)"""
    real = pair.substrate.wait_wakes
    fired: list[bool] = []

    async def wait_wakes(holder_id, **kw):
        items = await real(holder_id, **kw)
        if not fired and any(isinstance(i, Pushed) for i in items):
            fired.append(True)
            await fault()
        return items

    pair.substrate.wait_wakes = wait_wakes
    await pair.substrate.wake(pair.state.reader.holder_id, "nobody", ttl_s=60)
    await trio.testing.wait_all_tasks_blocked()
    return fired


async def test_a_pushed_job_forwarded_after_its_deadline_never_starts(autojump_clock):
    """The holder stalls 10 s between the push and the forward (a busy or paused
    process: the wake-up's reply waits unread). The caller's deadline is 5 s. Before
    push delivery the late read marked it ``expired`` (the deadline is judged on the
    substrate's clock when the entry is read); a pushed entry carries the mark taken at
    submit, so its time left must not be counted from then: the job must never start
    after its deadline (docs/outcomes.md: "a desktop ... never runs work its callers
    gave up on")."""
    submit, calls = counting_tool(seconds=1)
    async with sidecar_pair(tools=[submit]) as pair:
        async def stall() -> None:
            await trio.sleep(10)

        fired = await after_push(pair, stall)
        outcome = await pair.bridge.dispatch("u1", "submit", {"form": "late"}, timeout_s=5)
        assert fired
        assert outcome.status == "timeout"
        await trio.sleep(30)  # the stall ends; whatever the hub forwards has run by now
        await trio.testing.wait_all_tasks_blocked()
        assert calls == [], f"started {calls} s, after its deadline (5 s)"
        state = await pair.bridge.job_state(outcome.job_id)
        assert state is not None and state.stage.value == "expired"
        assert pair.substrate.pending_count("u1") == 0


async def test_socket_drop_between_push_and_forward_runs_the_job_once(autojump_clock):
    """The socket drops right after a caller's step pushed the entry to the holder and
    before the holder forwards it. The daemon reconnects to the same hub process; its
    new session's drain (or the pushed copy) serves the entry: one execution, and the
    caller gets the completed answer."""
    submit, calls = counting_tool(seconds=1)
    async with sidecar_pair(tools=[submit]) as pair:

        async def drop() -> None:
            pair.drop()
            await trio.lowlevel.checkpoint()

        fired = await after_push(pair, drop)
        outcome = await pair.bridge.dispatch("u1", "submit", {"form": "d"}, timeout_s=60)
        assert fired
        assert outcome.status == "completed", outcome
        assert outcome.result == {"submitted": "d", "n": 1}
        await trio.sleep(5)
        await trio.testing.wait_all_tasks_blocked()
        assert len(calls) == 1
        assert pair.daemon.statistics().sessions_started == 2
        assert pair.substrate.pending_count("u1") == 0


async def test_cancel_right_after_a_push_tells_the_truth(autojump_clock):
    """A cancel lands between the push (the entry is marked ``delivered`` by the
    caller's step) and the forward. Whatever the caller is told must be true: answered
    ``cancelled`` only if the tool never ran; the cancel's returned stage ``queued``
    only if the job never starts; one execution at most; a terminal answer. (A cancel
    frame that interrupts a started async tool is answered ``cancelled`` by the sidecar,
    documented; "cancelled before it started" must then not be said.)"""
    submit, calls = counting_tool(seconds=30)
    async with sidecar_pair(tools=[submit]) as pair:
        stages: list[str] = []

        async def cancel() -> None:
            stages.append(await pair.bridge.cancel("job-c"))

        fired = await after_push(pair, cancel)
        outcome = await pair.bridge.dispatch(
            "u1", "submit", {"form": "c"}, timeout_s=60, job_id="job-c"
        )
        assert fired and stages
        await trio.sleep(60)
        await trio.testing.wait_all_tasks_blocked()
        assert len(calls) <= 1
        before_start = (outcome.detail or {}).get("stage") == "queued"
        if before_start or stages == ["queued"]:
            assert calls == [], (outcome, stages, calls)
        assert outcome.status in {"cancelled", "in_doubt", "completed"}, outcome
        assert pair.substrate.pending_count("u1") == 0
