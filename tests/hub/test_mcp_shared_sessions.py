"""2025-era MCP sessions shared through the store (``_mcp_sessions``, ``_mcp_store``): two
mounted MCP apps on one ``MemorySubstrate`` stand for two hub processes on one Redis.

Before: a session lived in the SDK's table of the process that created it; the other
process answered every request naming it ``404 Session not found``. (The real-process
version, behind HAProxy round-robin: tests/integration/test_mcp_replicas.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from deskbridge_hub import Bridge, _mcp
from deskbridge_hub._memory import MemorySubstrate

from tests.hub.test_mcp_endpoint_bound import _INITIALIZE, _post

assert _mcp  # imported now: its import in a thread would let the autojump clock run on

_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def _pair(nursery: trio.Nursery) -> tuple[Any, Any, MemorySubstrate]:
    """Two MCP apps ("processes") on one store."""
    from deskbridge_hub._mcp_mount import mount_mcp

    store = MemorySubstrate()

    async def quart(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError(scope)

    apps = []
    for _ in range(2):
        holder: dict[str, Any] = {"bridge": Bridge(store)}
        bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}  # the mount reads the body
        app = SimpleNamespace(nursery=nursery, config=bounds)
        apps.append(mount_mcp(quart, app, holder, ()))
    return apps[0], apps[1], store


async def _open(app: Any, user: str) -> str:
    status, headers, body = await _post(app, user, _INITIALIZE)
    assert status == 200, body
    session = headers[b"mcp-session-id"].decode()
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await _post(app, user, done, session=session))[0] == 202
    return session


def _answer(body: bytes) -> dict[str, Any]:
    for line in body.decode().splitlines():
        if line.startswith("data:") and line[5:].strip():
            return dict(json.loads(line[5:]))
    return dict(json.loads(body))


async def test_a_session_opened_on_one_process_is_served_by_the_other(autojump_clock, nursery):
    a, b, _ = _pair(nursery)
    session = await _open(a, "alice")
    for app in (b, a, b):
        status, _, body = await _post(app, "alice", _LIST, session=session)
        assert status == 200, body
        assert _answer(body)["result"]["tools"] == []


async def test_a_session_is_not_found_under_another_users_url(autojump_clock, nursery):
    a, b, _ = _pair(nursery)
    session = await _open(a, "alice")
    for app in (a, b):
        status, headers, _ = await _post(app, "bob", _LIST, session=session)
        assert status == 404 and b"mcp-session-id" not in headers


async def test_a_delete_on_one_process_ends_the_session_on_both(autojump_clock, nursery):
    a, b, _ = _pair(nursery)
    session = await _open(a, "alice")
    status, _, body = await _post(b, "alice", None, session=session, method="DELETE")
    assert status == 200, body
    for app in (a, b):  # a held it: dropped at its next request
        assert (await _post(app, "alice", _LIST, session=session))[0] == 404


async def test_a_cancel_that_comes_first_stops_the_call_on_the_other_process(
    autojump_clock, nursery
):
    """The cancel lands on B before A recorded the call: the call must not run (it would
    have: B did not know the call, and A never heard of the cancel)."""
    a, b, store = _pair(nursery)
    session = await _open(a, "alice")
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
    assert (await _post(b, "alice", cancel, session=session))[0] == 202
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "echo", "arguments": {}}}  # fmt: skip
    status, _, body = await _post(a, "alice", call, session=session)
    assert status == 200, body
    result = _answer(body)["result"]
    assert result["isError"] and result["structuredContent"]["status"] == "cancelled"
    assert "nothing was enqueued" in result["content"][0]["text"]
    assert store.pending_count("alice") == 0
    call["id"] = 6  # another request of the session runs (offline desktop: at once)
    result = _answer((await _post(a, "alice", call, session=session))[2])["result"]
    assert result["structuredContent"]["status"] == "offline"


async def test_adopting_past_the_bound_drops_an_idle_copy_the_store_still_has(
    autojump_clock, nursery, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(_mcp, "MAX_SESSIONS_PER_USER", 2)
    a, b, _ = _pair(nursery)
    first, second = await _open(a, "alice"), await _open(a, "alice")
    await trio.sleep(1)
    third = await _open(b, "alice")
    for session in (first, second, third, first):  # b holds two at most
        await trio.sleep(1)
        status, _, body = await _post(b, "alice", _LIST, session=session)
        assert status == 200, body
        endpoint = _endpoint(b)
        assert len(endpoint.manager.held()) <= 2
        assert session in endpoint.manager.held()


def _endpoint(app: Any) -> Any:
    """The user endpoint of alice behind ``app`` (the mount's closure holds the
    endpoints)."""
    cells = [c.cell_contents for c in app.__closure__ or ()]
    endpoints = next(c for c in cells if hasattr(c, "_endpoints"))
    return endpoints._endpoints["alice"]


async def test_a_session_with_a_request_open_does_not_expire_in_the_store(
    autojump_clock, nursery
):
    """A standalone GET stream (or a long keyed call) is the only request of a session
    for longer than the idle timeout: the SDK keeps the session, so its record must stay
    too (it expired under it, and the next request anywhere was 404)."""
    from deskbridge_hub._mcp_mount import McpEndpoints
    from deskbridge_hub._mcp_sessions import SESSION_IDLE_TIMEOUT_S
    from deskbridge_hub._mcp_store import encode_record

    store = MemorySubstrate()
    bridge = Bridge(store)
    endpoints = McpEndpoints(
        get_nursery=lambda: nursery, get_bridge=lambda: bridge, is_draining=lambda: False
    )
    session = "ab" * 16
    await store.open_mcp_session(
        "alice", session, encode_record("2025-06-18", None), ttl_s=SESSION_IDLE_TIMEOUT_S
    )
    scope = {"method": "GET", "headers": [(b"mcp-session-id", session.encode())]}
    async with endpoints.using("alice") as endpoint:
        assert endpoint is not None
        async with endpoint.sessions.serving(scope, None) as refusal:
            assert refusal is None and endpoint.manager.holds(session)  # adopted
            await trio.sleep(3 * SESSION_IDLE_TIMEOUT_S)  # the stream stays open
            assert await store.touch_mcp_session("alice", session, ttl_s=1) is not None
    await trio.sleep(SESSION_IDLE_TIMEOUT_S + 1)  # no request open: it idles out
    assert await store.touch_mcp_session("alice", session, ttl_s=1) is None



async def test_two_requests_adopting_one_session_at_once_adopt_it_once(
    autojump_clock, nursery, monkeypatch: pytest.MonkeyPatch
):
    """Two requests of a session this process does not hold arrive together (a client's
    GET stream and POST after an initialize served elsewhere): both looked the record up,
    both adopted, and the second transport replaced the first, which no request ever
    reached: its idle countdown never started, so it (and its server task) lived until
    the process stopped, outside the bound."""
    from deskbridge_hub import _mcp_sessions

    made: list[Any] = []

    class Counted(_mcp_sessions.StreamableHTTPServerTransport):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(_mcp_sessions, "StreamableHTTPServerTransport", Counted)
    a, b, _ = _pair(nursery)
    session = await _open(a, "alice")
    statuses: list[int] = []

    async def one(request_id: int) -> None:
        request = {**_LIST, "id": request_id}
        statuses.append((await _post(b, "alice", request, session=session))[0])

    async with trio.open_nursery() as both:
        both.start_soon(one, 7)
        both.start_soon(one, 8)
    assert statuses == [200, 200]
    assert len(made) == 1, "adopted twice"
    await trio.sleep(_mcp_sessions.SESSION_IDLE_TIMEOUT_S + 1)  # idles out, all of it
    assert all(t.is_terminated for t in made)


async def test_a_delete_the_store_cannot_record_is_refused_not_answered_ended(
    autojump_clock, nursery
):
    """Redis unreachable: a DELETE on the process holding the session ended its copy and
    answered 200, while the record lived on for every other process (the session still
    served there, its calls there not withdrawn). It is a 503 the client retries."""
    a, b, store = _pair(nursery)
    session = await _open(a, "alice")
    store.set_unavailable(True)
    status, _, body = await _post(a, "alice", None, session=session, method="DELETE")
    assert status == 503, body
    store.set_unavailable(False)
    status, _, body = await _post(b, "alice", _LIST, session=session)
    assert status == 200, body  # not ended: the client was told so
    assert (await _post(a, "alice", None, session=session, method="DELETE"))[0] == 200
    for app in (a, b):
        assert (await _post(app, "alice", _LIST, session=session))[0] == 404


async def test_an_adopted_copy_no_request_reaches_idles_out(
    autojump_clock, nursery, monkeypatch: pytest.MonkeyPatch
):
    """A DELETE that adopted the session and then could not end it (the store failed in
    between: 503) handed the copy no request: the SDK's idle countdown, started only when
    a request ends, never started, and the copy held one of the user's slots on that
    process for good (never picked to make room either: it had no last use)."""
    from deskbridge_hub._errors import SubstrateUnavailable
    from deskbridge_hub._mcp_sessions import SESSION_IDLE_TIMEOUT_S

    a, b, store = _pair(nursery)
    session = await _open(a, "alice")

    async def fails(*args: Any) -> None:
        raise SubstrateUnavailable("test fault")

    monkeypatch.setattr(store, "end_mcp_session", fails)
    status, _, body = await _post(b, "alice", None, session=session, method="DELETE")
    assert status == 503, body
    assert _endpoint(b).manager.holds(session)  # adopted before the store failed
    await trio.sleep(SESSION_IDLE_TIMEOUT_S + 1)
    assert not _endpoint(b).manager.holds(session)
