"""Consent end to end in-process (issue 12 item 5): the real sidecar and the real hub on
MockClock, the person played by a ``MemoryDesk``. A gated job waits on the desktop; the
caller sees ``awaiting_approval`` (job state, progress reports) and then the outcome, or
``declined``; nothing is approved by default and the deadline bounds the wait."""

from __future__ import annotations

import trio
from deskbridge_hub._jobstate import Stage
from deskbridge_sidecar import needs_approval, tool
from deskbridge_sidecar.testing import MemoryDesk

from tests.pair import sidecar_pair


def gated(calls: list[str], **declaration: float):
    @needs_approval(**declaration)
    @tool(side_effects=True)
    async def pay(invoice: str) -> dict:
        calls.append(invoice)
        return {"paid": invoice}

    return pay


async def _stage_becomes(pair, job_id: str, stage: Stage) -> None:
    with trio.fail_after(5):
        while (await pair.bridge.job_state(job_id)).stage is not stage:  # noqa: ASYNC110
            await trio.sleep(0.1)  # a test poll of stored state


async def _dispatch_in_background(nursery, pair, outcomes, reports, job_id, **kwargs):
    async def on_progress(report):
        reports.append(report)

    async def call():
        outcomes.append(
            await pair.bridge.dispatch(
                "u1", "pay", {"invoice": job_id}, job_id=job_id, on_progress=on_progress, **kwargs
            )
        )

    nursery.start_soon(call)


async def _dispatch_until_asked(nursery, pair, desk, outcomes, reports, job_id, **kwargs):
    """Dispatch ``job_id`` in the background and return once the desktop asks about it."""
    await _dispatch_in_background(nursery, pair, outcomes, reports, job_id, **kwargs)
    with trio.fail_after(5):
        await desk.wait_requested(job_id)


async def test_a_gated_job_waits_on_the_desktop_then_runs_on_approve(autojump_clock):
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls)], approvals=desk) as pair:
        catalogue = {t["name"]: t for t in await pair.bridge.tools("u1")}
        assert catalogue["pay"]["approval_after_wait_s"] == 0.0  # shown to callers
        assert "approval_after_wait_s" not in catalogue["echo"]
        outcomes, reports = [], []
        async with trio.open_nursery() as nursery:
            await _dispatch_until_asked(
                nursery, pair, desk, outcomes, reports, "job-a", timeout_s=60
            )
            await trio.sleep(20)  # nobody decides for 20 s: it waits, it does not run
            assert calls == [] and outcomes == []
            state = await pair.bridge.job_state("job-a")
            assert state.stage is Stage.AWAITING_APPROVAL
            assert [r.stage for r in reports] == ["awaiting_approval"]
            assert reports[0].message.startswith("awaiting approval")
            desk.approve("job-a")
        assert [(o.status, o.result) for o in outcomes] == [("completed", {"paid": "job-a"})]
        assert calls == ["job-a"]
        assert (await pair.bridge.job_state("job-a")).stage is Stage.FINISHED
        assert reports[-1].stage == "running"  # it left awaiting_approval before it ran


async def test_a_declined_job_never_runs_and_its_caller_is_told_declined(autojump_clock):
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls)], approvals=desk) as pair:
        outcomes, reports = [], []
        async with trio.open_nursery() as nursery:
            await _dispatch_until_asked(
                nursery, pair, desk, outcomes, reports, "job-b", timeout_s=60
            )
            desk.decline("job-b")
        (outcome,) = outcomes
        assert (outcome.status, outcome.error["code"]) == ("declined", "declined")
        assert calls == []
        assert (await pair.bridge.job_state("job-b")).stage is Stage.CANCELLED
        # the same key again: answered from the desktop's ledger, not asked again
        again = await pair.bridge.dispatch(
            "u1", "pay", {"invoice": "job-b"}, idempotency_key="job-b", timeout_s=60
        )
        assert again.status == "declined" and desk.asked == 1 and calls == []


