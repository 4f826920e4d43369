"""What Hypercorn answers itself, before the app sees a request (h11 cannot parse it),
carries the API's JSON error body naming the cause, through real Hypercorn and raw
sockets, and so does a WebSocket upgrade Hypercorn refuses before the app sees it.
Before: the status with ``Content-Length: 0`` and no body (a 100,000-character URL got a
bare 431)."""

from __future__ import annotations

import json

import pytest

from tests.hub.hypercorn_kit import exchange, serve_hub

_UPGRADE = (
    b"GET /v1/sidecar HTTP/1.1\r\nHost: hub\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
CASES = [
    # (request, status, code, words in the message)
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: hub\r\n\r\n", 431,
     "request_header_fields_too_large", "16384 bytes"),
    (b"GET /livez HTTP/1.1\r\nHost: hub\r\nno colon here\r\n\r\n", 400, "bad_request",
     "malformed HTTP/1.1 request"),
    (b"GET /livez HTTP/1.1\r\n\r\n", 400, "bad_request", "Host"),
    (b"POST /v1/users/u1/jobs HTTP/1.1\r\nHost: hub\r\nContent-Length: ten\r\n\r\n", 400,
     "bad_request", "Content-Length"),
    (b"POST /v1/users/u1/jobs HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
     "not_implemented", "Transfer-Encoding"),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400, "bad_request",
     "malformed"),  # TLS to the plain port
    (_UPGRADE.replace(b"Version: 13", b"Version: 8"), 400, "bad_request", "Version: 13"),
    (_UPGRADE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b""), 400,
     "bad_request", "Sec-WebSocket-Key"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "words"),
    CASES,
    ids=[
        "431-long-url",
        "400-header",
        "400-no-host",
        "400-content-length",
        "501-te",
        "400-tls",
        "400-ws-version",
        "400-ws-no-key",
    ],
)
async def test_a_request_hypercorn_cannot_parse_gets_a_json_error_body(
    nursery, request_bytes, status, code, words
):
    port = await serve_hub(nursery)
    data = await exchange(port, request_bytes)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == f"HTTP/1.1 {status} ", lines[0]
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert words in error["message"], error["message"]
