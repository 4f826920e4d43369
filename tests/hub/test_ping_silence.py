"""When the hub pings (``_session_timers``), on MockClock (autojump) and memory sockets.

The hub pings a socket only after ``ping_interval_s`` of silence: a sidecar that pings
on its own proves itself alive, so the hub sends it no pings of its own (half the frames
of an idle desktop, issue 10). A job forwarded into a socket that has been silent for a
second or more is followed by a ping (the probe), so a dead socket behind a job is found
within ``ping_timeout_s`` of the job, not ``ping_interval_s + ping_timeout_s`` after it
died. Back-to-back calls add no pings.
"""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_common import CLOSE_PING_TIMEOUT, Job, JobResult, Ping, Pong, decode_frame
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SocketClosed
from deskbridge_hub._pacer import PACE_GRID_S
from deskbridge_hub._session_timers import PROBE_SILENCE_S

from .test_session import connect, make_state, wall


class Peer:
    """A scripted sidecar: records what the hub sends, answers as told."""

    def __init__(self, peer, *, pongs: bool = True, results: bool = True) -> None:
        self.peer, self.pongs, self.results = peer, pongs, results
        self.frames: list[tuple[float, object]] = []

    def hub_pings(self) -> list[float]:
        return [at for at, frame in self.frames if isinstance(frame, Ping)]

    async def run(self) -> None:
        try:
            async for raw in self.peer._inbox:
                frame = decode_frame(raw)
                self.frames.append((trio.current_time(), frame))
                if isinstance(frame, Ping) and self.pongs:
                    await self.peer.send(Pong(frame.nonce))
                elif isinstance(frame, Job) and self.results:
                    await self.peer.send(JobResult(frame.id, True, frame.args))
        except (trio.ClosedResourceError, trio.BrokenResourceError, SocketClosed):
            pass

    async def ping_every(self, interval_s: float, times: int) -> None:
        for i in range(times):
            await trio.sleep(interval_s)
            await self.peer.send(Ping(nonce=f"s{i}"))


async def test_a_sidecar_that_pings_every_interval_is_never_pinged_by_the_hub(autojump_clock):
    """The real sidecar pings an interval after its last pong, so its pings arrive an
    interval *plus a round trip* apart: the hub must not read that round trip as silence
    (it did: every idle desktop was pinged both ways, four frames an interval)."""
    state = make_state()
    t = state.timings
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        side = Peer(peer)
        nursery.start_soon(side.run)
        for period_s in (t.ping_interval_s * 0.9, t.ping_interval_s + 0.2, t.ping_interval_s + 5):
            await side.ping_every(period_s, 5)  # fast clock, a round trip, a slow link
        await trio.testing.wait_all_tasks_blocked()
        pongs = [f for _, f in side.frames if isinstance(f, Pong)]
        assert len(pongs) == 15  # every sidecar ping answered
        assert side.hub_pings() == []  # and none of the hub's own
        assert not peer.closed.is_set()
        # once a sidecar that pings falls silent, the hub does not ping it: the session
        # ends after an interval and a timeout of silence (the window of an unanswered
        # ping of the hub's), with 4002
        silent_from = trio.current_time()
        with trio.fail_after(t.ping_interval_s + t.ping_timeout_s + 1):
            await peer.closed.wait()
        late_s = trio.current_time() - silent_from - (t.ping_interval_s + t.ping_timeout_s)
        assert 0 <= late_s <= PACE_GRID_S  # the pacer's visits fall on its grid
        assert peer.close_code == CLOSE_PING_TIMEOUT
        assert side.hub_pings() == []
        nursery.cancel_scope.cancel()


async def test_a_peer_that_never_pings_is_pinged_after_an_interval_of_silence(autojump_clock):
    """The first time half a ping timeout later (a sidecar's first ping, due an interval
    after its welcome arrived, must not cross the hub's), then every interval."""
    state = make_state()
    t = state.timings
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        side = Peer(peer)
        nursery.start_soon(side.run)
        start = trio.current_time()
        first_s = t.ping_interval_s + t.ping_timeout_s / 2
        await trio.sleep(first_s + 2 * t.ping_interval_s + 1)
        assert [round(at - start, 3) for at in side.hub_pings()] == [
            first_s,
            first_s + t.ping_interval_s,
            first_s + 2 * t.ping_interval_s,
        ]
        assert not peer.closed.is_set()  # answered
        nursery.cancel_scope.cancel()


