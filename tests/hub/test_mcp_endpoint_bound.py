"""How many per-user MCP endpoints one process keeps (``_mcp_mount.MAX_ENDPOINTS``).

Before: an endpoint (its own SDK server and session manager, ~22 KB measured) was made
for every user id an API-key holder touched and stopped only after 10 minutes unused,
with no count bound: 5,000 ghost ids took a real ``serve --workers 1`` from 103 to
210 MB, and 100 new ids a second would hold ~1.3 GB. Now the least recently used
endpoint nobody uses is stopped to make room; when every endpoint is in use, a new
user's request is 429 naming the bound."""

from __future__ import annotations

import gc
import json
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_hub import Bridge, _mcp, _mcp_mount
from deskbridge_hub._mcp_mount import McpEndpoints, mount_mcp
from deskbridge_hub._memory import MemorySubstrate

from tests.mcp_wire import initialize_2025

assert _mcp  # imported now: its import in a thread would let the autojump clock run on

#: The bound in these tests (the real one is thousands: each endpoint costs SDK objects).
CAP = 8


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(_mcp_mount, "MAX_ENDPOINTS", CAP, raising=False)
    return CAP


def _endpoints(nursery: trio.Nursery) -> McpEndpoints:
    bridge = Bridge(MemorySubstrate())
    return McpEndpoints(
        get_nursery=lambda: nursery, get_bridge=lambda: bridge, is_draining=lambda: False
    )


async def _touch(endpoints: McpEndpoints, user_id: str) -> Any:
    """One request for ``user_id`` that ends at once (a ghost id's); returns its endpoint."""
    async with endpoints.using(user_id) as endpoint:
        assert endpoint is not None
        return endpoint


async def test_a_flood_of_user_ids_keeps_at_most_the_bound(autojump_clock, nursery, small_cap):
    """Before: every id kept its endpoint (and its SDK task) for 10 minutes: 40 ids, 40
    endpoints. Now the least recently used idle one is stopped for each new id."""
    endpoints = _endpoints(nursery)
    tasks_before = len(nursery.child_tasks)
    for i in range(5 * small_cap):
        await _touch(endpoints, f"ghost-{i}")
        assert len(endpoints._endpoints) <= small_cap, i
    await trio.testing.wait_all_tasks_blocked()
    assert sorted(endpoints._endpoints) == sorted(f"ghost-{i}" for i in range(4 * small_cap, 40))
    # the stopped ones' tasks ended (one task per endpoint, and the reaper)
    assert len(nursery.child_tasks) - tasks_before <= small_cap + 1


async def test_the_least_recently_used_endpoint_is_the_one_stopped(
    autojump_clock, nursery, small_cap
):
    endpoints = _endpoints(nursery)
    for i in range(small_cap):
        await _touch(endpoints, f"u{i}")
        await trio.sleep(1)
    await _touch(endpoints, "u0")  # used again: now the most recent
    await _touch(endpoints, "new")
    assert "u0" in endpoints._endpoints and "u1" not in endpoints._endpoints
    assert "new" in endpoints._endpoints


async def test_an_evicted_users_next_request_starts_a_new_endpoint(
    autojump_clock, nursery, small_cap
):
    endpoints = _endpoints(nursery)
    first = await _touch(endpoints, "evicted")
    for i in range(small_cap):
        await _touch(endpoints, f"ghost-{i}")
    assert "evicted" not in endpoints._endpoints
    await trio.testing.wait_all_tasks_blocked()  # the stopped one's task ended
    async with endpoints.using("evicted") as second:
        assert second is not None and second is not first
        assert second.manager._task_group is not None  # running: it can serve
        await trio.testing.wait_all_tasks_blocked()
        # the stopped one's end did not take its successor's place
        assert endpoints._endpoints["evicted"] is second


async def test_a_stopped_endpoint_is_freed_without_the_cycle_collector(
    autojump_clock, nursery, small_cap
):
    """An endpoint is a web of reference cycles (SDK handlers bound to their server and
    to the endpoint): only the cycle collector freed a stopped one, and a serving hub
    freezes what survives each full collection (``_gcwatch``), so a stopped endpoint that
    had been frozen stayed until the hourly unfreeze: past the bound a real process still
    grew ~5 KB per new user id. Its cycles are cut when it stops."""
    endpoints = _endpoints(nursery)
    first = weakref.ref(await _touch(endpoints, "first"))
    gc.disable()  # as for an object frozen by gc.freeze()
    try:
        for i in range(small_cap):
            await _touch(endpoints, f"ghost-{i}")
        await trio.testing.wait_all_tasks_blocked()  # its task ended
        assert first() is None
    finally:
        gc.enable()


