"""Consent (issue 12 item 5): a tool marked ``needs_approval`` waits on the desktop for
the person's approve/decline, up to its deadline; nothing is approved by default. Real
files and the real clock (decisions are files the CLI writes); every wait bounded."""

from __future__ import annotations

import trio
from deskbridge_sidecar import needs_approval, tool
from deskbridge_sidecar._consent import approvals_dir, decide, pending
from deskbridge_sidecar.cli import main

DEADLINE_S = 30


def gated_tool():
    calls: list[str] = []

    @needs_approval
    @tool(side_effects=True)
    async def pay(invoice: str) -> dict:
        calls.append(invoice)
        return {"paid": invoice}

    return pay, calls


async def _requested(data_dir, job_id) -> None:
    while not (approvals_dir(data_dir) / f"{job_id}.json").exists():  # noqa: ASYNC110
        await trio.sleep(0.02)


async def test_approve_runs_decline_refuses_and_is_remembered(start_daemon, tmp_path, wall):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay], data_dir=tmp_path)
        first = await s.send_job("pay", {"invoice": "A-1"}, key="k-a", job_id="job-a")
        await _requested(tmp_path, "job-a")
        assert calls == [] and [r["tool"] for r in pending(tmp_path)] == ["pay"]
        decide(tmp_path, "job-a", approve=True)
        assert (await s.wait_result(first.id)).result == {"paid": "A-1"}

        second = await s.send_job("pay", {"invoice": "B-2"}, key="k-b", job_id="job-b")
        await _requested(tmp_path, "job-b")
        assert main(["decline", "job-b", "--data-dir", str(tmp_path)]) == 0  # the CLI
        refused = await s.wait_result(second.id)
        again = await s.call("pay", {"invoice": "B-2"}, key="k-b", job_id="job-b")
    assert refused.error.code == "declined" and again.error.code == "declined"
    assert calls == ["A-1"]  # B-2 never ran, not even on redelivery
    assert pending(tmp_path) == []


async def test_nothing_is_approved_by_default_the_deadline_ends_the_wait(
    start_daemon, tmp_path, wall
):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay], data_dir=tmp_path)
        result = await s.call("pay", {"invoice": "C"}, key="k-c", deadline=wall() + 1.0)
    assert result.error.code == "expired" and "awaited approval" in result.error.message
    assert calls == [] and pending(tmp_path) == []


async def test_without_a_data_dir_there_is_no_one_to_ask(start_daemon):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay])
        result = await s.call("pay", {"invoice": "D"}, key="k-d")
    assert result.error.code == "declined" and calls == []


def test_deciding_an_unknown_job_says_so(tmp_path, capsys):
    assert main(["approve", "nope", "--data-dir", str(tmp_path)]) == 1
    assert "no job 'nope' is waiting for approval" in capsys.readouterr().err
