"""Issue 5: every outcome, deadlines, cancellation, the catalogue — on MemorySubstrate,
memory sockets and MockClock (autojump). One scripted fake sidecar per test."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from deskbridge_common import (
    Cancel,
    Hello,
    Job,
    JobError,
    JobResult,
    Ping,
    Pong,
    Timings,
    ToolSpec,
    Welcome,
    decode_frame,
)
from deskbridge_hub import BadRequest, Bridge, SubstrateUnavailable, UnknownJob
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import socket_pair

from tests.hub.test_session import wall


@pytest.fixture
def state() -> HubState:
    return HubState(
        substrate=MemorySubstrate(clock=wall), timings=Timings(), consumer="hub-1", wall_clock=wall
    )


@pytest.fixture
def bridge(state) -> Bridge:
    return Bridge(state.substrate, state.timings, wall_clock=wall)


async def connect(nursery, state, tools=(), user="u1", daemon_id=None):
    hub_side, peer = socket_pair()
    if not state.reader.running:  # the process reader (the app runs it in production)
        await nursery.start(state.reader.run)
    nursery.start_soon(serve_sidecar, state, hub_side, user)
    hello = Hello(
        protocol_version=1, sidecar_version="test", tools=tuple(tools), daemon_id=daemon_id
    )
    await peer.send(hello)
    assert isinstance(await peer.receive(), Welcome)
    return peer


async def sidecar(peer, handler):
    """Answer pings; hand every job/cancel frame to ``handler(frame)`` in its own task."""
    try:
        async with trio.open_nursery() as nursery:
            async for raw in peer._inbox:
                frame = decode_frame(raw)
                if isinstance(frame, Ping):
                    await peer.send(Pong(frame.nonce))
                else:
                    nursery.start_soon(handler, frame)
    except* (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


async def test_expired_on_arrival_at_the_sidecar_is_reported_expired(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def refuse(frame):
            if isinstance(frame, Job):
                await peer.send(JobResult(frame.id, False, error=JobError("expired", "late")))

        nursery.start_soon(sidecar, peer, refuse)
        outcome = await bridge.dispatch("u1", "click", {})
        assert outcome.status == "expired" and outcome.error["code"] == "expired"
        nursery.cancel_scope.cancel()


async def test_in_doubt_from_the_sidecar_is_its_own_outcome(autojump_clock, state, bridge):
    """The sidecar's ledger answers a job that started before a crash ``in_doubt``: the
    hub reports it as that outcome (409, ``JobInDoubt``), not as a plain failure."""
    from deskbridge_hub import JobInDoubt
    from deskbridge_hub._app import HTTP_STATUS

    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def doubt(frame):
            if isinstance(frame, Job):
                error = JobError("in_doubt", "started, sidecar died")
                await peer.send(JobResult(frame.id, False, error=error))

        nursery.start_soon(sidecar, peer, doubt)
        outcome = await bridge.dispatch("u1", "click", {})
        assert outcome.status == "in_doubt" and outcome.error["code"] == "in_doubt"
        with pytest.raises(JobInDoubt):
            await bridge.call("u1", "click", {})
        assert HTTP_STATUS["in_doubt"] == 409
        nursery.cancel_scope.cancel()


async def test_timeout_says_queued_when_nobody_took_the_job(autojump_clock, state, bridge):
    # presence lingers (a hub process died without clearing it) but nothing reads the stream
    await state.substrate.set_presence("u1", "ghost", 30)
    outcome = await bridge.dispatch("u1", "click", {}, timeout_s=5)
    assert outcome.status == "timeout"
    assert outcome.detail == {"stage": "queued"}
    assert "queued" in outcome.error["message"]
    assert trio.current_time() == pytest.approx(5.0)


async def test_timeout_says_delivered_when_the_desktop_holds_it(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)
        received = []

        async def never_answer(frame):
            received.append(frame)

        nursery.start_soon(sidecar, peer, never_answer)
        outcome = await bridge.dispatch("u1", "click", {}, timeout_s=5)
        assert [type(f) for f in received] == [Job]
        assert outcome.status == "timeout" and outcome.detail == {"stage": "delivered"}
        nursery.cancel_scope.cancel()


async def test_desktop_leaving_mid_job_is_told_as_interrupted(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def vanish(frame):
            await peer.disconnect()  # the lid closes with the job running

        nursery.start_soon(sidecar, peer, vanish)
        outcome = await bridge.dispatch("u1", "click", {}, timeout_s=30)
        assert outcome.status == "timeout"
        assert outcome.detail == {"stage": "interrupted"}
        assert "went away" in outcome.error["message"]
        nursery.cancel_scope.cancel()


async def test_redelivery_completing_before_the_deadline_wins(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        first = await connect(nursery, state)

        async def vanish(frame):
            await first.disconnect()

        nursery.start_soon(sidecar, first, vanish)
        outcomes = []

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "echo", {"x": 1}, timeout_s=60))

        nursery.start_soon(caller)
        await trio.sleep(5)
        second = await connect(nursery, state)  # same process: drains its pending entry

        async def answer(frame):
            if isinstance(frame, Job):
                await second.send(JobResult(frame.id, True, frame.args))

        nursery.start_soon(sidecar, second, answer)
        await trio.sleep(10)
        assert [o.status for o in outcomes] == ["completed"]
        nursery.cancel_scope.cancel()


async def test_unavailable_is_not_offline(autojump_clock, state, bridge):
    state.substrate.set_unavailable(True)
    with pytest.raises(SubstrateUnavailable):
        await bridge.dispatch("u1", "echo", {})
    with pytest.raises(SubstrateUnavailable):
        await bridge.presence("u1")


async def test_trimmed_entry_is_answered_lost_before_its_timeout(autojump_clock, state, bridge):
    """A queued entry's body taken by something else than the submit (an operator's
    XTRIM or XDEL, another writer's trim; a full queue refuses new calls, so the submit's
    own trim never takes one, tests/hub/test_queue_full.py): its caller is answered
    ``lost`` as soon as a desktop's session sweeps, not at its timeout."""

    async def trim() -> None:  # an outside trim to 3 entries: the two oldest jobs' bodies
        for i in range(2):
            await state.substrate.enqueue("u1", {"filler": str(i)}, maxlen=3)

    statuses, ran = await _three_queued_then_served(state, bridge, trim, wait_s=10)
    assert statuses == {"k0": "lost", "k1": "lost", "k2": "completed"}
    assert sorted(ran) == ["k2"]


