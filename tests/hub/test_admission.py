"""Admission control and deadlines under overload (``_admission``, ``Bridge.dispatch``).

Was (``bench/overload.py``, 1,000 HTTP callers on one process): every call was taken,
nothing ever answered 503 with ``Retry-After``, and callers asking ``timeout_s`` 10 were
answered after up to 30 s. Now a call over the process's bound (calls in flight, or a
loop that lags) is refused at once with ``Overloaded`` (HTTP 503 ``overloaded``,
``Retry-After``; MCP ``data.code`` ``overloaded``) and nothing is enqueued, and an HTTP
call's ``timeout_s`` counts from when its handler began, not from when its body had
arrived. MemorySubstrate, MockClock (autojump).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_hub import Bridge, Overloaded
from deskbridge_hub._admission import LAG_PROBE_S, OVERLOAD_RETRY_AFTER_S, CallAdmission
from deskbridge_hub._memory import MemorySubstrate

from tests.hub.test_session import wall


@pytest.fixture
def substrate() -> MemorySubstrate:
    return MemorySubstrate(clock=wall)


async def test_calls_over_the_bound_are_refused_at_once_and_enqueue_nothing(
    autojump_clock, substrate
):
    """Two calls in flight (a desktop that looks online and reads nothing), room for two:
    a third is refused at once, nothing of it written (no entry, no state, no id claim,
    no idempotency record); once a call ends, a call is taken again."""
    await substrate.set_presence("u1", "ghost", 3600)
    admission = CallAdmission(2, None, trio.current_time)
    bridge = Bridge(substrate, wall_clock=wall, admission=admission)
    answers: list[str] = []

    async def call(job_id: str, timeout_s: float) -> None:
        outcome = await bridge.dispatch(
            "u1", "echo", {}, job_id=job_id, idempotency_key=job_id, timeout_s=timeout_s
        )
        answers.append(outcome.status)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "j1", 5)
        nursery.start_soon(call, "j2", 60)
        await trio.testing.wait_all_tasks_blocked()
        assert admission.in_flight == 2
        keys_before = set(substrate.keys_of("u1"))
        started = trio.current_time()
        with pytest.raises(Overloaded) as refused:
            await bridge.dispatch("u1", "echo", {}, job_id="j3", idempotency_key="j3")
        assert trio.current_time() == started  # at once
        assert (refused.value.reason, refused.value.user_id) == ("calls", "u1")
        assert refused.value.retry_after_s == OVERLOAD_RETRY_AFTER_S
        assert "DESKBRIDGE_MAX_CALLS=2" in str(refused.value)
        assert (await substrate.queue_info("u1")).length == 2
        assert await substrate.get_job_state("u1", "j3") is None
        assert await substrate.job_owner("j3") is None
        assert set(substrate.keys_of("u1")) == keys_before
        assert admission.refused == {"calls": 1, "lag": 0}
        with pytest.raises(Overloaded):  # Bridge.call (and status) pass the same gate
            await bridge.call("u1", "echo", {})
        await trio.sleep(6)  # j1 answered timeout: a slot is free again
        assert answers == ["timeout"] and admission.in_flight == 1
        nursery.start_soon(call, "j4", 1)
        await trio.testing.wait_all_tasks_blocked()
        assert admission.in_flight == 2
        nursery.cancel_scope.cancel()
    assert admission.in_flight == 0  # cancelled calls give their slot back


async def test_the_default_bound_takes_calls_that_only_wait_on_slow_tools(
    autojump_clock, substrate
):
    """Was (default 500): a healthy, idle process with 600 calls each waiting on a 30 s
    tool of another user refused the 501st with 503 ``overloaded``
    (``bench/waiting_calls.py``: 500 completed, 100 refused, 1.1 s of hub CPU). The
    default bound is what a waiting call costs (memory, a descriptor), not CPU: the lag
    gate guards the CPU."""
    from deskbridge_hub import HubConfig

    config = HubConfig.from_env({})
    admission = CallAdmission(config.max_calls, config.shed_lag_s, trio.current_time)
    bridge = Bridge(substrate, wall_clock=wall, admission=admission)
    users = [f"u{i}" for i in range(2000)]
    for user in users:
        await substrate.set_presence(user, "ghost", 3600)
    async with trio.open_nursery() as nursery:
        for user in users:  # each desktop's tool runs 30 s (it never answers here)
            nursery.start_soon(functools.partial(bridge.dispatch, user, "echo", {}, timeout_s=60))
        await trio.testing.wait_all_tasks_blocked()
        assert admission.in_flight == 2000 and admission.refused == {"calls": 0, "lag": 0}
        nursery.cancel_scope.cancel()


async def test_a_bridge_without_admission_takes_every_call(autojump_clock, substrate):
    """A Bridge an application makes for itself (no ``admission``) is not bounded."""
    await substrate.set_presence("u1", "ghost", 3600)
    bridge = Bridge(substrate, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(lambda i=i: bridge.dispatch("u1", "echo", {}, job_id=f"j{i}"))
        await trio.testing.wait_all_tasks_blocked()
        assert (await substrate.queue_info("u1")).length == 50
        nursery.cancel_scope.cancel()


async def _hog(clock: trio.testing.MockClock, lag_s: float, passes: int) -> None:
    """A loop whose every pass takes ``lag_s``: the clock moves on that much before the
    probe is woken."""
    for _ in range(passes):
        await trio.sleep(LAG_PROBE_S / 2)
        clock.jump(lag_s)


async def test_a_lasting_loop_lag_sheds_new_calls_and_a_single_stall_does_not(autojump_clock):
    """The lag gate reads the probe's smoothed lag: one stall (the clock jumps 0.8 s past
    the probe's wake-up) does not shed; a loop that keeps waking tasks 0.5 s late does,
    and once it is prompt again calls are taken."""
    admission = CallAdmission(None, 0.25, trio.current_time)

    def admit() -> str:
        try:
            with admission.admitted("u1"):
                return "admitted"
        except Overloaded as exc:
            assert exc.reason == "lag" and "DESKBRIDGE_SHED_LAG_S=0.25" in str(exc)
            return "refused"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(admission.probe, trio.sleep)
        await trio.sleep(1)
        assert admission.lag_s() == 0.0 and admit() == "admitted"
        await _hog(autojump_clock, 0.8, 1)  # one stall
        await trio.sleep(LAG_PROBE_S)
        assert 0 < admission.lag_s() < 0.25 and admit() == "admitted"
        await _hog(autojump_clock, 0.5, 3)  # a lasting lag
        assert admission.lag_s() > 0.25 and admit() == "refused"
        assert admission.refused == {"calls": 0, "lag": 1}
        await trio.sleep(3)  # prompt again
        assert admission.lag_s() < 0.01 and admit() == "admitted"
        nursery.cancel_scope.cancel()


async def test_one_long_stall_does_not_shed_the_calls_after_it(autojump_clock):
    """Was: one stall of the whole process (SIGSTOP, a paused VM, a long full garbage
    collection) longer than 0.83 s moved the smoothed lag past the bound by itself (a 9 s
    stop: 2.7 s), so the process, prompt again, refused every call for the next 0.7 s
    (tests/chaos/test_hub_stalled.py's echo after SIGCONT could meet it). A sample counts
    for at most twice the bound: one stall of any length does not shed; a lag that lasts
    still sheds within two samples, and sheds no longer than two once it is over."""
    admission = CallAdmission(None, 0.25, trio.current_time)

    def admit() -> bool:
        try:
            with admission.admitted("u1"):
                return True
        except Overloaded:
            return False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(admission.probe, trio.sleep)
        await trio.sleep(1)
        for stall_s in (1.0, 9.0, 40.0):
            await _hog(autojump_clock, stall_s, 1)
            await trio.sleep(LAG_PROBE_S)  # the probe has noted it
            assert admit(), (stall_s, admission.lag_s())
            await trio.sleep(3)
        await _hog(autojump_clock, 5.0, 3)  # a lasting lag, however long
        assert not admit()
        await trio.sleep(2 * LAG_PROBE_S + 0.01)  # prompt again: two samples
        assert admit(), admission.lag_s()
        nursery.cancel_scope.cancel()


async def test_a_call_s_timeout_counts_from_when_it_started(autojump_clock, substrate):
    """``started_at``: a caller whose request waited 3 s before the dispatch (its body
    arriving) and asked 5 s is answered ``timeout`` 2 s later, 5 s after it started."""
    await substrate.set_presence("u1", "ghost", 3600)
    bridge = Bridge(substrate, wall_clock=wall)
    began = trio.current_time()
    await trio.sleep(3)
    outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5, started_at=began)
    assert outcome.status == "timeout"
    assert trio.current_time() - began == pytest.approx(5, abs=0.3)
    assert outcome.elapsed_s == pytest.approx(5, abs=0.3)


# -- over HTTP and MCP ---------------------------------------------------------------------


@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi-route", "quart-route"])
async def test_over_http_a_refused_call_is_503_overloaded_with_retry_after(
    autojump_clock, monkeypatch, asgi_route
):
    """Room for one call in the process: the second is answered at once, 503
    ``overloaded`` with ``Retry-After``, its reason and the variable named, the caller's
    job id echoed, nothing written for it; counted as ``overloaded``. The status route
    shares the bound."""
    from tests.hub.test_calls_counted import _count
    from tests.hub.test_jobs_asgi import JSON, ONLINE, PATH, hub

    async with hub(monkeypatch, asgi_route=asgi_route, max_calls=1, shed_lag_s=0.0) as h:
        await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)
        before = _count("overloaded")
        async with trio.open_nursery() as nursery:  # one call holds the only slot 5 s
            waits = b'{"name": "echo", "timeout_s": 5}'
            nursery.start_soon(functools.partial(h.client.post, PATH, data=waits, headers=JSON))
            await trio.testing.wait_all_tasks_blocked()
            body = b'{"name": "echo", "job_id": "mine-2", "idempotency_key": "key-2"}'
            writes = list(h.substrate.calls)
            started = trio.current_time()
            r = await h.client.post(PATH, data=body, headers=JSON)
            status = await h.client.post(f"/v1/users/{ONLINE}/status", headers=JSON)
            assert trio.current_time() == started  # at once, not after a wait
            assert h.substrate.calls == writes  # nothing looked at, nothing written
        assert r.status_code == 503, await r.get_data()
        assert r.headers["Retry-After"] == str(OVERLOAD_RETRY_AFTER_S)
        answer = await r.get_json()
        assert answer["job_id"] == "mine-2"
        error = answer["error"]
        assert (error["code"], error["reason"]) == ("overloaded", "calls")
        assert error["retry_after_s"] == OVERLOAD_RETRY_AFTER_S
        assert "DESKBRIDGE_MAX_CALLS=1" in error["message"]
        assert status.status_code == 503 and status.headers["Retry-After"] == "2"
        assert (await status.get_json())["error"]["code"] == "overloaded"
        assert _count("overloaded") - before == 2.0
        assert h.substrate.entries(ONLINE) == 1
        assert await h.substrate.inner.job_owner("mine-2") is None
        retry = b'{"name": "echo", "job_id": "mine-2", "idempotency_key": "key-2", "timeout_s": 1}'
        r = await h.client.post(PATH, data=retry, headers=JSON)  # room again: taken
        assert r.status_code == 504 and (await r.get_json())["status"] == "timeout"


async def test_over_http_timeout_s_counts_from_the_handler_s_start(autojump_clock, monkeypatch):
    """A request whose body takes 3 s to arrive, asking ``timeout_s`` 5, is answered by
    5 s (plus the answer grace) after its handler began, not 5 s after its body came."""
    from deskbridge_hub import HubConfig
    from deskbridge_hub._jobs_asgi import mount_jobs
    from deskbridge_hub._retry import ANSWER_GRACE_S

    from tests.hub.test_jobs_asgi import API_KEYS, AUTH, ONLINE, PATH, hub

    async with hub(monkeypatch) as h:
        await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)
        jobs = mount_jobs(None, h.app, h.holder, HubConfig(api_keys=API_KEYS))
        sent: list[dict[str, Any]] = []
        body = json.dumps({"name": "echo", "timeout_s": 5}).encode()
        arrived = False

        async def receive() -> dict[str, Any]:
            nonlocal arrived
            if arrived:
                await trio.sleep_forever()
            await trio.sleep(3)  # the body trickles in
            arrived = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        headers = [(k.lower().encode(), v.encode()) for k, v in AUTH.items()]
        headers.append((b"content-type", b"application/json"))
        scope = {"type": "http", "method": "POST", "path": PATH, "headers": headers}
        began = trio.current_time()
        await jobs(scope, receive, send)
        took_s = trio.current_time() - began
        assert sent[0]["status"] == 504
        assert json.loads(sent[1]["body"])["status"] == "timeout"
        assert 5 <= took_s <= 5 + ANSWER_GRACE_S + 0.01, took_s


async def test_over_mcp_an_overloaded_refusal_is_a_json_rpc_error_with_its_code():
    """As ``queue_full``: a JSON-RPC error (``-32603``) whose ``data`` holds what HTTP's
    error body holds."""
    from tests.hub.test_queue_full import mcp_call_error

    admission = CallAdmission(0, None, trio.current_time)  # no room at all
    error = await mcp_call_error(Bridge(MemorySubstrate(), admission=admission))
    assert error.message.startswith("overloaded: ") and "DESKBRIDGE_MAX_CALLS" in error.message
    assert error.data == {"code": "overloaded", "reason": "calls", "retry_after_s": 2}


def test_the_bounds_come_from_the_environment():
    from deskbridge_hub import HubConfig

    default = HubConfig.from_env({})
    assert (default.max_calls, default.shed_lag_s) == (5000, 0.25)
    config = HubConfig.from_env({"DESKBRIDGE_MAX_CALLS": "64", "DESKBRIDGE_SHED_LAG_S": "0"})
    assert (config.max_calls, config.shed_lag_s) == (64, 0.0)
    for bad in ({"DESKBRIDGE_MAX_CALLS": "0"}, {"DESKBRIDGE_SHED_LAG_S": "-1"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HubConfig.from_env(bad)


async def test_an_mcp_tools_call_s_timeout_counts_from_when_the_hub_began_its_request(
    autojump_clock,
):
    """As an HTTP call's: the MCP mount stamps when it began the POST (before reading
    its body) into the request's scope, and ``tools/call`` dispatches with it as
    ``started_at``. Was: MCP passed none, so the body read and the SDK's queueing fell
    outside the caller's ``timeout_s``."""
    import types as pytypes

    import mcp_types as types
    from deskbridge_hub._mcp import UserEndpoint
    from deskbridge_hub._mcp_mount import STARTED_AT

    seen: list[float | None] = []
    bridge = Bridge(MemorySubstrate())

    async def dispatch(*args, started_at=None, **kwargs):
        seen.append(started_at)
        raise RuntimeError("stop here")

    bridge.dispatch = dispatch  # type: ignore[method-assign]
    endpoint = UserEndpoint("u1", bridge)
    began = trio.current_time() - 3.0
    request = pytypes.SimpleNamespace(scope={STARTED_AT: began})
    ctx = pytypes.SimpleNamespace(params={"_meta": {}}, session=None, request=request)
    with pytest.raises(RuntimeError, match="stop here"):
        await endpoint._call_tool(ctx, types.CallToolRequestParams(name="echo", arguments={}))
    assert seen == [began]
    no_http = pytypes.SimpleNamespace(params={"_meta": {}}, session=None)
    with pytest.raises(RuntimeError, match="stop here"):
        await endpoint._call_tool(no_http, types.CallToolRequestParams(name="echo", arguments={}))
    assert seen == [began, None]


async def test_the_mcp_mount_stamps_when_it_began_a_post_before_reading_its_body(autojump_clock):
    from deskbridge_hub._mcp_mount import STARTED_AT, mount_mcp

    scopes: list[dict] = []

    async def inner(scope, receive, send):  # what the mount passes every other request
        scopes.append(scope)

    import types as pytypes

    bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}
    app = mount_mcp(inner, pytypes.SimpleNamespace(nursery=None, config=bounds), {}, ())
    scope = {"type": "http", "method": "POST", "path": "/v1/users/u1/mcp", "headers": []}
    before = trio.current_time()

    async def receive():
        await trio.sleep(2)  # a slow body
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert scope.get(STARTED_AT) == before  # stamped before the 2 s body
