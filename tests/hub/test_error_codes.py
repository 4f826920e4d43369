"""One condition, one ``error.code``, whichever way in: the HTTP API (its ASGI fast path
for jobs and its Quart routes), the admin API and the MCP endpoint answer a refused
request with the code ``deskbridge_common._codes`` lists for that condition (413 was
``request_entity_too_large`` on /v1 and ``payload_too_large`` on MCP)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
import trio
from deskbridge_common import _codes
from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._http import MAX_BODY_BYTES
from deskbridge_hub._memory import MemorySubstrate

KEY = "k" * 32
#: (method, path template) of each way in; {user} is replaced per condition
WAYS_IN = {
    "jobs (ASGI fast path)": ("POST", "/v1/users/{user}/jobs"),
    "status (Quart route)": ("POST", "/v1/users/{user}/status"),
    "admin API": ("GET", "/v1/admin/users/{user}"),
    "MCP": ("POST", "/v1/users/{user}/mcp"),
}
#: the largest body limit of the ways in: more than this is over every limit
OVER = max(MAX_BODY_BYTES, 16 * 1024 * 1024) + 1


async def _asgi(app: Any, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
    """One request straight through the app's ASGI stack (the MCP mount included)."""
    sent: list[dict[str, Any]] = []
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]

    answered = trio.Event()

    async def receive() -> dict[str, Any]:
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        await answered.wait()  # the client stays until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": urllib.parse.unquote(path), "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "extensions": {},
    }  # fmt: skip
    with trio.fail_after(30):
        await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return status, json.loads(data)
    except ValueError:  # the MCP SDK's event stream
        return status, data.decode()


def _code(answer: dict[str, Any]) -> str:
    """The hub's ``error.code``: on the MCP endpoint a JSON-RPC error response carries
    it as ``error.data.code`` (its ``error.code`` is JSON-RPC's integer, so the SDK's
    client reports the reason)."""
    error = answer["error"]
    if answer.get("jsonrpc") == "2.0":
        assert isinstance(error["code"], int) and error["message"].startswith(
            error["data"]["code"] + ": "
        ), answer
        return str(error["data"]["code"])
    return str(error["code"])


def _message(answer: dict[str, Any]) -> str:
    """The hub's ``error.message`` (on the MCP endpoint, after its ``"<code>: "``)."""
    message = str(answer["error"]["message"])
    if answer.get("jsonrpc") == "2.0":
        return message.removeprefix(_code(answer) + ": ")
    return message


CONDITIONS = {
    "no key": ("alice", {}, b"{}"),
    "bad user id": ("a%20b", {"Authorization": f"Bearer {KEY}"}, b"{}"),
    "body over the limit": ("alice", {"Authorization": f"Bearer {KEY}"}, b" " * OVER),
}


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
async def test_one_condition_one_code_whichever_way_in(autojump_clock, condition) -> None:
    user, headers, body = CONDITIONS[condition]
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    answers: dict[str, tuple[int, str]] = {}
    async with app.test_app():
        for way, (method, template) in WAYS_IN.items():
            if method == "GET" and condition == "body over the limit":
                continue
            with_body = body if method == "POST" else b""
            hdrs = {**headers, "Content-Type": "application/json"}
            path = template.format(user=user)
            status, answer = await _asgi(app, method, path, hdrs, with_body)
            answers[way] = (status, _code(answer))
    assert len(set(answers.values())) == 1, answers
    (_, code), *_ = answers.values()
    assert code in _codes.HTTP_ERROR_CODES, code