async def test_entry_deleted_from_the_middle_is_answered_lost_by_a_session(
    autojump_clock, state, bridge
):
    """The same for a queued entry deleted from the middle of the stream (an operator's
    XDEL; the stream's first entry stays): the session reads the others, its next beat is
    deep and finds the gap, the sweep answers the caller ``lost`` and drops its index
    record. Was: the sweep looked only below the stream's first entry; the caller waited
    for its timeout and the record took a place in the queue for ever."""
    from deskbridge_hub._memory_streams import _format_id

    sub = state.substrate

    async def xdel() -> None:  # k1's entry
        sub.delete_entry("u1", _format_id(sorted(sub._index["u1"])[1]))

    wait_s = 2 * state.timings.heartbeat_s  # less than the 90 s call timeout
    statuses, ran = await _three_queued_then_served(state, bridge, xdel, wait_s=wait_s)
    assert statuses == {"k0": "completed", "k1": "lost", "k2": "completed"}
    assert sorted(ran) == ["k0", "k2"]
    assert sub._index.get("u1", {}) == {}


async def _three_queued_then_served(state, bridge, take_bodies, *, wait_s):
    """Three calls (``k0``..``k2``) queued for a desktop that looks online, then
    ``take_bodies()``, then a desktop connects and answers every job; after ``wait_s``:
    each call's status by key, and the keys the desktop ran."""
    await state.substrate.set_presence("u1", "ghost", 3600)  # looks online, nobody reads
    outcomes = []

    async def caller(key):
        outcomes.append((key, await bridge.dispatch("u1", "echo", {}, idempotency_key=key)))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(caller, f"k{i}")
            await trio.sleep(0.01)
        await take_bodies()
        await trio.sleep(1)
        peer = await connect(nursery, state)
        ran = []

        async def answer(frame):
            if isinstance(frame, Job):
                ran.append(frame.idempotency_key)
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, answer)
        await trio.sleep(wait_s)
        nursery.cancel_scope.cancel()
    assert len(outcomes) == 3, outcomes
    return dict((k, o.status) for k, o in outcomes), ran


