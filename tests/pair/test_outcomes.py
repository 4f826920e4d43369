"""Every outcome end to end with the real sidecar against the real hub, in-process
(tests/pair/__init__.py): completed, failed (tool error, unknown tool, bad args), expired,
cancelled (running and queued), offline."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_sidecar import ToolError, tool

from tests.pair import sidecar_pair


@tool
async def boom(reason: str) -> None:
    raise ToolError(reason, code="form_rejected")


async def test_completed_and_failed_outcomes_carry_the_sidecars_codes(autojump_clock):
    async with sidecar_pair(tools=[boom]) as pair:
        ok = await pair.bridge.dispatch("u1", "echo", {"a": [1, 2]})
        assert (ok.status, ok.result) == ("completed", {"a": [1, 2]})
        failed = await pair.bridge.dispatch("u1", "boom", {"reason": "no"})
        assert failed.status == "failed"
        assert failed.error == {"code": "form_rejected", "message": "no"}


async def test_the_hub_refuses_what_the_catalogue_rules_out_before_enqueue(autojump_clock):
    from deskbridge_hub import BadRequest

    async with sidecar_pair(tools=[boom]) as pair:
        for name, args in (("nope", {}), ("boom", {"reason": 5})):
            try:
                await pair.bridge.dispatch("u1", name, args)
            except BadRequest:
                pass
            else:
                raise AssertionError(f"{name} {args} was not refused")
        assert pair.substrate.pending_count("u1") == 0


async def test_cancel_of_a_running_job_reaches_the_tool_at_once(autojump_clock):
    cancelled_at = []

    @tool
    async def click(seconds: float) -> str:
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            raise
        return "clicked"

    async with sidecar_pair(tools=[click]) as pair:
        outcomes = []

        async def caller():
            outcomes.append(
                await pair.bridge.dispatch("u1", "click", {"seconds": 60}, job_id="job-1")
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(3)
            asked = trio.current_time()
            assert await pair.bridge.cancel("job-1") == "delivered"
        assert cancelled_at == [asked]  # the cancel frame went out at once
        assert [o.status for o in outcomes] == ["cancelled"]
        assert pair.daemon.statistics().executions["click"] == 1


async def test_a_job_queued_behind_a_long_one_expires_unstarted(autojump_clock):
    async with sidecar_pair() as pair:
        outcomes = {}

        async def call(name, args, timeout_s):
            outcomes[name] = await pair.bridge.dispatch("u1", name, args, timeout_s=timeout_s)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "sleep", {"seconds": 30}, 60)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, "echo", {"late": True}, 10)
        assert outcomes["sleep"].status == "completed"
        assert outcomes["echo"].status in ("expired", "timeout")
        assert pair.daemon.statistics().executions.get("echo", 0) == 0
