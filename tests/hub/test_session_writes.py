"""Who writes a session's frames, and in what order (``HubSession._queue``), on MockClock
(autojump) and memory sockets.

A job frame is written by the task that serves it when nothing else is being written or
waits to be (the sequential call: no hand-off to the writer task, one scheduler pass
fewer per call, issue 10); anything else, and any frame that finds a write in progress
or frames queued, goes through the writer, behind what is already there. Either way one
frame is written at a time, in the order the frames were queued, and a write's stall
bound (``Connection.writing``) holds for a direct write too.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import CLOSE_PING_TIMEOUT, Hello, Job, JobResult, Ping, Welcome, decode_frame
from deskbridge_hub import Bridge
from deskbridge_hub._session import serve_sidecar
from deskbridge_hub.testing import socket_pair

from .test_ping_silence import Peer
from .test_session import make_state, wall


class Recording:
    """The hub's side of a socket that records, per frame sent, the sending task's name
    and the frames that were being sent at the same time (each send takes
    ``send_s`` of the mock clock)."""

    def __init__(self, inner, send_s: float = 0.0) -> None:
        self.inner, self.send_s = inner, send_s
        self.sent: list[tuple[str, str]] = []  # (frame type, task name)
        self.overlaps = 0
        self._sending = 0

    async def receive(self):
        return await self.inner.receive()

    async def send(self, data) -> None:
        self._sending += 1
        self.overlaps += self._sending > 1
        try:
            if self.send_s:
                await trio.sleep(self.send_s)
            await self.inner.send(data)
            self.sent.append((decode_frame(data).type, trio.lowlevel.current_task().name))
        finally:
            self._sending -= 1

    async def close(self, code, reason) -> None:
        await self.inner.close(code, reason)


async def _session(nursery, state, hub_side):
    await nursery.start(state.reader.run)
    hub_side, peer = hub_side
    nursery.start_soon(serve_sidecar, state, hub_side, "u1")
    await peer.send(Hello(protocol_version=1, sidecar_version="t"))
    assert isinstance(await peer.receive(), Welcome)
    side = Peer(peer)
    nursery.start_soon(side.run)
    return peer, side


async def test_a_job_is_written_by_its_serving_task_when_nothing_else_is_written(
    autojump_clock,
):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    inner, peer = socket_pair()
    hub_side = Recording(inner)
    async with trio.open_nursery() as nursery:
        peer, _ = await _session(nursery, state, (hub_side, peer))
        for i in range(3):
            outcome = await bridge.dispatch("u1", "echo", {"i": i}, timeout_s=30)
            assert outcome.status == "completed", outcome
        nursery.cancel_scope.cancel()
    jobs = [task for kind, task in hub_side.sent if kind == "job"]
    assert len(jobs) == 3
    assert all(task.endswith("_serve_entry") for task in jobs), jobs
    assert hub_side.overlaps == 0


async def test_frames_queued_during_a_direct_write_follow_it_one_at_a_time_in_order(
    autojump_clock,
):
    """Ten concurrent jobs and the probe ping behind the first: every frame is written
    once, never two at a time, and the jobs in the order they were dispatched."""
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    inner, peer = socket_pair()
    hub_side = Recording(inner, send_s=0.5)
    order: list[int] = []
    async with trio.open_nursery() as nursery:
        peer, side = await _session(nursery, state, (hub_side, peer))
        await trio.sleep(5)  # silent: the first job is probed

        async def call(i: int) -> None:
            outcome = await bridge.dispatch("u1", "echo", {"i": i}, timeout_s=60)
            assert outcome.status == "completed", outcome

        async with trio.open_nursery() as calls:
            for i in range(10):
                calls.start_soon(call, i)
                await trio.sleep(0.01)
        await trio.sleep(1)
        order = [f.args["i"] for _, f in side.frames if isinstance(f, Job)]
        assert len(side.hub_pings()) == 1
        assert not peer.closed.is_set()
        nursery.cancel_scope.cancel()
    assert order == list(range(10)), order
    assert hub_side.overlaps == 0
    kinds = [kind for kind, _ in hub_side.sent]
    assert kinds.count("job") == 10 and kinds.count("ping") == 1
    jobs = [task for kind, task in hub_side.sent if kind == "job"]
    assert jobs[0].endswith("_serve_entry")  # the first went directly
    assert not all(task.endswith("_serve_entry") for task in jobs)  # others queued


async def test_a_direct_write_that_stalls_still_ends_the_session(autojump_clock):
    """The peer stops reading during a job written by its serving task: the write's
    stall bound ends the session (4002) within ``ping_timeout_s + size /
    MIN_WRITE_BYTES_S`` of the write's start, as for a write of the writer task's."""
    from deskbridge_common import MIN_WRITE_BYTES_S
    from deskbridge_hub._pacer import PACE_GRID_S

    state = make_state()
    t = state.timings
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    inner, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        peer, side = await _session(nursery, state, (inner, peer))
        await trio.sleep(5)  # silent: the job is probed
        inner.send_bytes_s = 0  # stalled from its first byte

        async def call() -> None:
            await bridge.dispatch("u1", "echo", {"blob": "z" * 1000}, timeout_s=600)

        nursery.start_soon(call)
        started = trio.current_time()
        with trio.fail_after(300):
            await peer.closed.wait()
        assert peer.close_code == CLOSE_PING_TIMEOUT
        bound_s = t.ping_timeout_s + 2_000 / MIN_WRITE_BYTES_S + PACE_GRID_S
        assert trio.current_time() - started <= bound_s
        nursery.cancel_scope.cancel()
    assert not [f for _, f in side.frames if isinstance(f, Job | Ping | JobResult)]