async def test_cancel_queued_job_is_never_started(autojump_clock, state, bridge):
    await state.substrate.set_presence("u1", "ghost", 3600)
    outcomes = []
    async with trio.open_nursery() as nursery:

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "click", {}, job_id="job-1", timeout_s=60))

        nursery.start_soon(caller)
        await trio.sleep(1)
        assert await bridge.cancel("job-1") == "queued"
        await trio.testing.wait_all_tasks_blocked()
        assert [o.status for o in outcomes] == ["cancelled"]
        peer = await connect(nursery, state)  # the desktop shows up afterwards
        seen = []

        async def record(frame):
            seen.append(frame)

        nursery.start_soon(sidecar, peer, record)
        await trio.sleep(10)
        assert seen == []  # neither the job nor the control entry reached the desktop
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_cancel_never_says_cancelled_for_a_job_a_hub_has_just_delivered(
    autojump_clock, state, bridge
):
    """Issue 16: the cancel read the state ``queued``, but a hub marked the job delivered
    before the cancel flag was set (it is on its way to the desktop and may run). The
    caller is not answered "cancelled before it started": the delivery's own answer
    (here the tool's) is the one it gets."""
    from deskbridge_hub._jobstate import JobState, Stage

    s = state.substrate
    await s.set_presence("u1", "ghost", 3600)
    outcomes = []
    async with trio.open_nursery() as nursery:

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "click", {}, job_id="job-3", timeout_s=60))

        nursery.start_soon(caller)
        await trio.sleep(1)
        queued = await s.get_job_state("u1", "job-3")
        assert queued is not None and queued.stage is Stage.QUEUED
        delivered = JobState(Stage.DELIVERED, "u1", at=wall(), session_id="ghost")
        marked = await s.mark_delivered("u1", "job-3", delivered, ttl_s=300)
        assert marked.verdict == "delivered"
        # what the cancel's state read saw, a moment before the mark
        await s.set_job_state("u1", "job-3", queued, ttl_s=300)
        assert await bridge.cancel("job-3") == "delivered"
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == []
        done = JobState(Stage.FINISHED, "u1", at=wall())
        payload = json.dumps({"status": "completed", "result": 7})
        await s.finish(
            "u1", "job-3", payload, done, ttl_s=300, epoch=marked.epoch, notify=queued.reply_to
        )
        await trio.testing.wait_all_tasks_blocked()
        assert [(o.status, o.result) for o in outcomes] == [("completed", 7)]
        nursery.cancel_scope.cancel()