async def test_a_job_into_a_silent_socket_is_probed_and_a_dead_socket_ends_within_the_ping_timeout(
    autojump_clock,
):
    state = make_state()
    t = state.timings
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    outcomes = []
    answered = trio.Event()
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        side = Peer(peer, pongs=False, results=False)  # the socket died after the welcome
        nursery.start_soon(side.run)
        await trio.sleep(t.ping_interval_s / 2)  # silent for half an interval: no ping yet
        assert side.hub_pings() == []

        async def call() -> None:
            outcomes.append(await bridge.dispatch("u1", "echo", {"a": 1}, idempotency_key="k1"))
            answered.set()

        sent_at = trio.current_time()
        nursery.start_soon(call)
        with trio.fail_after(t.ping_interval_s + t.ping_timeout_s + 5):
            await peer.closed.wait()
        ended_after = trio.current_time() - sent_at
        kinds = [type(f).__name__ for _, f in side.frames]
        assert kinds[:2] == ["Job", "Ping"]  # the probe follows the job on the same socket
        assert side.hub_pings()[0] - sent_at < 0.01
        assert peer.close_code == CLOSE_PING_TIMEOUT
        # found within the ping timeout of the job, not at the next interval's ping
        assert t.ping_timeout_s <= ended_after <= t.ping_timeout_s + 1
        with trio.fail_after(t.call_timeout_s + 5):
            await answered.wait()
        assert outcomes[0].status not in ("completed", "offline")  # it may have run
        nursery.cancel_scope.cancel()


