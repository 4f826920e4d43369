"""Hub session + relay on MemorySubstrate, memory sockets and MockClock (autojump).

Every test drives the hub with a scripted fake sidecar (``deskbridge_hub.testing``).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_PING_TIMEOUT,
    CLOSE_POLICY_VIOLATION,
    Hello,
    Job,
    JobError,
    JobResult,
    Ping,
    Pong,
    Timings,
    Welcome,
    decode_frame,
)
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SocketClosed
from deskbridge_hub._jobs import JobEnvelope
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import socket_pair

EPOCH = 1_700_000_000.0


def wall() -> float:
    return EPOCH + trio.current_time()


def make_state(**timings) -> HubState:
    return HubState(
        substrate=MemorySubstrate(clock=wall),
        timings=Timings(**timings),
        consumer="hub-1",
        wall_clock=wall,
    )


async def connect(nursery, state, user="u1"):
    hub_side, peer = socket_pair()
    if not state.reader.running:  # the process reader (the app runs it in production)
        await nursery.start(state.reader.run)
    nursery.start_soon(serve_sidecar, state, hub_side, user)
    await peer.send(Hello(protocol_version=1, sidecar_version="test"))
    welcome = await peer.receive()
    assert isinstance(welcome, Welcome)
    return peer, welcome


async def answer_jobs(peer, executed, delay_s=0.0):
    """A well-behaved sidecar: answers pings at once, echoes job args after ``delay_s``
    (each job in its own task, so pongs never wait behind a job)."""

    async def run(frame):
        executed.append(frame)
        await trio.sleep(delay_s)
        await peer.send(JobResult(frame.id, True, frame.args))

    try:
        async with trio.open_nursery() as nursery:
            async for raw in peer._inbox:
                frame = decode_frame(raw)
                if isinstance(frame, Ping):
                    await peer.send(Pong(frame.nonce))
                elif isinstance(frame, Job):
                    nursery.start_soon(run, frame)
    except* (trio.ClosedResourceError, trio.BrokenResourceError, SocketClosed):
        pass  # the test dropped the socket (a ping may arrive as it does)


async def test_welcome_sets_presence_and_echo_round_trips(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, welcome = await connect(nursery, state)
        assert welcome.heartbeat_s == 30.0 and welcome.ping_timeout_s == 10.0
        presence = await bridge.presence("u1")
        assert presence.online and presence.session_id == welcome.session_id
        executed = []
        nursery.start_soon(answer_jobs, peer, executed)
        outcome = await bridge.dispatch("u1", "echo", {"a": 1}, idempotency_key="k1")
        assert outcome.status == "completed" and outcome.result == {"a": 1}
        assert [j.idempotency_key for j in executed] == ["k1"]
        assert executed[0].job_id == outcome.job_id
        await trio.testing.wait_all_tasks_blocked()
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_presence_survives_heartbeats_and_clears_on_disconnect(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [])
        await trio.sleep(300)  # many TTLs: the heartbeat keeps it alive
        assert (await bridge.presence("u1")).online
        await peer.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        assert not (await bridge.presence("u1")).online
        nursery.cancel_scope.cancel()  # the process reader runs until cancelled
        nursery.cancel_scope.cancel()


async def test_offline_answers_at_once_and_enqueues_nothing(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    start = trio.current_time()
    outcome = await bridge.dispatch("nobody", "echo", {})
    assert outcome.status == "offline" and outcome.job_id is None
    assert trio.current_time() == start
    assert state.substrate.pending_count("nobody") == 0


async def test_malformed_frame_closes_with_1007_and_clears_presence(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        await peer.send_raw("{not json")
        await peer.closed.wait()
        assert peer.close_code == CLOSE_INVALID_PAYLOAD
        await trio.testing.wait_all_tasks_blocked()
        assert not (await bridge.presence("u1")).online
        nursery.cancel_scope.cancel()  # the process reader runs until cancelled


async def test_first_frame_must_be_hello(autojump_clock):
    state = make_state()
    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await peer.send(Ping("x"))
        await peer.closed.wait()
    assert peer.close_code == CLOSE_POLICY_VIOLATION
    assert "hello" in peer.close_reason
    assert not (await Bridge(state.substrate).presence("u1")).online


async def test_wrong_protocol_version_is_refused(autojump_clock):
    state = make_state()
    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await peer.send(Hello(protocol_version=99, sidecar_version="x"))
        await peer.closed.wait()
    assert peer.close_code == CLOSE_POLICY_VIOLATION
    assert "protocol_version" in peer.close_reason


async def test_result_for_an_id_not_delivered_here_is_refused(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        outcome = {}

        async def caller():
            outcome["o"] = await bridge.dispatch("u1", "echo", {"v": 1}, timeout_s=30)

        nursery.start_soon(caller)
        job = await peer.receive()
        assert isinstance(job, Job)
        await peer.send(JobResult("forged-id", True, {"v": "evil"}))
        await trio.sleep(1)
        assert "o" not in outcome  # the forged result completed nothing
        await peer.send(JobResult(job.id, True, {"v": 1}))
        await trio.testing.wait_all_tasks_blocked()
        assert outcome["o"].result == {"v": 1}
        nursery.cancel_scope.cancel()


async def test_failed_tool_maps_to_failed_with_code(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)

        async def sidecar():
            job = await peer.receive()
            await peer.send(JobResult(job.id, False, error=JobError("tool_error", "no such page")))

        nursery.start_soon(sidecar)
        outcome = await bridge.dispatch("u1", "click", {})
        assert outcome.status == "failed"
        assert outcome.error == {"code": "tool_error", "message": "no such page"}
        nursery.cancel_scope.cancel()


async def test_sidecar_that_stops_answering_pings_is_dropped(autojump_clock):
    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        start = trio.current_time()
        with trio.fail_after(60):
            await peer.closed.wait()  # never answers the ping
        took = trio.current_time() - start
        assert peer.close_code == CLOSE_PING_TIMEOUT
        t = state.timings
        # a peer that never pings: the hub's first ping after an interval and half a
        # timeout of silence (a sidecar's own first ping comes first), then its timeout
        window_s = t.ping_interval_s + t.ping_timeout_s / 2 + t.ping_timeout_s
        assert window_s <= took <= window_s + 1
        await trio.testing.wait_all_tasks_blocked()
        assert not (await bridge.presence("u1")).online
        nursery.cancel_scope.cancel()  # the process reader runs until cancelled


async def enqueue(state, user, name="echo", args=None, key="k", deadline_in_s=3600.0, job_id="j1"):
    env = JobEnvelope(job_id, name, args or {}, key, wall() + deadline_in_s, wall())
    return await state.substrate.enqueue(user, env.to_fields(), maxlen=500)


async def test_startup_drain_delivers_own_pending_once_without_spinning(autojump_clock):
    """A pending entry of this consumer (socket dropped mid-job) is redelivered once by the
    next session's drain, and the drain never re-dispatches it while it runs."""
    state = make_state()
    await enqueue(state, "u1", key="k-drain")
    # The previous session read it (now in hub-1's pending entries list) and died.
    got = await state.substrate.read_new("u1", "hub-1", count=10, block_ms=1)
    assert len(got) == 1
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        executed = []
        nursery.start_soon(answer_jobs, peer, executed, 60.0)  # a 60 s browser job
        await trio.sleep(30)
        assert len(executed) == 1  # delivered, and not again while it runs
        await trio.sleep(60)
        assert [j.idempotency_key for j in executed] == ["k-drain"]
        assert state.substrate.pending_count("u1") == 0
        payload = await state.substrate.wait_result("u1", "j1", timeout_s=1)
        assert payload is not None and '"completed"' in payload
        nursery.cancel_scope.cancel()


