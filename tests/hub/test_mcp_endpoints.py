"""The per-user MCP endpoints of one process (``_mcp_mount.McpEndpoints``): a user id
that came and went costs nothing for good (a hostile loop over 500 user ids left 500
endpoints polling Redis every 2 s, ~250 commands a second, forever)."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_hub import Bridge
from deskbridge_hub._mcp_mount import EVICT_IDLE_S, McpEndpoints
from deskbridge_hub._memory import MemorySubstrate


def _endpoints(nursery: trio.Nursery, bridge: Bridge) -> McpEndpoints:
    return McpEndpoints(
        get_nursery=lambda: nursery, get_bridge=lambda: bridge, is_draining=lambda: False
    )


async def test_an_unused_endpoint_is_stopped_and_starts_again(autojump_clock, nursery):
    endpoints = _endpoints(nursery, Bridge(MemorySubstrate()))
    async with endpoints.using("ghost") as first:
        assert first is not None
    now = trio.current_time()
    assert endpoints.reap(now + EVICT_IDLE_S - 1) == []
    assert endpoints.reap(now + EVICT_IDLE_S) == ["ghost"]
    await trio.testing.wait_all_tasks_blocked()  # its task ended
    async with endpoints.using("ghost") as second:
        assert second is not None and second is not first
        await trio.testing.wait_all_tasks_blocked()
        # the stopped one's end did not take its successor's place
        assert endpoints.reap(trio.current_time() + 10 * EVICT_IDLE_S) == []  # in use
    assert endpoints.reap(trio.current_time() + EVICT_IDLE_S) == ["ghost"]


async def test_an_endpoint_in_use_is_never_stopped(autojump_clock, nursery):
    endpoints = _endpoints(nursery, Bridge(MemorySubstrate()))
    async with endpoints.using("busy") as endpoint:
        assert endpoint is not None
        await trio.sleep(3 * EVICT_IDLE_S)  # a listening stream held open for 30 minutes
        assert endpoints.reap(trio.current_time()) == []
    await trio.sleep(EVICT_IDLE_S + 60)  # the reaper task, not a direct call
    assert "busy" not in endpoints._endpoints


async def test_the_catalogue_is_read_only_while_someone_listens(autojump_clock, nursery):
    bridge = Bridge(MemorySubstrate())
    reads: list[str] = []
    real_tools = bridge.tools

    async def counting_tools(user_id: str):  # type: ignore[no-untyped-def]
        reads.append(user_id)
        return await real_tools(user_id)

    bridge.tools = counting_tools  # type: ignore[method-assign]
    endpoints = _endpoints(nursery, bridge)
    async with endpoints.using("quiet") as endpoint:
        assert endpoint is not None
        await trio.sleep(10 * endpoint.poll_s)
        assert len(reads) >= 9  # a request is open: a listener may be there
        del reads[:]
    await trio.sleep(10 * endpoint.poll_s)
    assert reads == []


async def test_an_endpoint_nobody_listens_to_does_not_wake(autojump_clock, nursery):
    """An idle endpoint (no request open, no session) read nothing but still woke every
    ``poll_s`` until it was reaped: 4,096 of them, the bound per process, took 10-15 % of
    a core. Its watcher now waits for a request; one that comes is still served within
    ``poll_s``."""
    bridge = Bridge(MemorySubstrate())
    reads: list[float] = []
    real_tools = bridge.tools

    async def counting_tools(user_id: str):  # type: ignore[no-untyped-def]
        reads.append(trio.current_time())
        return await real_tools(user_id)

    bridge.tools = counting_tools  # type: ignore[method-assign]
    endpoints = _endpoints(nursery, bridge)
    async with endpoints.using("quiet") as endpoint:
        assert endpoint is not None

    class WatcherSteps(trio.abc.Instrument):
        count = 0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if "_watch_catalogue" in task.name:
                self.count += 1

    steps = WatcherSteps()
    trio.lowlevel.add_instrument(steps)
    try:
        await trio.sleep(100 * endpoint.poll_s)
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.count <= 5, steps.count  # the rounds around the request, then asleep (was 100)
    assert reads == []
    async with endpoints.using("quiet") as again:
        assert again is endpoint
        came = trio.current_time()
        await trio.sleep(1.5 * endpoint.poll_s)
        assert reads and reads[0] - came <= endpoint.poll_s


async def test_a_tools_list_does_not_swallow_the_change_other_sessions_must_hear(
    autojump_clock, nursery
):
    """Session A's ``tools/list`` between a catalogue change and the watcher's next poll
    recorded the new catalogue as already announced: the watcher then saw no change, and
    session B (and every listen stream) never heard ``list_changed``: B kept calling from a
    stale list. The list a session reads is not an announcement to the others."""
    bridge = Bridge(MemorySubstrate())
    catalogue = [{"name": "echo", "args_schema": {"type": "object"}}]

    async def tools(user_id: str):  # type: ignore[no-untyped-def]
        return list(catalogue)

    bridge.tools = tools  # type: ignore[method-assign]
    endpoints = _endpoints(nursery, bridge)
    announced: list[float] = []
    async with endpoints.using("alice") as endpoint:
        assert endpoint is not None

        class SessionB:  # a handshake-era session's connection, as the SDK has it
            async def send_tool_list_changed(self) -> None:
                announced.append(trio.current_time())

        b = SessionB()
        endpoint._connections.add(b)  # type: ignore[arg-type]
        await endpoint._list_tools(None, None)  # session B lists: echo
        await trio.sleep(3 * endpoint.poll_s)
        assert announced == []
        catalogue.append({"name": "record", "args_schema": {"type": "object"}})
        listed = await endpoint._list_tools(None, None)  # session A, before the next poll
        assert [t.name for t in listed.tools] == ["echo", "record"]
        await trio.sleep(2 * endpoint.poll_s)
        assert len(announced) == 1  # B hears it


async def test_a_session_that_does_not_take_a_notification_holds_up_no_one(autojump_clock, nursery):
    """``list_changed`` went to the user's sessions one after another, each awaited: a
    session whose client stopped reading its stream (a suspended laptop's agent: the
    SDK's buffers fill, its send blocks) stopped the watcher for good, so no session of
    that user heard of any later change. Each send is now bounded and a session that
    does not take one in time is forgotten."""
    bridge = Bridge(MemorySubstrate())
    catalogue = [{"name": "echo", "args_schema": {"type": "object"}}]

    async def tools(user_id: str):  # type: ignore[no-untyped-def]
        return list(catalogue)

    bridge.tools = tools  # type: ignore[method-assign]
    endpoints = _endpoints(nursery, bridge)
    heard: list[float] = []

    class Stuck:
        async def send_tool_list_changed(self) -> None:
            await trio.sleep_forever()

    class Reading:
        async def send_tool_list_changed(self) -> None:
            heard.append(trio.current_time())

    stuck, reading = Stuck(), Reading()
    async with endpoints.using("alice") as endpoint:
        assert endpoint is not None
        await endpoint._list_tools(None, None)
        endpoint._connections.add(stuck)  # type: ignore[arg-type]
        endpoint._connections.add(reading)  # type: ignore[arg-type]
        for n in range(1, 3):
            catalogue.append({"name": f"t{n}", "args_schema": {"type": "object"}})
            await trio.sleep(30 * endpoint.poll_s)
            assert len(heard) == n, n
        assert set(endpoint._connections) == {reading}


async def test_a_refusal_before_serving_is_a_json_rpc_error_with_the_request_id():
    """A 503 of the MCP endpoint (the hub not serving yet) is a JSON-RPC error response
    naming the request's id, which the SDK's client reports with its reason (it read any
    other body as ``-32603`` "Server returned an error response")."""
    import json
    from types import SimpleNamespace

    from deskbridge_hub._mcp_mount import mount_mcp

    async def quart(scope, receive, send):  # never reached
        raise AssertionError(scope)

    bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}
    app = mount_mcp(quart, SimpleNamespace(nursery=None, config=bounds), {}, ())
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).encode()
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/v1/users/alice/mcp", "headers": headers}
    with trio.fail_after(5):
        await app(scope, receive, send)
    assert sent[0]["status"] == 503
    answer = json.loads(sent[1]["body"])
    assert answer["jsonrpc"] == "2.0" and answer["id"] == 7, answer
    assert answer["error"]["data"] == {"code": "unavailable", "retry_after_s": 5}
    assert answer["error"]["message"] == "unavailable: the hub is not serving yet"


async def test_a_request_during_an_endpoints_start_waits_for_it_to_run(
    autojump_clock, nursery, monkeypatch
):
    """Before: the endpoint was registered before its SDK manager ran, so a request that
    arrived meanwhile took it from the lock-free lookup and the SDK answered 500 ("Task
    group is not initialized"): seen with concurrent first requests for new user ids."""
    from deskbridge_hub import _mcp

    release = trio.Event()
    real_run = _mcp.UserEndpoint.run

    async def slow_run(self, *, task_status=trio.TASK_STATUS_IGNORED):  # type: ignore[no-untyped-def]
        await release.wait()  # the SDK's manager takes a while to start
        await real_run(self, task_status=task_status)

    monkeypatch.setattr(_mcp.UserEndpoint, "run", slow_run)
    endpoints = _endpoints(nursery, Bridge(MemorySubstrate()))
    got: list[object] = []
    both = trio.Event()

    async def request() -> None:
        async with endpoints.using("new") as endpoint:
            assert endpoint is not None
            assert endpoint.manager._task_group is not None  # running: it can serve
            got.append(endpoint)
            if len(got) == 2:
                both.set()

    nursery.start_soon(request)
    await trio.testing.wait_all_tasks_blocked()
    assert "new" not in endpoints._endpoints  # starting, not yet there to be taken
    nursery.start_soon(request)
    await trio.testing.wait_all_tasks_blocked()
    release.set()
    with trio.fail_after(5):
        await both.wait()
    assert got[0] is got[1]


async def test_a_served_post_body_is_parsed_no_more_than_its_checks_need(monkeypatch):
    """Every MCP POST is parsed by the mount's checks (a JSON-RPC message? a tool call,
    which the drain tracks?) and then by the SDK. The request's id is needed only for the
    hub's own 503 (not serving yet): it was parsed out of every body, a third full parse
    of up to 4 MiB on the path of every served call."""
    import json
    from types import SimpleNamespace

    from deskbridge_hub import _mcp_mount
    from deskbridge_hub._shutdown import Draining

    parses = []

    def loads(raw, *args, **kwargs):  # type: ignore[no-untyped-def]
        parses.append(raw)
        return json.loads(raw, *args, **kwargs)

    served = []

    async def serve(endpoints, user_id, scope, receive, send, *rest):  # type: ignore[no-untyped-def]
        served.append(user_id)

    strict = _mcp_mount.strict_json

    def strict_loads(raw, *args, **kwargs):  # type: ignore[no-untyped-def]
        parses.append(raw)
        return strict.loads(raw, *args, **kwargs)

    monkeypatch.setattr(_mcp_mount, "json", SimpleNamespace(loads=loads, dumps=json.dumps))
    counted = SimpleNamespace(loads=strict_loads, DuplicateKey=strict.DuplicateKey)
    monkeypatch.setattr(_mcp_mount, "strict_json", counted)
    monkeypatch.setattr(_mcp_mount, "_serve", serve)

    async def quart(scope, receive, send):  # never reached
        raise AssertionError(scope)

    holder = {"state": SimpleNamespace(drain=Draining())}
    bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}
    app = _mcp_mount.mount_mcp(quart, SimpleNamespace(nursery=None, config=bounds), holder, ())
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo"}}
    body = json.dumps(message).encode()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):  # never called: the stub serves nothing
        raise AssertionError(message)

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/v1/users/alice/mcp", "headers": headers}
    with trio.fail_after(5):
        await app(scope, receive, send)
    assert served == ["alice"]
    assert len(parses) <= 2, parses