async def test_an_endpoint_with_an_open_request_is_never_evicted(
    autojump_clock, nursery, small_cap
):
    """A listening stream (``subscriptions/listen``, a standalone GET) is an open request
    for as long as it listens: a flood of ids must not cut it."""
    endpoints = _endpoints(nursery)
    async with endpoints.using("listening") as endpoint:
        assert endpoint is not None
        for i in range(5 * small_cap):
            await _touch(endpoints, f"ghost-{i}")
        assert endpoints._endpoints["listening"] is endpoint
        assert not endpoint.manager._task_group.cancel_scope.cancel_called


# -- through the mounted ASGI app: a real 2025 session, and the 429 ---------------------

_INITIALIZE = initialize_2025("test")


async def _post(
    app: Any,
    user_id: str,
    body: dict[str, Any] | None,
    session: str | None = None,
    method: str = "POST",
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request to ``/v1/users/{user_id}/mcp`` through ``app``: status, headers, body."""
    raw = b"" if body is None else json.dumps(body).encode()
    pending = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await trio.sleep_forever()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
    ]
    if session is not None:
        headers += [(b"mcp-session-id", session.encode()), (b"mcp-protocol-version", b"2025-06-18")]
    scope = {
        "type": "http",
        "method": method,
        "path": f"/v1/users/{user_id}/mcp",
        "headers": headers,
        "query_string": b"",
        "scheme": "http",
        "server": ("hub", 80),
        "client": ("agent", 1),
        "root_path": "",
        "http_version": "1.1",
    }
    with trio.fail_after(30):
        await app(scope, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _app(nursery: trio.Nursery) -> tuple[Any, McpEndpoints]:
    async def quart(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError(scope)

    holder: dict[str, Any] = {"bridge": Bridge(MemorySubstrate())}
    bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}
    app = mount_mcp(quart, SimpleNamespace(nursery=nursery, config=bounds), holder, ())
    return app, holder["mcp"]


async def test_a_busy_users_session_survives_a_flood_of_ghost_ids(
    autojump_clock, nursery, small_cap
):
    app, endpoints = _app(nursery)
    status, headers, _ = await _post(app, "busy", _INITIALIZE)
    assert status == 200
    session = headers[b"mcp-session-id"].decode()
    busy = endpoints._endpoints["busy"]
    for i in range(5 * small_cap):
        await _touch(endpoints, f"ghost-{i}")
    assert endpoints._endpoints["busy"] is busy and busy.sessions_open() == 1
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    status, _, body = await _post(app, "busy", ping, session=session)
    assert status == 200, body  # the session is still there (an evicted one is 404)


async def test_a_new_user_is_refused_429_while_every_endpoint_is_in_use(
    autojump_clock, nursery, small_cap
):
    app, endpoints = _app(nursery)
    sessions = {}
    for i in range(small_cap):
        status, headers, _ = await _post(app, f"busy-{i}", _INITIALIZE)
        assert status == 200
        sessions[f"busy-{i}"] = headers[b"mcp-session-id"].decode()
    listed = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
    status, headers, body = await _post(app, "newcomer", listed)
    assert status == 429, body
    assert headers[b"retry-after"] == b"5"
    answer = json.loads(body)
    assert answer["jsonrpc"] == "2.0" and answer["id"] == 9
    assert answer["error"]["data"] == {"code": "too_many_requests", "retry_after_s": 5}
    assert str(small_cap) in answer["error"]["message"]
    assert "MAX_ENDPOINTS" in answer["error"]["message"]
    assert "newcomer" not in endpoints._endpoints
    assert sorted(endpoints._endpoints) == sorted(sessions)  # nobody's session was cut
    # one user ends its session: the newcomer is served
    status, _, body = await _post(app, "busy-0", None, session=sessions["busy-0"], method="DELETE")
    assert status == 200, body
    status, _, body = await _post(app, "newcomer", _INITIALIZE)
    assert status == 200, body
    assert "busy-0" not in endpoints._endpoints