async def test_dead_consumers_entry_is_reclaimed_at_reclaim_idle_not_before(autojump_clock):
    state = make_state(reclaim_idle_s=180.0)
    await enqueue(state, "u1", key="k-reclaim")
    await state.substrate.read_new("u1", "dead-pod", count=10, block_ms=1)
    claimed_at = []
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        start = trio.current_time()

        async def sidecar():
            async for raw in peer._inbox:
                frame = decode_frame(raw)
                if isinstance(frame, Ping):
                    await peer.send(Pong(frame.nonce))
                elif isinstance(frame, Job):
                    claimed_at.append(trio.current_time() - start)
                    await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar)
        await trio.sleep(400)
        assert len(claimed_at) == 1
        # reclaimed once idle >= 180 s, within one idle read (2 s) plus a reclaim period
        assert 180.0 <= claimed_at[0] <= 180.0 + 45.0 + 2.0
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_job_past_its_deadline_is_never_forwarded(autojump_clock):
    state = make_state()
    await enqueue(state, "u1", key="k-old", deadline_in_s=-1.0, job_id="j-old")
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        executed = []
        nursery.start_soon(answer_jobs, peer, executed)
        payload = await state.substrate.wait_result("u1", "j-old", timeout_s=10)
        assert payload is not None and '"expired"' in payload
        await trio.sleep(5)
        assert executed == []
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_ack_waits_until_the_result_is_published(autojump_clock):
    state = make_state()
    await enqueue(state, "u1", key="k-ack", job_id="j-ack")
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        job = await peer.receive()
        while not isinstance(job, Job):
            job = await peer.receive()
        state.substrate.set_unavailable(True)
        await peer.send(JobResult(job.id, True, {"done": True}))
        await trio.sleep(3)
        state.substrate.set_unavailable(False)
        assert state.substrate.pending_count("u1") == 1  # not acked while unpublished
        payload = await state.substrate.wait_result("u1", "j-ack", timeout_s=30)
        assert payload is not None and '"done"' in payload
        await trio.testing.wait_all_tasks_blocked()
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_drain_lets_running_job_finish_then_closes_with_1012(autojump_clock):
    from deskbridge_common import CLOSE_SERVICE_RESTART
    from deskbridge_hub._shutdown import drain

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        executed = []
        nursery.start_soon(answer_jobs, peer, executed, 8.0)
        outcomes = []

        async def caller(key):
            outcomes.append(await bridge.dispatch("u1", "sleep", {}, idempotency_key=key))

        nursery.start_soon(caller, "running")
        await trio.sleep(1)
        assert len(executed) == 1
        started = trio.current_time()
        await drain(state, grace_s=20.0)
        took = trio.current_time() - started
        assert 7.0 - 0.01 <= took <= 8.0  # waited for the 8 s job, not the whole grace
        assert peer.close_code == CLOSE_SERVICE_RESTART
        assert [o.status for o in outcomes] == ["completed"]
        # a job enqueued after the drain began is not read by this process
        await enqueue(state, "u1", key="late", job_id="j-late")
        await trio.sleep(5)
        assert [j.idempotency_key for j in executed] == ["running"]
        nursery.cancel_scope.cancel()


