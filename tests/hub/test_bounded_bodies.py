"""Every request body the hub reads is bounded in size, declared and actual, and in time,
on every route that takes one: a declared ``Content-Length`` over the limit is refused at
once (413), a body that does not arrive within ``BODY_TIMEOUT`` is 408, each with the
route's error shape (the API's ``{"error": ...}``, a JSON-RPC error on the MCP endpoint).

The MCP endpoint read its POST body with neither bound: a POST declaring 99,999,999
bytes and sending none was never answered (a task and a descriptor held for ever)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._asgi_body import DRAIN_S
from deskbridge_hub._memory import MemorySubstrate

AUTH = {"Authorization": "Bearer k"}
MCP = "/v1/users/alice/mcp"
MCP_HEADERS = {
    **AUTH,
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}
#: Every route that reads a body, with the headers it needs.
ROUTES = [
    ("/v1/users/alice/jobs", AUTH),
    ("/v1/users/alice/status", AUTH),
    (MCP, MCP_HEADERS),
]


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[tuple[Any, Any]]:
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=("k",)), MemorySubstrate())
    async with app.test_app() as test_app:
        yield app, test_app.test_client()


def _error_code(path: str, body: bytes) -> str:
    """``error.code`` of the API's shape, ``error.data.code`` of a JSON-RPC error."""
    parsed = json.loads(body)
    if path == MCP:
        assert parsed["jsonrpc"] == "2.0" and parsed["id"] is None, parsed
        assert isinstance(parsed["error"]["code"], int), parsed
        return str(parsed["error"]["data"]["code"])
    return str(parsed["error"]["code"])


@pytest.mark.parametrize(("path", "headers"), ROUTES)
async def test_a_declared_length_over_the_limit_is_413_at_once(autojump_clock, path, headers):
    async with client() as (_, c):
        started = trio.current_time()
        with trio.fail_after(300):
            declared = {**headers, "Content-Length": "99999999"}
            async with c.request(path, method="POST", headers=declared) as conn:
                r = await conn.as_response()  # no byte of the body sent
        # at once, but for the drain of what the client may still be sending
        assert trio.current_time() - started <= DRAIN_S
        assert r.status_code == 413, await r.get_data()
        assert _error_code(path, await r.get_data()) == "request_entity_too_large"


@pytest.mark.parametrize(("path", "headers"), ROUTES)
async def test_a_body_over_the_limit_as_sent_is_413(autojump_clock, path, headers):
    async with client() as (app, c):
        app.config["MAX_CONTENT_LENGTH"] = 20
        with trio.fail_after(300):
            async with c.request(path, method="POST", headers=headers) as conn:
                await conn.send(b'{"jsonrpc": "2.0", ')
                await conn.send(b'"method": "ping", "id": 1}')
                await conn.send_complete()
                r = await conn.as_response()
        assert r.status_code == 413, await r.get_data()
        body = await r.get_data()
        assert _error_code(path, body) == "request_entity_too_large"
        assert "limited to 20 bytes" in body.decode()


@pytest.mark.parametrize(("path", "headers"), ROUTES)
async def test_a_body_that_never_ends_is_408_after_the_body_timeout(autojump_clock, path, headers):
    async with client() as (app, c):
        app.config["BODY_TIMEOUT"] = 7
        started = trio.current_time()
        with trio.fail_after(300):
            async with c.request(path, method="POST", headers=headers) as conn:
                await conn.send(b'{"jsonrpc": ')
                r = await conn.as_response()
        assert trio.current_time() - started == pytest.approx(7)
        assert r.status_code == 408, await r.get_data()
        assert _error_code(path, await r.get_data()) == "request_timeout"
