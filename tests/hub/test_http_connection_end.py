"""How the hub's HTTP/1 connections end, through real Hypercorn (in process, trio worker)
and raw sockets: every route, whoever serves it (Quart, the plain-ASGI job route, the
MCP mount), closes a connection its client asked to close (``Connection: close``, or
HTTP/1.0 without keep-alive) once the answer is written, and a keep-alive connection left
idle is closed after ``keep_alive_timeout``.

Before: quart-trio cancels its request's tasks when Hypercorn, inside the app's last
``send``, reports the stream closed; the cancellation reached Hypercorn's own close of the
socket (``send_eof``) and its restart of the keep-alive timer, so after any Quart route's
answer a ``Connection: close`` connection stayed open (a client reading to EOF waited for
ever) and an idle keep-alive connection was never closed by the hub.
"""

from __future__ import annotations

import pytest
import trio

from tests.hub.hypercorn_kit import exchange, serve_hub, until_eof

#: (method, path, body) of routes served by Quart, by ``_jobs_asgi`` and by the MCP mount.
ROUTES = [
    ("GET", "/livez", b""),
    ("GET", "/healthz", b""),
    ("GET", "/metrics", b""),
    ("GET", "/openapi.json", b""),
    ("GET", "/v1/users/u1/presence", b""),
    ("POST", "/v1/users/u1/status", b""),
    ("GET", "/no/such/route", b""),
    ("GET", "/v1/users/u1/jobs", b""),  # Quart's 405
    ("POST", "/v1/users/u1/jobs", b'{"name": "echo", "args": {}}'),
    ("POST", "/v1/users/u1/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'),
]
KEEP_ALIVE_S = 0.5


@pytest.fixture
async def hub_port(nursery):
    return await serve_hub(nursery, keep_alive_timeout_s=KEEP_ALIVE_S)


def _request(method: str, path: str, body: bytes, version: str, connection: str) -> bytes:
    head = f"{method} {path} {version}\r\nHost: hub\r\nAuthorization: Bearer k\r\n{connection}"
    head += "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


@pytest.mark.parametrize(
    ("version", "connection"),
    [("HTTP/1.1", "Connection: close\r\n"), ("HTTP/1.0", "")],
    ids=["1.1-close", "1.0"],
)
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_a_connection_the_client_closes_is_closed_after_the_answer(
    hub_port, method, path, body, version, connection
):
    data = await exchange(hub_port, _request(method, path, body, version, connection))
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    assert b"\r\n\r\n" in data


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_timeout(
    hub_port, method, path, body
):
    stream = await trio.open_tcp_stream("127.0.0.1", hub_port)
    async with stream:
        await stream.send_all(_request(method, path, body, "HTTP/1.1", ""))
        data = await until_eof(stream, KEEP_ALIVE_S + 5.0)
    assert data.startswith(b"HTTP/1.1 "), data[:200]
