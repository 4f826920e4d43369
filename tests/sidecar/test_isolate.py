"""Process-isolated tools (issue 12 item 7): same outcomes as in a thread, a separate
process, and cancellation terminates it. Real child processes, real clock, every wait
bounded."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
from deskbridge_sidecar import ToolRegistry, tool
from deskbridge_sidecar._isolate import invoke_in_process, is_isolated

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import gil_tools  # noqa: E402
from deskbridge_sidecar._tools import tool_of  # noqa: E402

DEADLINE_S = 60


async def test_a_marked_tool_runs_in_another_process_with_the_same_outcomes(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    crunch = tool_of(gil_tools.crunch)
    assert is_isolated(crunch) and not is_isolated(tool_of(gil_tools.crunch_here))
    with trio.fail_after(DEADLINE_S):
        done = await invoke_in_process(crunch, {"n": 1000})
        refused = await invoke_in_process(tool_of(gil_tools.refuse), {"why": "no"})
        bad = await invoke_in_process(crunch, {"n": "many"})
    assert done.ok and done.result["sum"] == sum(range(1000))
    assert done.result["pid"] != os.getpid()
    assert (refused.code, refused.error.message) == ("refused", "no")
    assert bad.code == "bad_args"  # converted in the child, as in a thread


async def test_a_tool_a_fresh_interpreter_cannot_import_is_refused():
    @tool
    def local(x: int) -> int:
        return x

    outcome = await invoke_in_process(ToolRegistry([local]).get("local"), {"x": 1})
    assert outcome.code == "crashed" and "not importable" in outcome.error.message


async def test_cancelling_a_process_tool_terminates_it():
    crunch = tool_of(gil_tools.crunch)
    with trio.fail_after(DEADLINE_S):
        with trio.move_on_after(3):
            await invoke_in_process(crunch, {"n": 10**12})  # hours of GIL-held C
    assert _isolate_children() == []  # no child left behind


def _isolate_children() -> list[int]:
    """Pids of this process's children running ``deskbridge_sidecar._isolate``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"deskbridge_sidecar._isolate" in cmd:
                pids.append(int(entry.name))
    return pids


async def test_the_hubs_cancel_terminates_a_process_tool(start_daemon):
    """A sync tool in a thread cannot be cancelled (it reports its real outcome); a
    process tool can: the hub's cancel ends it and the caller is told ``cancelled``."""
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[gil_tools.crunch])
        job = await s.send_job("crunch", {"n": 10**12}, key="k-cancel")
        while daemon.statistics().running != "crunch":  # noqa: ASYNC110 - polled, bounded
            await trio.sleep(0.05)
        await trio.sleep(0.5)  # the child is computing, holding its own GIL
        await s.cancel(job.id)
        result = await s.wait_result(job.id)
    assert result.error.code == "cancelled"
    assert _isolate_children() == []