async def test_drain_gives_up_at_grace_and_leaves_the_entry_pending(autojump_clock):
    from deskbridge_hub._shutdown import drain

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [], 600.0)
        nursery.start_soon(lambda: bridge.dispatch("u1", "sleep", {}, timeout_s=900))
        await trio.sleep(1)
        started = trio.current_time()
        await drain(state, grace_s=5.0)
        assert trio.current_time() - started == 5.0
        await trio.testing.wait_all_tasks_blocked()
        assert state.substrate.pending_count("u1") == 1  # redelivered by reclaim later
        nursery.cancel_scope.cancel()


async def test_newest_session_wins_and_the_older_finishes_its_job_first(autojump_clock):
    from deskbridge_common import CLOSE_SUPERSEDED

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        old, _ = await connect(nursery, state)
        old_jobs = []
        nursery.start_soon(answer_jobs, old, old_jobs, 5.0)
        outcomes = {}

        async def caller(key):
            outcomes[key] = await bridge.dispatch("u1", "echo", {"k": key}, idempotency_key=key)

        nursery.start_soon(caller, "before")
        await trio.sleep(1)
        assert [j.idempotency_key for j in old_jobs] == ["before"]
        new, welcome = await connect(nursery, state)
        new_jobs = []
        nursery.start_soon(answer_jobs, new, new_jobs)
        assert (await bridge.presence("u1")).session_id == welcome.session_id
        with trio.fail_after(10):
            await old.closed.wait()
        assert old.close_code == CLOSE_SUPERSEDED
        assert outcomes["before"].status == "completed"  # finished before the close
        await caller("after")
        assert outcomes["after"].status == "completed"
        assert [j.idempotency_key for j in new_jobs] == ["after"]
        assert [j.idempotency_key for j in old_jobs] == ["before"]
        nursery.cancel_scope.cancel()