async def test_cancel_running_job_sends_cancel_at_once(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)
        running = {}

        async def tool(frame):
            if isinstance(frame, Job):
                running[frame.id] = trio.current_time()
            elif isinstance(frame, Cancel):
                running["cancelled_at"] = trio.current_time()
                await peer.send(JobResult(frame.id, False, error=JobError("cancelled", "stop")))

        nursery.start_soon(sidecar, peer, tool)
        outcomes = []

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "click", {}, job_id="job-2"))

        nursery.start_soon(caller)
        await trio.sleep(3)
        asked = trio.current_time()
        assert await bridge.cancel("job-2") == "delivered"
        await trio.testing.wait_all_tasks_blocked()
        assert running["cancelled_at"] == asked  # not on the next heartbeat
        assert [o.status for o in outcomes] == ["cancelled"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("same_daemon", [True, False])
async def test_the_same_daemon_back_in_this_process_gets_its_job_again_at_once(
    autojump_clock, state, bridge, same_daemon
):
    """Issue 16: a half-open cut (the hub's old socket stays silent, no FIN) and the
    same daemon reconnects to this process while its job is in flight on the old
    socket. That socket is dead (a daemon holds one session at a time): the old session
    ends at once and the job is redelivered to the new socket (the daemon's ledger joins
    or answers it), not after the old session's grace (20 s) or ping deadline (20 s).
    Another daemon of the same user may still be running it on the old socket: that
    session keeps its grace, and then its caller is answered ``in_doubt`` for good (never
    redelivered to the other desktop, whose ledger has not seen it: it ran twice)."""
    async with trio.open_nursery() as nursery:
        old = await connect(nursery, state, daemon_id="d1")
        seen: list[tuple[str, float]] = []

        async def silent():  # the hub's end of a half-open socket: nothing comes back
            async for raw in old._inbox:
                if isinstance(decode_frame(raw), Job):
                    seen.append(("old", trio.current_time()))

        nursery.start_soon(silent)
        outcomes = []
        answered = trio.Event()

        async def caller():
            outcomes.append(await bridge.dispatch("u1", "click", {}, job_id="job-h", timeout_s=60))
            answered.set()

        nursery.start_soon(caller)
        await trio.sleep(1)
        assert [who for who, _ in seen] == ["old"]
        back_at = trio.current_time()
        new = await connect(nursery, state, daemon_id="d1" if same_daemon else "d2")

        async def answer(frame):
            if isinstance(frame, Job):
                seen.append(("new", trio.current_time()))
                await new.send(JobResult(frame.id, True, {"ran": 1}))

        nursery.start_soon(sidecar, new, answer)
        with trio.fail_after(60):
            await answered.wait()
        if same_daemon:
            assert [o.status for o in outcomes] == ["completed"]
            (redelivered_at,) = [t for who, t in seen if who == "new"]
            assert redelivered_at - back_at < 1.0, seen
        else:
            assert [o.status for o in outcomes] == ["in_doubt"], outcomes
            assert trio.current_time() - back_at >= state.timings.grace_s - 1.0
            await trio.sleep(state.timings.reclaim_idle_s + 4 * state.timings.heartbeat_s)
            assert [who for who, _ in seen] == ["old"], seen  # never run on the other
        nursery.cancel_scope.cancel()


async def test_cancel_unknown_job(autojump_clock, bridge):
    with pytest.raises(UnknownJob):
        await bridge.cancel("no-such-job")


async def running_job(
    nursery: trio.Nursery,
    state: Any,
    bridge: Bridge,
    seen: list[tuple[str, float]],
    label: str,
    *,
    daemon_id: str,
    job_id: str,
) -> Any:
    """Connect a desktop (``daemon_id``) to ``state`` that records each job it gets in
    ``seen`` as ``(label, time)`` and never answers; dispatch ``job_id`` (``click`` for
    u1, 600 s); return the desktop's connection once the job reached it."""
    desk = await connect(nursery, state, daemon_id=daemon_id)
    first = trio.Event()

    async def running(frame):
        if isinstance(frame, Job):
            seen.append((label, trio.current_time()))
            first.set()

    nursery.start_soon(sidecar, desk, running)
    nursery.start_soon(
        functools.partial(bridge.dispatch, "u1", "click", {}, job_id=job_id, timeout_s=600)
    )
    await first.wait()
    return desk


async def ignore(frame):
    pass


SCHEMA = {
    "type": "object",
    "properties": {"selector": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
    "required": ["selector"],
    "additionalProperties": False,
}


async def test_catalogue_is_listed_and_enforced_before_enqueue(autojump_clock, state, bridge):
    tools = [ToolSpec("click", "click a thing", SCHEMA, True), ToolSpec("echo")]
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, tools)
        nursery.start_soon(sidecar, peer, ignore)
        listed = await bridge.tools("u1")
        assert [t["name"] for t in listed] == ["click", "echo"]
        assert listed[0]["side_effects"] is True and listed[0]["args_schema"] == SCHEMA
        with pytest.raises(BadRequest) as info:
            await bridge.dispatch("u1", "type_text", {})
        assert info.value.field == "name" and "click" in str(info.value)
        for bad in (
            {},
            {"selector": 3},
            {"selector": "#a", "times": 0},
            {"selector": "#a", "x": 1},
        ):
            with pytest.raises(BadRequest) as info:
                await bridge.dispatch("u1", "click", bad)
            assert info.value.field == "args"
        assert state.substrate.pending_count("u1") == 0
        assert (
            state.substrate._streams.get("u1") is None or not state.substrate._streams["u1"].entries
        )
        nursery.cancel_scope.cancel()


async def test_stale_backlog_never_runs_when_the_desktop_returns(autojump_clock, state, bridge):
    """Desktop away for 10 min of mock time; 20 jobs with 30 s deadlines meanwhile; when it
    returns none of them runs, and every caller was answered before it came back. A job
    the hub had written to the asleep socket may have reached the desktop, so it goes to
    the desktop again (its state says forwarded: kept a day, ``forwarded_keep_s``) and
    the desktop, as the sidecar does, refuses it past its deadline (``expired``)."""
    async with trio.open_nursery() as nursery:
        asleep = await connect(nursery, state)  # the lid closes: it stops reading at once
        outcomes = []

        async def caller(i):
            outcome = await bridge.dispatch("u1", "click", {"i": i}, timeout_s=30)
            outcomes.append((trio.current_time(), outcome))

        for i in range(20):
            nursery.start_soon(caller, i)
            await trio.sleep(0.25)
        await trio.sleep(600)
        returned_at = trio.current_time()
        assert len(outcomes) == 20
        assert all(at < returned_at for at, _ in outcomes)
        assert {o.status for _, o in outcomes} <= {"expired", "timeout"}
        back = await connect(nursery, state)
        ran = []
        refused = []

        async def record(frame):
            if isinstance(frame, Job):
                if frame.deadline <= wall():  # the sidecar's check on arrival
                    refused.append(frame.job_id)
                    await back.send(JobResult(frame.id, False, error=JobError("expired", "late")))
                    return
                ran.append(frame)
                await back.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, back, record)
        await trio.sleep(400)  # past the reclaim idle: every stale entry has been read
        assert ran == []
        assert len(refused) == len(set(refused))  # each answered by the desktop, once
        assert state.substrate.pending_count("u1") == 0
        del asleep
        nursery.cancel_scope.cancel()


