"""The MCP endpoint's HTTP answers as an agent's client reads them: every refusal is a
JSON-RPC error body (the SDK's client reads nothing else), a refused request is handed no
session id, and an ``MCP-Protocol-Version`` the hub does not speak is named as such.

Against a real ``deskbridge-hub serve`` (one worker, real Redis); clients on asyncio.
"""

from __future__ import annotations

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from tests.mcp_wire import initialize_2025
from tests.procs import API_KEY, Hub, running

pytestmark = pytest.mark.integration

KEY = {"Authorization": f"Bearer {API_KEY}"}
BOTH = "application/json, text/event-stream"
MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = Hub(tmp_path_factory.mktemp("mcp-answers"), workers=1)
    with running(hub):
        hub.wait_healthy()
        yield hub


def _url(hub: Hub, user: str = "answers") -> str:
    return f"{hub.http}/v1/users/{user}/mcp"


def _session(hub: Hub) -> dict[str, str]:
    """Headers of a fresh 2025-era session (initialize, then initialized)."""
    headers = {**KEY, "Accept": BOTH, "Content-Type": "application/json"}
    r = httpx.post(_url(hub), json=initialize_2025(), headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    session = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(_url(hub), json=done, headers=session, timeout=10).status_code == 202
    return session


def _assert_jsonrpc_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers.get("content-type", "").startswith("application/json"), (r.headers, r.text)
    body = r.json()
    assert body["jsonrpc"] == "2.0" and "id" in body, body
    error = body["error"]
    assert isinstance(error["code"], int) and error["message"], body
    return error


def test_every_refusal_is_a_json_rpc_error_body(hub):
    """The SDK's modern entry answered 406 and 405 with an empty body, and the hub's
    cross-site guard 403 with the HTTP API's ``{"error": {...}}``: an agent's SDK client
    reads only a JSON-RPC error, so each surfaced as "Server returned an error response"."""
    url = _url(hub)
    modern = {**KEY, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    cases = [
        ("POST", {**modern, "Accept": "text/html"}, listing, 406, "not_acceptable"),
        ("GET", {**modern, "Accept": "text/event-stream"}, None, 405, "method_not_allowed"),
        ("DELETE", modern, None, 405, "method_not_allowed"),
        ("POST", {**KEY, "Accept": BOTH, "Origin": "http://elsewhere.example"},
         initialize_2025(), 403, "cross_site_request"),
    ]  # fmt: skip
    for method, headers, body, status, code in cases:
        r = httpx.request(method, url, json=body, headers=headers, timeout=10)
        error = _assert_jsonrpc_error(r, status)
        assert error["data"]["code"] == code, (method, error)
        assert code in error["message"], (method, error)
    # what the agent sees through the SDK's client: the reason, not a stand-in
    anyio.run(_cross_site_through_the_sdk, url, backend="asyncio")


async def _cross_site_through_the_sdk(url: str) -> None:
    headers = {**KEY, "Origin": "http://elsewhere.example"}
    with anyio.fail_after(30):
        with pytest.raises(BaseException) as caught:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=10) as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy"),
            ):
                pass
    text = repr(caught.value)
    assert "cross_site_request" in text and "Server returned an error response" not in text, text


def test_a_refused_request_is_handed_no_session_id(hub):
    """The SDK minted a session for every request without ``Mcp-Session-Id``, discarded it
    when its answer was a refusal, and still sent its id: a client that keeps the id of
    any answer (as some SDKs do) then sends a dead session's id, answered 404 for good."""
    url = _url(hub)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    cases = [
        ("POST", {**KEY, "Accept": BOTH, "MCP-Protocol-Version": "2025-06-18"}, listing, 400),
        ("GET", {**KEY, "Accept": "text/event-stream"}, None, 400),
        ("DELETE", KEY, None, 400),
        ("POST", {**KEY, "Accept": "text/html"}, initialize_2025(), 406),
    ]
    for method, headers, body, status in cases:
        r = httpx.request(method, url, json=body, headers=headers, timeout=10)
        assert r.status_code == status, (method, r.status_code, r.text)
        assert "mcp-session-id" not in r.headers, (method, status, dict(r.headers))
        _assert_jsonrpc_error(r, status)
    assert "Mcp-Session-Id" in _session(hub)  # an accepted initialize still opens one


def test_an_unsupported_protocol_version_header_is_named(hub):
    """A client speaking a version the hub does not know (newer, or mistyped) in
    ``MCP-Protocol-Version`` was told ``params._meta must be an object carrying ...
    envelope keys`` (the SDK took it for the 2026 wire); the spec's 400 now says which
    version was refused and which are served, in the SDK's own shape (-32022)."""
    url = _url(hub)
    session = _session(hub)
    listing = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    for method, headers, body in (
        ("POST", {**session, "MCP-Protocol-Version": "2099-01-01"}, listing),
        ("POST", {**KEY, "Accept": BOTH, "MCP-Protocol-Version": "2099-01-01"}, listing),
        ("GET", {**session, "Accept": "text/event-stream", "MCP-Protocol-Version": "2099-01-01"},
         None),
        ("DELETE", {**session, "MCP-Protocol-Version": "2099-01-01"}, None),
    ):  # fmt: skip
        r = httpx.request(method, url, json=body, headers=headers, timeout=10)
        error = _assert_jsonrpc_error(r, 400)
        assert error["code"] == -32022, (method, error)
        assert "2099-01-01" in error["message"] and "2025-11-25" in error["message"], error
        assert error["data"]["requested"] == "2099-01-01"
        assert error["data"]["supported"] == list(KNOWN_PROTOCOL_VERSIONS), error
        assert r.json()["id"] == (4 if body else None)
    # the session was not ended by any of it
    r = httpx.post(url, json=listing, headers=session, timeout=10)
    assert r.status_code == 200 and '"tools"' in r.text, r.text


def test_a_get_with_last_event_id_opens_the_stream(hub):
    """The hub keeps no event store (it never sends SSE event ids, so there is nothing to
    resume): a GET carrying ``Last-Event-ID`` (a client, or an SSE library, reconnecting)
    got no answer at all from the SDK, which Hypercorn turned into an empty 500. It opens
    the session's standalone stream, as the same GET without the header does."""
    session = _session(hub)
    headers = {**session, "Accept": "text/event-stream", "Last-Event-ID": "0"}
    with httpx.stream("GET", _url(hub), headers=headers, timeout=10) as r:
        assert r.status_code == 200, (r.status_code, r.read())
        assert r.headers["content-type"].startswith("text/event-stream")
    listing = {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}
    r = httpx.post(_url(hub), json=listing, headers=session, timeout=10)
    assert r.status_code == 200 and '"tools"' in r.text, r.text
