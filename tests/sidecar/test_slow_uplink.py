"""A slow uplink is not the hub's silence: the sidecar's ping timeout counts from when the
ping is *written*, never while our own large frames ahead of it are still being written
(``Connection.writing``/``wrote``), and a hub that stops reading mid-frame is still found,
within the write's size-aware bound. MockClock (autojump) and throttled memory sockets
(``MemorySocket.send_bytes_s``)."""

from __future__ import annotations

import trio
from deskbridge_common import CLOSE_PING_TIMEOUT, MIN_WRITE_BYTES_S, Ping
from deskbridge_sidecar import tool

BLOB = 900_000  # characters of the result: about 0.9 MB on the wire
UPLINK = 50_000  # bytes a second: the result takes 18 s to write, over ping_timeout_s


@tool
async def big(wait_s: float) -> dict[str, str]:
    """Sleep ``wait_s``, then return a large result."""
    await trio.sleep(wait_s)
    return {"blob": "x" * BLOB}


async def test_a_large_result_on_a_slow_uplink_keeps_the_session_and_a_stalled_one_is_found(
    autojump_clock, start_daemon, hub
):
    """A 0.9 MB job_result at 50 KB/s takes 18 s to write; the sidecar's ping, queued
    behind it, counted its 10 s from the queue, so the sidecar dropped a healthy session
    (4002, a reconnect, the job redelivered and its result written again). Now the ping
    counts from its write: the session stays and the result arrives once. A hub that
    then stops reading mid-frame is still found, within ``ping_timeout_s + size /
    MIN_WRITE_BYTES_S`` of that write's start."""
    hub.uplink_bytes_s = UPLINK
    daemon, s = await start_daemon(tools=[big])
    timeout_s = s.welcome.ping_timeout_s
    interval_s = s.welcome.ping_interval_s
    # the write (from 5 s to 23 s) covers the sidecar's ping due at 10 s and at 20 s
    job = await s.send_job("big", {"wait_s": 5.0})
    with trio.fail_after(60):  # not at all on this socket if the session was dropped
        result = await s.wait_result(job.id)
    assert result.ok and len(result.result["blob"]) == BLOB
    await trio.sleep(2 * interval_s)  # the pings behind it were written and answered
    assert s.closed is None
    assert len(s.results[job.id]) == 1  # delivered once, never redelivered
    assert daemon.statistics().sessions_started == 1 and len(hub.sessions) == 1
    assert len(s.frames(Ping)) >= 2  # the sidecar kept pinging (the hub answers each)

    # the same link stops moving mid-frame (the hub stopped reading): still detected
    assert s.sidecar_end is not None
    job = await s.send_job("big", {"wait_s": 1.0})
    await trio.sleep(3.0)  # 2 s into the write
    write_started = trio.current_time() - 2.0
    s.sidecar_end.send_bytes_s = 0
    with trio.fail_after(300):
        closed = await s.wait_closed()
    # a ping is queued within an interval; the frame is a little larger than its blob
    bound_s = interval_s + timeout_s + (BLOB + 1_000) / MIN_WRITE_BYTES_S
    assert (closed.by, closed.code) == ("sidecar", CLOSE_PING_TIMEOUT)
    assert "not written within" in closed.reason, closed.reason
    assert closed.at - write_started <= bound_s
    assert job.id not in s.results
    assert daemon.statistics().last_end.cause == "ping_timeout"