async def test_a_newer_session_on_another_process_supersedes_the_older_at_once(autojump_clock):
    """Newest wins on every process at once, not at the older one's next heartbeat: the
    newer session's handshake pushes a notice onto the older one's process wake list.
    (Before, with two hub workers, a newer sidecar that left within the heartbeat
    cleared presence, the connected older one read offline until its heartbeat put it
    back, and it was never told it had been replaced.)"""
    from deskbridge_common import CLOSE_SUPERSEDED

    first = make_state()
    second = HubState(
        substrate=first.substrate, timings=first.timings, consumer="hub-2", wall_clock=wall
    )
    bridge = Bridge(first.substrate, first.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        old, _ = await connect(nursery, first)
        nursery.start_soon(answer_jobs, old, [])
        await trio.sleep(1)
        new, welcome = await connect(nursery, second)
        taken = trio.current_time()
        with trio.fail_after(first.timings.heartbeat_s):
            await old.closed.wait()
        assert old.close_code == CLOSE_SUPERSEDED
        assert trio.current_time() - taken < 1.0  # at once, not at the next heartbeat
        await new.disconnect()  # the newer sidecar leaves too: nobody is connected
        await trio.sleep(2 * first.timings.heartbeat_s)
        assert not (await bridge.presence("u1")).online  # and nobody says so
        nursery.cancel_scope.cancel()


async def test_a_newer_session_refused_for_redis_down_does_not_supersede_the_older(
    autojump_clock,
):
    # A second sidecar for the user arriving while Redis is down is closed with 1013 and
    # retries; the working one must not be closed with 4001 (it would stop for good).
    from deskbridge_common import CLOSE_TRY_AGAIN_LATER

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        old, welcome = await connect(nursery, state)
        old_jobs = []
        nursery.start_soon(answer_jobs, old, old_jobs)
        state.substrate.set_unavailable(True)
        hub_side, new = socket_pair()
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await new.send(Hello(protocol_version=1, sidecar_version="test"))
        with trio.fail_after(10):
            await new.closed.wait()
        assert new.close_code == CLOSE_TRY_AGAIN_LATER
        await trio.sleep(5)
        state.substrate.set_unavailable(False)
        await trio.sleep(1)
        assert not old.closed.is_set()
        assert (await bridge.presence("u1")).session_id == welcome.session_id
        outcome = await bridge.dispatch("u1", "echo", {"k": 1}, idempotency_key="after")
        assert outcome.status == "completed"
        assert [j.idempotency_key for j in old_jobs] == ["after"]
        nursery.cancel_scope.cancel()


async def test_job_still_running_at_the_reclaim_idle_is_not_executed_twice(autojump_clock):
    state = make_state(reclaim_idle_s=180.0)
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        executed = []
        nursery.start_soon(answer_jobs, peer, executed, 400.0)  # runs past two reclaim idles
        outcome = await bridge.dispatch("u1", "long", {}, idempotency_key="k-long", timeout_s=900)
        assert outcome.status == "completed"
        assert [j.idempotency_key for j in executed] == ["k-long"]
        nursery.cancel_scope.cancel()


async def test_drain_waits_for_dispatch_requests_waiting_in_this_process(autojump_clock):
    from deskbridge_hub._shutdown import drain

    state = make_state()
    done = []

    async def request(seconds):
        with state.drain.tracking_request():
            await trio.sleep(seconds)
        done.append(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, 6.0)
        nursery.start_soon(request, 50.0)
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()
        await drain(state, grace_s=20.0)
        assert trio.current_time() - started == 20.0  # bounded by the grace
        assert done == [6.0]
        nursery.cancel_scope.cancel()


async def test_presence_returns_within_a_second_after_redis_comes_back_empty(autojump_clock):
    state = make_state()  # heartbeat 30 s
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        peer, _ = await connect(nursery, state)
        nursery.start_soon(answer_jobs, peer, [])
        await trio.sleep(29.5)
        state.substrate.set_unavailable(True)  # Redis down across a heartbeat
        await trio.sleep(5)
        state.substrate._kv.clear()  # it comes back without its data
        state.substrate.set_unavailable(False)
        back = trio.current_time()
        while not (await bridge.presence("u1")).online:  # noqa: ASYNC110 - mock clock
            await trio.sleep(0.1)
        assert trio.current_time() - back <= 1.0  # not a whole heartbeat later
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("lifetime_s", [3.0, 95.0])  # before the first ping is due, and after
async def test_session_closes_when_its_token_expires(autojump_clock, lifetime_s):
    from deskbridge_common import CLOSE_TOKEN_EXPIRED

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        nursery.start_soon(
            lambda: serve_sidecar(state, hub_side, "u1", expires_at=wall() + lifetime_s)
        )
        await peer.send(Hello(protocol_version=1, sidecar_version="test"))
        assert isinstance(await peer.receive(), Welcome)
        nursery.start_soon(answer_jobs, peer, [])
        start = trio.current_time()
        await peer.closed.wait()
        assert peer.close_code == CLOSE_TOKEN_EXPIRED
        assert lifetime_s <= trio.current_time() - start <= lifetime_s + 0.5
        await trio.testing.wait_all_tasks_blocked()
        assert not (await bridge.presence("u1")).online
        nursery.cancel_scope.cancel()  # the process reader runs until cancelled


async def test_progress_of_a_running_delivery_reaches_the_hook_and_stray_progress_closes_1008(
    autojump_clock,
):
    from deskbridge_common import Progress

    state = make_state()
    bridge = Bridge(state.substrate, state.timings, wall_clock=wall)
    seen = []
    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        nursery.start_soon(
            lambda: serve_sidecar(
                state, hub_side, "u1", on_progress=lambda job_id, p: seen.append((job_id, p))
            )
        )
        await peer.send(Hello(protocol_version=1, sidecar_version="test"))
        assert isinstance(await peer.receive(), Welcome)
        outcomes = []

        async def call():
            outcomes.append(await bridge.dispatch("u1", "echo", {"a": 1}))

        nursery.start_soon(call)
        job = await peer.receive()
        assert isinstance(job, Job)
        await peer.send(Progress(job.id, 1, 2, "half"))
        await peer.send(JobResult(job.id, True, "done"))
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [(job.job_id, Progress(job.id, 1, 2, "half"))]
        assert outcomes[0].status == "completed"
        # After its job_result the delivery is no longer outstanding: progress breaks the rules.
        await peer.send(Progress(job.id, 2, 2))
        await peer.closed.wait()
        assert peer.close_code == CLOSE_POLICY_VIOLATION
        assert "not outstanding" in peer.close_reason
        nursery.cancel_scope.cancel()