async def test_a_wrong_method_is_method_not_allowed_whichever_way_in(autojump_clock) -> None:
    """PUT on the MCP endpoint was the SDK's JSON-RPC ``-32600 Method Not Allowed`` with
    no ``error.code`` of the hub's list; every other route answers ``method_not_allowed``
    with ``Allow``."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    answers = {}
    async with app.test_app():
        for way, (_, template) in WAYS_IN.items():
            headers = {"Authorization": f"Bearer {KEY}"}
            status, answer = await _asgi(app, "PUT", template.format(user="alice"), headers, b"")
            answers[way] = (status, _code(answer))
    assert set(answers.values()) == {(405, _codes.METHOD_NOT_ALLOWED)}, answers


async def test_the_key_as_basic_password_is_taken_whichever_way_in() -> None:
    """/v1 takes the API key as HTTP Basic's password (the connectors page); the MCP
    endpoint, also under /v1, answered 401 to it. (A real clock: the SDK's endpoint
    starts on anyio, which MockClock's autojump would skip past; no sleep here.)"""
    import base64

    basic = "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    statuses = {}
    async with app.test_app():
        for way, (method, template) in WAYS_IN.items():
            headers = {"Authorization": basic, "Content-Type": "application/json"}
            body = b"{" if method == "POST" else b""  # malformed: refused after the key
            if way == "MCP":  # a GET without a session: the SDK's 400, at once
                method, headers["Accept"] = "GET", "application/json, text/event-stream"
            status, _ = await _asgi(app, method, template.format(user="alice"), headers, body)
            statuses[way] = status
    assert 401 not in statuses.values(), statuses


async def test_one_body_limit_named_in_the_answer_whichever_way_in(autojump_clock) -> None:
    """A newcomer pass: a body of 5 MiB was 413 "MCP request bodies are limited to 4194304
    bytes" on MCP but taken on /jobs and /status (Quart's 16 MiB), whose 413 said
    "Request Entity Too Large: POST ..." without the limit. One limit (4 MiB: args are at
    most 1 MiB), and every 413 says it."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    answers = {}
    async with app.test_app():
        assert app.config["MAX_CONTENT_LENGTH"] == MAX_BODY_BYTES
        for way, (method, template) in WAYS_IN.items():
            if method != "POST":
                continue
            path = template.format(user="alice")
            status, answer = await _asgi(app, method, path, headers, b" " * (MAX_BODY_BYTES + 1))
            answers[way] = (status, _message(answer))
    for way, (status, message) in answers.items():
        assert status == 413, answers
        assert message.startswith(f"request bodies are limited to {MAX_BODY_BYTES} bytes"), way


async def test_a_sidecar_token_given_as_the_api_key_is_named_whichever_way_in(autojump_clock):
    """A newcomer pass: the token of `deskbridge-hub token alice` sent as the API key got
    "missing or wrong API key" like any typo; it is the other credential, so the 401 says
    which one the API takes."""
    from deskbridge_hub import issue_token

    token = issue_token("s" * 40, "alice", lifetime_s=600)
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    messages = {}
    async with app.test_app():
        for way, (method, template) in WAYS_IN.items():
            body = b"{}" if method == "POST" else b""
            status, answer = await _asgi(app, method, template.format(user="alice"), headers, body)
            assert status == 401, way
            messages[way] = _message(answer)
    assert len(set(messages.values())) == 1, messages
    (message,) = set(messages.values())
    assert "a sidecar token" in message and "DESKBRIDGE_API_KEY" in message, message


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_an_mcp_post_that_is_not_json_is_answered_json(content_type) -> None:
    """A newcomer pass: ``curl -d '{...}' HUB/v1/users/alice/mcp`` (curl's default is
    ``application/x-www-form-urlencoded``) got the SDK's ``400 Invalid Content-Type
    header`` as text/plain: the one answer of the hub that was not JSON, which an MCP
    client cannot read (it looks for a JSON-RPC error) and which named no accepted type.
    (A real clock: an answer that reaches the SDK starts it on anyio.)"""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    async with app.test_app():
        status, answer = await _asgi(app, "POST", "/v1/users/alice/mcp", headers, body)
    assert status == 400
    assert answer["id"] == 1 and answer["error"]["code"] == -32600, answer
    assert "Content-Type must be application/json" in answer["error"]["message"]


@pytest.mark.parametrize("content_type", ["application/jsonx", "application/json-seq"])
async def test_an_mcp_post_of_a_type_that_only_starts_like_json_is_the_hub_s_answer(
    content_type,
) -> None:
    """The mount's check took any type starting with ``application/json``; the SDK then
    answered ``415`` with ``id: null``: two answers for one condition, the second without
    the request's id. (A real clock: an answer that reaches the SDK starts it on anyio.)"""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": content_type,
    }
    body = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list"}'
    async with app.test_app():
        status, answer = await _asgi(app, "POST", "/v1/users/alice/mcp", headers, body)
    assert status == 400, answer
    assert answer["id"] == 7 and answer["error"]["code"] == -32600, answer
    assert content_type in answer["error"]["message"]


@pytest.mark.parametrize(
    "content_type", ["Application/JSON", "APPLICATION/JSON; charset=utf-8", " application/json"]
)
async def test_an_mcp_post_of_json_in_any_case_is_served(content_type) -> None:
    """Media types are case-insensitive (RFC 9110 8.3.1), as the HTTP routes read them;
    the mount let ``Application/JSON`` through and the SDK, comparing case-sensitively,
    refused it ``415`` with ``id: null``."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": content_type,
    }
    body = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion":'
        b' "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}'
    )
    async with app.test_app():
        status, answer = await _asgi(app, "POST", "/v1/users/alice/mcp", headers, body)
    assert status == 200, answer