async def test_back_to_back_calls_add_no_pings_and_a_call_after_a_pause_adds_one(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        side = Peer(peer)
        nursery.start_soon(side.run)
        for i in range(20):
            outcome = await bridge.dispatch("u1", "echo", {"i": i}, idempotency_key=f"k{i}")
            assert outcome.status == "completed"
            await trio.sleep(PROBE_SILENCE_S / 4)
        assert side.hub_pings() == []
        await trio.sleep(PROBE_SILENCE_S * 2)
        outcome = await bridge.dispatch("u1", "echo", {}, idempotency_key="after-a-pause")
        assert outcome.status == "completed"
        await trio.testing.wait_all_tasks_blocked()
        assert len(side.hub_pings()) == 1
        assert not peer.closed.is_set()  # the probe was answered: the session goes on
        nursery.cancel_scope.cancel()


async def test_a_sidecar_that_pings_but_never_reads_is_still_timed_out(autojump_clock):
    """Its pings keep arriving, but the pongs pile up unread: once the hub's send queue
    is full its reader stops, the socket falls silent, and the hub's own ping (dropped,
    its deadline started all the same) ends the session with 4002."""
    from deskbridge_common import Hello
    from deskbridge_hub._session import SEND_QUEUE, serve_sidecar
    from deskbridge_hub.testing import socket_pair

    state = make_state()
    t = state.timings
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        hub_side, peer = socket_pair(buffer=4)
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await peer.send(Hello(protocol_version=1, sidecar_version="test"))
        await peer.receive()  # the welcome; nothing is read after it

        period_s = 0.01

        async def flood() -> None:
            with trio.move_on_after(10 * (t.ping_interval_s + t.ping_timeout_s)):
                for i in range(1_000_000):
                    try:
                        await peer.send(Ping(nonce=f"f{i}"))
                    except trio.BrokenResourceError:
                        return  # the hub closed it: the point of the test
                    await trio.sleep(period_s)

        start = trio.current_time()
        nursery.start_soon(flood)
        with trio.fail_after(3 * (t.ping_interval_s + t.ping_timeout_s)):
            await peer.closed.wait()
        assert peer.close_code == CLOSE_PING_TIMEOUT
        # the time to fill the queues (pongs unread), then one interval of silence and
        # the ping's timeout
        fill_s = (SEND_QUEUE + 4 + 4) * period_s
        took = trio.current_time() - start
        assert took <= fill_s + t.ping_interval_s + t.ping_timeout_s + 1
        nursery.cancel_scope.cancel()


class SlowLink:
    """The hub's side of a socket whose uplink writes ``rate_bytes_s``."""

    def __init__(self, inner, rate_bytes_s: float) -> None:
        self.inner, self.rate_bytes_s = inner, rate_bytes_s

    async def receive(self):
        return await self.inner.receive()

    async def send(self, data) -> None:
        await trio.sleep(len(data) / self.rate_bytes_s)
        await self.inner.send(data)

    async def close(self, code, reason) -> None:
        await self.inner.close(code, reason)


async def test_a_backlog_written_slowly_does_not_time_out_the_probe_behind_it(autojump_clock):
    """Eight 200 KB jobs at 80 KB/s take 20 s to write; the probe ping queued behind
    them counted its 10 s from the queue and ended a healthy, answering sidecar (4002),
    interrupting all eight. A ping's timeout counts from when it is written, and the
    frames written ahead of it restart it. Found by a review of the probe."""
    from deskbridge_common import Hello, Welcome
    from deskbridge_hub._session import serve_sidecar
    from deskbridge_hub.testing import socket_pair

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    outcomes = []
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        hub_side, peer = socket_pair()
        nursery.start_soon(serve_sidecar, state, SlowLink(hub_side, 80_000), "u1")
        await peer.send(Hello(protocol_version=1, sidecar_version="t"))
        assert isinstance(await peer.receive(), Welcome)
        side = Peer(peer)
        nursery.start_soon(side.run)
        await trio.sleep(5)  # silent: the first job is probed

        async def call(i: int) -> None:
            outcomes.append(
                await bridge.dispatch(
                    "u1", "echo", {"blob": "x" * 200_000}, idempotency_key=f"k{i}",
                    timeout_s=120,
                )
            )  # fmt: skip

        async with trio.open_nursery() as calls:
            for i in range(8):
                calls.start_soon(call, i)
        assert [o.status for o in outcomes] == ["completed"] * 8, outcomes
        await trio.sleep(1)  # the probe, written after the eight jobs, and its pong
        assert len(side.hub_pings()) == 1  # the probe went out, and was answered
        assert not peer.closed.is_set()
        nursery.cancel_scope.cancel()


async def test_one_job_that_alone_takes_longer_than_the_ping_timeout_to_write(autojump_clock):
    """A 250 KB job at 20 KB/s takes 12.5 s to write. The probe queued behind it counted
    from the end of the previous write, so the hub ended a healthy sidecar (4002) before
    the job had even arrived. Now a ping waits for the write in progress ahead of it
    and counts from its own write: the job completes once and the session stays. The
    same link then stops moving mid-frame (the sidecar stopped reading): the session
    still ends (4002), within ``ping_timeout_s + size / MIN_WRITE_BYTES_S`` of that
    write's start (and the pacer's grid)."""
    from deskbridge_common import MIN_WRITE_BYTES_S, Hello, Welcome
    from deskbridge_hub._session import serve_sidecar
    from deskbridge_hub.testing import socket_pair

    state = make_state()
    t = state.timings
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    blob = 250_000
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        hub_side, peer = socket_pair()
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await peer.send(Hello(protocol_version=1, sidecar_version="t"))
        assert isinstance(await peer.receive(), Welcome)
        side = Peer(peer)
        nursery.start_soon(side.run)
        await trio.sleep(5)  # silent: the job is probed
        hub_side.send_bytes_s = 20_000
        with trio.fail_after(60):
            outcome = await bridge.dispatch(
                "u1", "echo", {"blob": "x" * blob}, idempotency_key="k1", timeout_s=120
            )
        assert outcome.status == "completed", outcome
        await trio.sleep(1)  # the probe, written after the job, and its pong
        assert len(side.hub_pings()) == 1
        assert len([f for _, f in side.frames if isinstance(f, Job)]) == 1  # delivered once
        assert not peer.closed.is_set()

        # the sidecar stops reading 2 s into the next large job's write
        await trio.sleep(5)  # silent again: this job is probed too
        outcomes = []

        async def call() -> None:
            outcomes.append(
                await bridge.dispatch(
                    "u1", "echo", {"blob": "y" * blob}, idempotency_key="k2", timeout_s=600
                )
            )

        nursery.start_soon(call)
        await trio.sleep(2)
        write_started = trio.current_time() - 2
        hub_side.send_bytes_s = 0
        with trio.fail_after(300):
            await peer.closed.wait()
        bound_s = t.ping_timeout_s + (blob + 1_000) / MIN_WRITE_BYTES_S + PACE_GRID_S
        assert trio.current_time() - write_started <= bound_s
        assert peer.close_code == CLOSE_PING_TIMEOUT
        assert "not written within" in (peer.close_reason or "")
        nursery.cancel_scope.cancel()