async def test_nothing_is_approved_by_default_the_deadline_ends_the_wait(autojump_clock):
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls)], approvals=desk) as pair:
        started = trio.current_time()
        outcome = await pair.bridge.dispatch("u1", "pay", {"invoice": "c"}, job_id="job-c",
                                             idempotency_key="key-c", timeout_s=30)  # fmt: skip
        waited = trio.current_time() - started
        # the caller's wait and the desktop's both end at the deadline: the caller is
        # answered timeout with the stage it was in (docs/outcomes.md) ...
        assert outcome.status == "timeout", outcome
        assert outcome.detail == {"stage": "awaiting_approval"}
        assert 30 <= waited < 31
        # ... and the desktop answers expired, unstarted, at its deadline
        await _stage_becomes(pair, "job-c", Stage.EXPIRED)
        assert calls == [] and desk.requests == {}
        retry = await pair.bridge.dispatch("u1", "pay", {"invoice": "c"},
                                           idempotency_key="key-c", timeout_s=30)  # fmt: skip
        assert (retry.job_id, retry.status) == ("job-c", "expired") and desk.asked == 1


async def test_a_redelivery_while_the_person_decides_joins_the_same_request(autojump_clock):
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls)], approvals=desk) as pair:
        outcomes, reports = [], []
        async with trio.open_nursery() as nursery:
            await _dispatch_until_asked(
                nursery, pair, desk, outcomes, reports, "job-r", timeout_s=120
            )
            await _stage_becomes(pair, "job-r", Stage.AWAITING_APPROVAL)
            first = (await pair.bridge.job_state("job-r")).session_id
            pair.drop()  # the network dies while the request is open
            second = await pair.wait_session(2)  # reconnected; the hub redelivers the entry
            assert second != first
            with trio.fail_after(5):  # the new delivery is told the stage again
                while (await pair.bridge.job_state("job-r")).session_id != second:  # noqa: ASYNC110
                    await trio.sleep(0.1)
            await _stage_becomes(pair, "job-r", Stage.AWAITING_APPROVAL)
            assert desk.asked == 1 and "job-r" in desk.requests  # the same request
            desk.approve("job-r")
        assert [o.status for o in outcomes] == ["completed"] and calls == ["job-r"]


async def test_a_stale_job_asks_a_fresh_one_does_not(autojump_clock):
    """``after_wait_s=60``: a job that waited 70 s behind a long tool is asked about;
    one that waited 10 s runs at once."""
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls, after_wait_s=60)], approvals=desk) as pair:
        catalogue = {t["name"]: t for t in await pair.bridge.tools("u1")}
        assert catalogue["pay"]["approval_after_wait_s"] == 60.0
        for ahead_s, job_id in ((10, "fresh"), (70, "stale")):
            outcomes, reports = [], []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    pair.bridge.dispatch, "u1", "sleep", {"seconds": ahead_s}
                )  # the one browser is busy this long
                await trio.sleep(0.5)
                await _dispatch_in_background(
                    nursery, pair, outcomes, reports, job_id, timeout_s=300
                )
                if job_id == "stale":
                    with trio.fail_after(ahead_s + 5):
                        request = await desk.wait_requested("stale")
                    assert request.waited_s >= 60 and calls == ["fresh"]
                    await _stage_becomes(pair, "stale", Stage.AWAITING_APPROVAL)
                    desk.approve("stale")
            assert [o.status for o in outcomes] == ["completed"]
        assert calls == ["fresh", "stale"] and desk.asked == 1


async def test_a_caller_can_cancel_a_job_awaiting_approval(autojump_clock):
    calls: list[str] = []
    desk = MemoryDesk()
    async with sidecar_pair(tools=[gated(calls)], approvals=desk) as pair:
        outcomes, reports = [], []
        async with trio.open_nursery() as nursery:
            await _dispatch_until_asked(
                nursery, pair, desk, outcomes, reports, "job-x", timeout_s=60
            )
            await _stage_becomes(pair, "job-x", Stage.AWAITING_APPROVAL)
            assert await pair.bridge.cancel("job-x") == "awaiting_approval"
        assert [o.status for o in outcomes] == ["cancelled"]
        assert calls == [] and desk.requests == {}  # withdrawn, never ran
        assert (await pair.bridge.job_state("job-x")).stage is Stage.CANCELLED