async def test_outcome_table_in_docs_lists_every_status():
    from pathlib import Path

    from deskbridge_hub._app import HTTP_STATUS

    table = (Path(__file__).parents[2] / "docs" / "outcomes.md").read_text()
    for status, code in HTTP_STATUS.items():
        assert f"| `{status}` |" in table
        assert f"| {code} |" in table
    assert json.dumps(sorted(HTTP_STATUS)) == json.dumps(
        sorted(
            [
                "completed",
                "failed",
                "expired",
                "timeout",
                "offline",
                "unavailable",
                "lost",
                "cancelled",
                "in_doubt",
                "declined",
            ]
        )
    )


async def test_caller_chosen_job_id_names_one_job_only(autojump_clock, state, bridge):
    from deskbridge_hub import JobIdInUse

    await state.substrate.set_presence("u1", "ghost", 3600)
    await state.substrate.set_presence("u2", "ghost", 3600)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: bridge.dispatch("u1", "click", {}, job_id="order-42"))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(JobIdInUse):
            await bridge.dispatch("u2", "echo", {"secret": 1}, job_id="order-42")
        assert state.substrate.pending_count("u2") == 0
        assert not state.substrate._streams.get("u2")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "object", "properties": {"a": {"pattern": "(a+)+$"}}}, "pattern"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
        ({"$ref": "http://example.invalid/s.json"}, "$ref"),
        ({"type": "bogus"}, "valid JSON Schema"),
        ({"properties": {"a": {"properties": {"a": {"properties": {"a": {}}}}}}}, None),
    ],
)
async def test_hello_with_a_schema_the_hub_will_not_evaluate_is_refused(
    autojump_clock, state, schema, why
):
    from deskbridge_common import CLOSE_POLICY_VIOLATION

    hub_side, peer = socket_pair()
    async with trio.open_nursery() as nursery:
        if why is None:  # welcomed: the process reader must run (the app runs it)
            await nursery.start(state.reader.run)
        nursery.start_soon(serve_sidecar, state, hub_side, "u1")
        await peer.send(Hello(1, "test", (ToolSpec("t", "", schema, False),)))
        frame = await peer.receive() if why is None else None
        if why is None:
            assert isinstance(frame, Welcome)  # an ordinary nested schema is fine
            nursery.cancel_scope.cancel()
            return
        await peer.closed.wait()
    assert peer.close_code == CLOSE_POLICY_VIOLATION
    assert "tools[0].args_schema" in peer.close_reason and why in peer.close_reason


async def test_cancel_after_the_answer_reports_finished(autojump_clock, state, bridge):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state)

        async def answer(frame):
            if isinstance(frame, Job):
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, answer)
        outcome = await bridge.dispatch("u1", "echo", {}, job_id="done-1")
        assert outcome.status == "completed"
        assert await bridge.cancel("done-1") == "finished"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("same_daemon", [True, False])
