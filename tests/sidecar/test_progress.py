"""Progress reports: a tool's Progress callback -> rate-limited ``progress`` frames for the
delivery waiting on it, never ahead of the answer's ordering, never from a sync thread
unsafely."""

from __future__ import annotations

import trio
from deskbridge_common import JobResult
from deskbridge_common import Progress as ProgressFrame
from deskbridge_sidecar import PROGRESS_INTERVAL_S, Progress, invoke, tool, tool_of


@tool
async def chatty(steps: int, progress: Progress) -> dict:
    """Report progress in a tight loop, then a last value after a pause."""
    for i in range(steps):
        progress(i + 1, total=steps, message=f"step {i + 1}")
        await trio.sleep(0.001)
    await trio.sleep(1)
    progress(steps, total=steps, message="done")
    await trio.sleep(1)
    return {"steps": steps}


@tool
def threaded(progress: Progress) -> str:
    """A sync tool (worker thread) reporting progress."""
    progress(1, total=2)
    progress(2, total=2, message="x" * 5000)
    return "ok"


def test_the_progress_parameter_is_not_part_of_the_schema():
    schema = tool_of(chatty).args_schema
    assert set(schema["properties"]) == {"steps"} and schema["required"] == ["steps"]
    assert tool_of(threaded).args_schema["properties"] == {}


async def test_progress_frames_are_rate_limited_and_coalesced(autojump_clock, start_daemon):
    daemon, s = await start_daemon(tools=[chatty])
    result = await s.call("chatty", {"steps": 500})
    assert isinstance(result, JobResult) and result.ok
    frames = s.frames(ProgressFrame)
    times = [
        t for f, t in zip(s.received, s.received_at, strict=True) if isinstance(f, ProgressFrame)
    ]
    # 500 reports in ~0.5 s of tool time: a handful of frames, at least PROGRESS_INTERVAL_S apart
    assert 2 <= len(frames) <= 10, len(frames)
    assert all(b - a >= PROGRESS_INTERVAL_S - 1e-9 for a, b in zip(times, times[1:], strict=False))
    assert all(f.id == frames[0].id for f in frames) and frames[0].total == 500
    assert frames[-1].message == "done" and frames[-1].progress == 500
    # every progress frame comes before the delivery's job_result
    index = s.received.index(result)
    assert all(s.received.index(f) < index for f in frames)


async def test_a_sync_tool_reports_from_its_thread():
    updates = []

    class Sink:
        def set(self, update):
            updates.append(update)

    progress = Progress(Sink(), trio.lowlevel.current_trio_token())  # type: ignore[arg-type]
    outcome = await invoke(tool_of(threaded), {}, progress=progress)
    assert outcome.ok
    assert [u.progress for u in updates] == [1.0, 2.0]
    assert len(updates[1].message) == 1024  # cut to the frame's limit
    # a tool called outside a session (no progress given) still runs
    assert (await invoke(tool_of(threaded), {})).ok


def test_bad_reports_raise_in_the_tool():
    progress = Progress.discard()
    for bad in (float("nan"), "1", True):
        try:
            progress(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} accepted")
    try:
        progress(1, total=-1)
    except ValueError:
        pass
    else:
        raise AssertionError("negative total accepted")


async def test_progress_never_delays_status_or_pongs(autojump_clock, start_daemon):
    """A tool reporting progress as fast as it can: status and ping round trips take no
    longer than with an idle tool (the frames are few and share the writer fairly)."""

    @tool
    async def flood(progress: Progress) -> str:
        for i in range(20_000):
            progress(i)
            await trio.lowlevel.checkpoint()
        await trio.sleep(2)
        return "done"

    daemon, s = await start_daemon(tools=[flood])
    job = await s.send_job("flood", {})
    await trio.sleep(0.5)
    t0 = trio.current_time()
    status = await s.call("status", {})
    assert status.ok and status.result["running"] == "flood"
    nonce = await s.ping()
    await s.wait_pong(nonce)
    assert trio.current_time() - t0 < 0.05
    result = await s.wait_result(job.id)
    assert result.ok
    assert len(s.frames(ProgressFrame)) <= 2.5 / PROGRESS_INTERVAL_S + 1
