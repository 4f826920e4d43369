"""One session against the FakeHub: hello/welcome, jobs, status, pings, cancel, bad frames.

Deterministic: MockClock with autojump, memory transports, a fake wall clock.
"""

from __future__ import annotations

import logging
import threading

import pytest
import trio
from deskbridge_common import PROTOCOL_VERSION, Error, Timings, Welcome
from deskbridge_sidecar import ToolError, __version__, tool

from .conftest import HUB_URL, TOKEN, make_daemon, settle


async def test_hello_then_welcome(autojump_clock, start_daemon):
    @tool(side_effects=True)
    async def click(selector: str) -> dict:
        return {}

    daemon, s = await start_daemon(tools=[click])
    assert s.attempt.url == HUB_URL + "/v1/sidecar"
    assert s.attempt.headers["Authorization"] == f"Bearer {TOKEN}"
    assert s.received[0] is s.hello
    assert s.hello.protocol_version == PROTOCOL_VERSION
    assert s.hello.sidecar_version == __version__
    assert [t.name for t in s.hello.tools] == ["status", "echo", "sleep", "click"]
    assert s.hello.tools[-1].side_effects
    stats = daemon.statistics()
    assert stats.sessions_started == 1 and stats.session_id == s.session_id == "fake-1"


async def test_echo_is_answered_under_the_incoming_id(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    args = {"a": [1, 2], "b": {"c": None}, "d": "é"}
    result = await s.call("echo", args, id="delivery-42")
    assert (result.id, result.ok, result.result) == ("delivery-42", True, args)
    assert daemon.statistics().executions == {"echo": 1}


@pytest.mark.parametrize(
    ("name", "args", "code"),
    [
        ("nope", {}, "unknown_tool"),
        ("sleep", {"secs": 1}, "bad_args"),
        ("sleep", {"seconds": "soon"}, "bad_args"),
        ("fails", {}, "portal_refused"),
        ("raises", {}, "crashed"),
        ("returns_junk", {}, "bad_result"),
        ("returns_deep", {}, "bad_result"),
    ],
)
async def test_failures_are_answered_with_their_codes(
    autojump_clock, start_daemon, name, args, code
):
    @tool
    async def fails():
        raise ToolError("the portal refused", code="portal_refused")

    @tool
    def raises():
        raise KeyError("missing")

    @tool
    async def returns_junk():
        return object()  # not JSON-able (a set would serialise as a list)

    @tool
    async def returns_deep():
        value: list = []
        for _ in range(5000):
            value = [value]
        return value

    daemon, s = await start_daemon(tools=[fails, raises, returns_junk, returns_deep])
    result = await s.call(name, args)
    assert not result.ok and result.error.code == code
    again = await s.call(name, args, key=f"k-{name}")  # and again: still one socket
    assert again.error.code == code
    if code == "crashed":
        assert result.error.message == "KeyError('missing')"
    assert s.closed is None


async def test_status_is_answered_while_a_long_tool_runs(autojump_clock, start_daemon, wall):
    daemon, s = await start_daemon()
    long = await s.send_job("sleep", {"seconds": 60})
    await settle()
    await trio.sleep(5)
    asked = trio.current_time()
    status = await s.call("status")
    assert trio.current_time() == asked  # no virtual time passed: not queued behind sleep
    assert status.ok
    assert status.result == {
        "ok": True,
        "time": wall(),
        "monotonic": trio.current_time(),
        "version": __version__,
        "running": "sleep",
        "tools": ["status", "echo", "sleep"],
        "session_id": s.session_id,
    }
    assert (await s.wait_result(long.id)).result == {"slept_s": 60}
    assert trio.current_time() - asked == pytest.approx(55)
    after = await s.call("status")
    assert after.result["running"] is None


async def test_100_frames_during_a_60_s_tool_are_all_answered(autojump_clock, start_daemon):
    """The seed's failure: the reader awaited the job, frames piled up, the keepalive
    starved and a healthy socket was closed. Here the socket buffer holds 16 messages."""
    daemon, s = await start_daemon()
    long = await s.send_job("sleep", {"seconds": 60})
    await settle()
    started = trio.current_time()
    nonces, status_ids = [], []
    for _ in range(50):  # 100 frames in one burst, far more than the 16-message buffer
        nonces.append(await s.ping())
        status_ids.append((await s.send_job("status")).id)
    for nonce in nonces:
        assert await s.wait_pong(nonce) == started
    for delivery_id in status_ids:
        result = await s.wait_result(delivery_id)
        assert result.ok and result.result["running"] == "sleep"
    # and frames spread over the whole minute, interleaved with the sidecar's own pings
    for _ in range(50):
        await trio.sleep(1)
        sent = trio.current_time()
        nonce = await s.ping()
        assert await s.wait_pong(nonce) == sent
    assert (await s.wait_result(long.id)).ok
    assert trio.current_time() - started == pytest.approx(60)
    assert s.closed is None
    stats = daemon.statistics()
    assert stats.connect_attempts == 1 and stats.executions == {"sleep": 1, "status": 50}


async def test_cpu_bound_sync_tool_runs_in_a_thread_and_pongs_flow(autojump_clock, start_daemon):
    entered, gate = trio.Event(), threading.Event()
    threads = []

    @tool
    def crunch(n: int) -> dict:
        threads.append(threading.get_ident())
        trio.from_thread.run_sync(entered.set)
        rounds = 0
        while not gate.is_set():  # CPU-bound until the test lets go
            sum(range(n))
            rounds += 1
        return {"done": True}

    daemon, s = await start_daemon(tools=[crunch])
    try:
        job = await s.send_job("crunch", {"n": 1000})
        await entered.wait()
        # the thread is spinning now and cannot finish before gate is set
        for _ in range(5):
            nonce = await s.ping()
            await s.wait_pong(nonce)
        status = await s.call("status")
        assert status.result["running"] == "crunch"
        assert job.id not in s.results
    finally:
        gate.set()
    result = await s.wait_result(job.id)
    assert result.ok and result.result == {"done": True}
    assert threads == [threads[0]] and threads[0] != threading.get_ident()
    assert s.closed is None


async def test_tools_run_one_at_a_time_in_arrival_order(autojump_clock, start_daemon):
    log: list[tuple[str, str, float]] = []

    @tool
    async def step(name: str, seconds: float) -> str:
        log.append(("start", name, trio.current_time()))
        await trio.sleep(seconds)
        log.append(("end", name, trio.current_time()))
        return name

    daemon, s = await start_daemon(tools=[step])
    jobs = [await s.send_job("step", {"name": n, "seconds": 3}) for n in "abc"]
    results = [await s.wait_result(j.id) for j in jobs]
    assert [r.result for r in results] == ["a", "b", "c"]
    assert [(kind, name) for kind, name, _ in log] == [
        ("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"), ("start", "c"), ("end", "c"),
    ]  # fmt: skip


async def test_a_job_past_its_deadline_never_starts(autojump_clock, start_daemon, wall):
    daemon, s = await start_daemon()
    result = await s.call("sleep", {"seconds": 1}, deadline=wall() - 0.5)
    assert not result.ok and result.error.code == "expired"
    assert "sleep" not in daemon.statistics().executions


async def test_a_job_that_expires_while_queued_never_starts(autojump_clock, start_daemon, wall):
    calls = []

    @tool
    async def effect() -> str:
        calls.append(trio.current_time())
        return "done"

    daemon, s = await start_daemon(tools=[effect])
    long = await s.send_job("sleep", {"seconds": 60})
    late = await s.send_job("effect", deadline=wall() + 30)
    result = await s.wait_result(late.id)
    assert not result.ok and result.error.code == "expired"
    assert calls == [] and (await s.wait_result(long.id)).ok
    # a status past its deadline is not answered either
    status = await s.call("status", deadline=wall() - 1)
    assert status.error.code == "expired"


async def test_cancel_cancels_an_async_tool(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    job = await s.send_job("sleep", {"seconds": 60}, key="k-cancel")
    await settle()
    await trio.sleep(2)
    asked = trio.current_time()
    await s.cancel(job.id)
    result = await s.wait_result(job.id)
    assert trio.current_time() == asked
    assert not result.ok and result.error.code == "cancelled"
    # the cancellation is recorded: a redelivery of the key does not run again
    again = await s.call("sleep", {"seconds": 60}, key="k-cancel")
    assert again.error.code == "cancelled" and trio.current_time() == asked
    assert daemon.statistics().executions == {"sleep": 1}
    assert len(s.results[job.id]) == 1  # answered exactly once


async def test_cancel_of_a_queued_job_answers_at_once_and_never_runs_it(
    autojump_clock, start_daemon
):
    calls = []

    @tool
    async def effect() -> str:
        calls.append(1)
        return "done"

    daemon, s = await start_daemon(tools=[effect])
    long = await s.send_job("sleep", {"seconds": 60})
    queued = await s.send_job("effect", key="k-queued")
    await settle()
    await s.cancel(queued.id)
    result = await s.wait_result(queued.id)
    assert result.error.code == "cancelled" and trio.current_time() < 1
    assert (await s.wait_result(long.id)).ok
    await settle()
    redelivered = await s.call("effect", key="k-queued")
    assert redelivered.error.code == "cancelled"
    assert calls == [] and len(s.results[queued.id]) == 1


@pytest.mark.parametrize("finished", [False, True])
async def test_cancel_of_a_queued_redelivery_the_ledger_answers_gets_the_ledger_s_answer(
    autojump_clock, start_daemon, wall, tmp_path, finished
):
    """The hub asks a desktop for its answer to a cancelled job it had forwarded before
    (no time left, the cancel right behind: ``_delivery``). A key the ledger holds from
    before a restart (started, its process killed: ``in_doubt``; or finished) was
    answered "cancelled by the hub before it started", and recorded so: a lie about a
    job that had run. The ledger's answer is the delivery's, and the ledger keeps it."""
    from deskbridge_sidecar import Outcome
    from deskbridge_sidecar._ledger import LEDGER_FILE, Ledger, args_digest

    path = tmp_path / LEDGER_FILE
    before = Ledger.open(path, wall_clock=wall)
    await before.begin("k-before", "effect", args_digest({}), wall() + 600, "job-1")
    if finished:
        await before.finish("k-before", Outcome.success("done"), "effect", args_digest({}))
        before.close()
    else:
        before._conn.close()  # the process dies mid-run
    calls = []

    @tool(side_effects=True)
    async def effect() -> str:
        calls.append(1)
        return "done"

    ledger = Ledger.open(path, wall_clock=wall)
    daemon, s = await start_daemon(tools=[effect], ledger=ledger)
    job = await s.send_job("effect", key="k-before", job_id="job-1", timeout_s=0.0)
    await s.cancel(job.id)
    result = await s.wait_result(job.id)
    assert (result.ok, result.result) == (True, "done") if finished else (
        result.error.code == "in_doubt"
    ), result
    assert calls == []
    await settle()
    assert (await ledger.get("k-before")).outcome.ok is finished  # not rewritten


async def test_cancel_cannot_interrupt_a_sync_tool(autojump_clock, start_daemon, caplog):
    entered, gate = trio.Event(), threading.Event()

    @tool
    def blocking() -> str:
        trio.from_thread.run_sync(entered.set)
        gate.wait(30)
        return "finished"

    daemon, s = await start_daemon(tools=[blocking])
    try:
        job = await s.send_job("blocking")
        await entered.wait()
        await s.cancel(job.id)
        await trio.sleep(1)
        assert job.id not in s.results
    finally:
        gate.set()
    result = await s.wait_result(job.id)
    assert result.ok and result.result == "finished"  # the truth, not "cancelled"
    assert "cannot be interrupted" in caplog.text


async def test_cancel_for_an_unknown_delivery_is_ignored(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    await s.cancel("never-sent")
    assert (await s.call("echo", {"x": 1})).result == {"x": 1}
    assert s.closed is None


async def test_hub_stops_answering_pings_sidecar_reconnects(autojump_clock, start_daemon, hub):
    daemon, s = await start_daemon(random=lambda: 0.5)
    welcomed = trio.current_time()
    s.answer_pings = False
    closed = await s.wait_closed()
    assert (closed.by, closed.code, closed.reason) == ("sidecar", 4002, "no pong within 10 s")
    interval, timeout = s.welcome.ping_interval_s, s.welcome.ping_timeout_s
    assert closed.at - welcomed == pytest.approx(interval + timeout)
    second = await hub.next_session()
    assert second.attempt.at - welcomed <= interval + timeout + Timings().backoff_initial_s
    assert daemon.statistics().last_end.cause == "ping_timeout"


async def test_sidecar_answers_hub_pings_and_pings_on_the_welcome_interval(
    autojump_clock, start_daemon
):
    daemon, s = await start_daemon()
    welcomed = trio.current_time()
    nonce = await s.ping("hub-1")
    assert await s.wait_pong(nonce) == welcomed
    await trio.sleep(35)
    pings = [t for f, t in zip(s.received, s.received_at, strict=True) if f.type == "ping"]
    assert [t - welcomed for t in pings] == [10, 20, 30]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", 1007),
        ("[1, 2]", 1007),
        ('{"type": "bogus"}', 1008),
        ('{"type": "job", "id": "x"}', 1008),
        ('{"type": "ping", "nonce": 5}', 1007),
        ('{"type": "hello", "protocol_version": 1, "sidecar_version": "x"}', 1008),
    ],
)
async def test_malformed_frame_closes_with_its_code_then_backs_off(
    autojump_clock, start_daemon, hub, text, code
):
    daemon, s = await start_daemon(random=lambda: 0.5)
    await s.send_text(text)
    closed = await s.wait_closed()
    assert (closed.by, closed.code) == ("sidecar", code)
    errors = s.frames(Error)
    assert len(errors) == 1 and errors[0].code == "protocol_error"
    second = await hub.next_session()
    assert second.attempt.at - closed.at == pytest.approx(0.5 * 0.5)  # backoff, not at once


async def test_second_welcome_is_a_protocol_violation(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    await s.send(Welcome(session_id="again", heartbeat_s=1, ping_interval_s=1, ping_timeout_s=1))
    closed = await s.wait_closed()
    assert closed.code == 1008 and "welcome" in closed.reason


async def test_no_welcome_within_ping_timeout(autojump_clock, nursery, hub, wall):
    hub.auto_welcome = False
    daemon = make_daemon(hub, wall)
    nursery.start_soon(daemon.run)
    s = await hub.next_session()
    hello_at = trio.current_time()
    closed = await s.wait_closed()
    assert (closed.code, closed.reason) == (4002, "no welcome within 10 s")
    assert closed.at - hello_at == pytest.approx(Timings().ping_timeout_s)
    assert daemon.statistics().sessions_started == 0


async def test_hub_error_frames_are_logged_not_fatal(autojump_clock, start_daemon, caplog):
    daemon, s = await start_daemon()
    with caplog.at_level(logging.WARNING, logger="deskbridge"):
        await s.send(Error(code="draining", message="hub shutting down soon"))
        assert (await s.call("echo", {})).ok
    assert "hub says draining: hub shutting down soon" in caplog.text


async def test_stop_closes_with_1001(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    await s.send_job("sleep", {"seconds": 60})
    await settle()
    daemon.stop()
    closed = await s.wait_closed()
    assert (closed.by, closed.code, closed.reason) == ("sidecar", 1001, "sidecar stopping")
    await settle()
    assert daemon.statistics().running is None