async def test_a_job_of_a_gone_socket_waits_the_reclaim_idle_before_another_daemon_gets_it(
    autojump_clock, state, bridge, same_daemon
):
    """The desktop running a job vanishes (its socket closed: kill -9, the laptop lid)
    and another desktop of the user (another daemon: another machine, another data
    directory) connects to the same process. Before: this process's drain handed it
    the gone desktop's pending job at once, and it ran a second time while the first
    might still be running. Like the takeover across processes, only the same daemon
    gets it at once (its ledger joins or answers it); another waits RECLAIM_IDLE_S."""
    async with trio.open_nursery() as nursery:
        seen: list[tuple[str, float]] = []
        old = await running_job(nursery, state, bridge, seen, "old", daemon_id="d1", job_id="job-g")
        delivered_at = trio.current_time()
        await old.disconnect()  # gone, mid-job
        await trio.sleep(1)
        new = await connect(nursery, state, daemon_id="d1" if same_daemon else "d2")

        again = trio.Event()

        async def answer(frame):
            if isinstance(frame, Job):
                seen.append(("new", trio.current_time()))
                again.set()
                await new.send(JobResult(frame.id, True, {"ran": 1}))

        nursery.start_soon(sidecar, new, answer)
        with trio.move_on_after(state.timings.reclaim_idle_s + 2 * state.timings.heartbeat_s):
            await again.wait()
        (redelivered_at,) = [t for who, t in seen if who == "new"]
        if same_daemon:
            assert redelivered_at - delivered_at < 2.0, seen
        else:
            assert redelivered_at - delivered_at >= state.timings.reclaim_idle_s, seen
        nursery.cancel_scope.cancel()


async def test_a_flapping_desktop_does_not_push_back_the_reclaim_of_a_gone_desktops_job(
    autojump_clock, state, bridge
):
    """The desktop running a job vanishes; another desktop of the user re-attaches to the
    same process every 20 s (a flaky network). Each attach drains this consumer's
    pending entries and withholds the gone desktop's job (it may still run there). The
    drain used XREADGROUP 0, which restarts an entry's idle time: every re-attach pushed
    the reclaim back, and the job never reached the reclaim idle. The reclaim idle
    counts from the real delivery: the flapping desktop gets it then."""
    timings = state.timings
    async with trio.open_nursery() as nursery:
        seen: list[tuple[str, float]] = []
        old = await running_job(nursery, state, bridge, seen, "old", daemon_id="d1", job_id="job-f")
        delivered_at = trio.current_time()
        await old.disconnect()
        got = trio.Event()
        with trio.move_on_after(timings.reclaim_idle_s + 3 * timings.heartbeat_s):
            while not got.is_set():
                await trio.sleep(1)
                flappy = await connect(nursery, state, daemon_id="d2")

                async def answer(frame, desk=flappy):
                    if isinstance(frame, Job):
                        seen.append(("flappy", trio.current_time()))
                        got.set()
                        await desk.send(JobResult(frame.id, True, {"ran": 1}))

                nursery.start_soon(sidecar, flappy, answer)
                with trio.move_on_after(20):
                    await got.wait()
                if not got.is_set():
                    await flappy.disconnect()
        redelivered = [t for who, t in seen if who == "flappy"]
        assert redelivered, "the gone desktop's job was never reclaimed"
        assert timings.reclaim_idle_s <= redelivered[0] - delivered_at
        assert redelivered[0] - delivered_at <= timings.reclaim_idle_s + 22, seen
        nursery.cancel_scope.cancel()


async def test_an_answered_job_is_not_remembered_as_handed_to_its_desktop(
    autojump_clock, state, bridge
):
    """The process remembers which daemon each entry went to, so that its drain withholds
    a gone desktop's pending entries from another desktop. An answered (acknowledged)
    entry is no one's any more: it was remembered until 128 newer deliveries pushed it
    out, and a desktop's session then read as one that another daemon's entries may still
    be pending for (``_handed_elsewhere``)."""
    async with trio.open_nursery() as nursery:
        desk = await connect(nursery, state, daemon_id="d2")

        async def answer(frame):
            if isinstance(frame, Job):
                await desk.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, desk, answer)
        outcome = await bridge.dispatch("u1", "echo", {}, job_id="done-h")
        assert outcome.status == "completed"
        await trio.sleep(1)
        assert not state.reader._handed_to.get("u1")
        nursery.cancel_scope.cancel()
