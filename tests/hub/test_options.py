"""``OPTIONS`` is answered the same way on every route: ``204 No Content`` with ``Allow``
naming the route's methods, no body and no content type, after the API key check of the
route (401 without it, as any other method). No CORS headers: the hub grants no
cross-origin access (docs/security.md), so a browser's preflight still fails.

It was Quart's automatic answer, ``200`` ``text/html`` with an empty body, on Quart's
routes, and ``405`` on the MCP endpoint."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate

AUTH = {"Authorization": "Bearer k"}

CASES = [
    ("/livez", "GET, HEAD, OPTIONS"),
    ("/openapi.json", "GET, HEAD, OPTIONS"),
    ("/v1/jobs/j1", "DELETE, GET, HEAD, OPTIONS"),
    ("/v1/jobs/j1/events", "GET, HEAD, OPTIONS"),
    ("/v1/users/alice/jobs", "OPTIONS, POST"),
    ("/v1/users/alice/status", "OPTIONS, POST"),
    ("/v1/users/alice/mcp", "DELETE, GET, OPTIONS, POST"),
]


@pytest.mark.parametrize(("path", "allow"), CASES)
async def test_options_is_204_with_allow(autojump_clock, path, allow):
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=("k",)), MemorySubstrate())
    async with app.test_app():  # serving: the app's ASGI stack as Hypercorn calls it
        start, body = await _raw_options(app, path)
    assert start["status"] == 204, (start, body)
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    assert headers["allow"] == allow
    assert body == b""
    assert "content-type" not in headers  # Quart's response had text/html
    assert "content-length" not in headers  # a 204 has none (RFC 9110 8.6)
    assert "access-control-allow-origin" not in headers


async def _raw_options(app: Any, path: str) -> tuple[dict[str, Any], bytes]:
    """``OPTIONS path`` with the key straight through the app's ASGI stack: the start
    message as sent (the test client adds a content type of its own) and the body."""
    sent: list[dict[str, Any]] = []
    done = trio.Event()

    requested: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not requested:
            requested.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "OPTIONS",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"authorization", b"Bearer k")], "extensions": {},
    }  # fmt: skip
    with trio.fail_after(30):
        await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0], body


@pytest.mark.parametrize("path", ["/v1/jobs/j1", "/v1/users/alice/mcp"])
async def test_options_needs_the_key_where_every_method_does(autojump_clock, path):
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=("k",)), MemorySubstrate())
    async with app.test_app() as test_app:
        r = await test_app.test_client().options(path)
        assert r.status_code == 401, (r.status_code, await r.get_data())


async def test_options_on_an_unknown_path_is_the_json_404(autojump_clock):
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=("k",)), MemorySubstrate())
    async with app.test_app() as test_app:
        r = await test_app.test_client().options("/nowhere", headers=AUTH)
        assert r.status_code == 404
        assert (await r.get_json())["error"]["code"] == "not_found"
