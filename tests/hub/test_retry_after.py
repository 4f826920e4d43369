"""Every retryable refusal says when to retry, the same way on every way in: HTTP's
``Retry-After`` header and ``error.retry_after_s`` in the body, MCP's
``error.data.retry_after_s`` (and ``structuredContent.error.retry_after_s`` of a tool
result), ``retry_after_s`` on the Python exception. ``unavailable`` (Redis cannot be used):
``UNAVAILABLE_RETRY_AFTER_S`` (5 s); ``draining`` and a call released by a restart:
``RESTART_RETRY_AFTER_S`` (1 s, at another replica); ``offline`` none (no server
condition: the desktop is off). Before, only 429 ``queue_full`` and 503 ``overloaded``
carried it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from deskbridge_hub import HubConfig, SubstrateUnavailable, create_app
from deskbridge_hub._errors import RESTART_RETRY_AFTER_S, UNAVAILABLE_RETRY_AFTER_S
from deskbridge_hub._http import (
    answer_headers,
    bridge_error_answer,
    outcome_answer,
    restarting_answer,
)
from deskbridge_hub._mcp import outcome_result, unavailable_result
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._outcome import Outcome

AUTH = {"Authorization": "Bearer k", "Content-Type": "application/json"}


def _app() -> Any:
    return create_app(HubConfig(secrets=("s" * 40,), api_keys=("k",)), MemorySubstrate())


def test_the_exception_carries_it():
    assert SubstrateUnavailable("down").retry_after_s == UNAVAILABLE_RETRY_AFTER_S == 5
    assert RESTART_RETRY_AFTER_S == 1


@pytest.mark.parametrize(
    ("answer", "seconds"),
    [
        (bridge_error_answer(SubstrateUnavailable("down")), UNAVAILABLE_RETRY_AFTER_S),
        (
            outcome_answer(
                Outcome("j1", "unavailable", error={"code": "unavailable", "message": "x"})
            ),
            UNAVAILABLE_RETRY_AFTER_S,
        ),
        (restarting_answer("j1", "delivered"), RESTART_RETRY_AFTER_S),
    ],
)
def test_http_unavailable_answers_say_when(answer, seconds):
    status, body = answer
    assert status == 503
    assert body["error"]["retry_after_s"] == seconds
    assert answer_headers(answer) == [("Retry-After", str(seconds))]


def test_offline_says_nothing():
    answer = outcome_answer(Outcome(None, "offline", error={"code": "offline", "message": "x"}))
    assert "retry_after_s" not in answer[1]["error"]
    assert answer_headers(answer) == []


@pytest.mark.parametrize("path", ["/v1/users/alice/jobs", "/v1/users/alice/status"])
async def test_draining_is_retry_after_one_second(autojump_clock, path):
    app = _app()
    async with app.test_app() as test_app:
        app.extensions["deskbridge"]["state"].drain.active = True
        r = await test_app.test_client().post(path, data=b'{"name": "echo"}', headers=AUTH)
        if path.endswith("/status"):
            r = await test_app.test_client().post(path, data=b"{}", headers=AUTH)
        body = await r.get_json()
    assert r.status_code == 503 and body["error"]["code"] == "draining", body
    assert r.headers["Retry-After"] == "1"
    assert body["error"]["retry_after_s"] == RESTART_RETRY_AFTER_S


async def test_the_job_route_unavailable_is_retry_after(autojump_clock):
    app = _app()
    async with app.test_app() as test_app:

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise SubstrateUnavailable("Redis down")

        app.extensions["deskbridge"]["bridge"].dispatch = down
        r = await test_app.test_client().post(
            "/v1/users/alice/jobs", data=b'{"name": "echo"}', headers=AUTH
        )
        body = await r.get_json()
    assert r.status_code == 503 and body["error"]["code"] == "unavailable", body
    assert r.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)


def test_mcp_results_carry_it_in_structured_content():
    down = unavailable_result(SubstrateUnavailable("down"))
    assert down.structured_content["error"]["retry_after_s"] == UNAVAILABLE_RETRY_AFTER_S
    draining = outcome_result(
        Outcome(None, "unavailable", error={"code": "draining", "message": "restarting"})
    )
    assert draining.structured_content["error"]["retry_after_s"] == RESTART_RETRY_AFTER_S
    offline = outcome_result(Outcome(None, "offline", error={"code": "offline", "message": "x"}))
    assert "retry_after_s" not in offline.structured_content["error"]


async def test_mcp_not_serving_yet_says_when_in_data_and_header():
    from deskbridge_hub._mcp_mount import mount_mcp

    async def quart(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(scope)

    bounds = {"MAX_CONTENT_LENGTH": 4096, "BODY_TIMEOUT": 60}
    app = mount_mcp(quart, SimpleNamespace(nursery=None, config=bounds), {}, ())
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/v1/users/alice/mcp", "headers": headers}
    with trio.fail_after(5):
        await app(scope, receive, send)
    assert sent[0]["status"] == 503
    assert (b"retry-after", str(UNAVAILABLE_RETRY_AFTER_S).encode()) in sent[0]["headers"]
    answer = json.loads(sent[1]["body"])
    assert answer["error"]["data"] == {
        "code": "unavailable",
        "retry_after_s": UNAVAILABLE_RETRY_AFTER_S,
    }


def test_the_openapi_document_lists_retry_after_where_routes_send_it():
    from deskbridge_hub import __version__
    from deskbridge_hub._openapi import document

    doc = document(__version__)
    jobs = doc["paths"]["/v1/users/{user_id}/jobs"]["post"]["responses"]
    for status in ("429", "503"):
        assert "Retry-After" in jobs[status]["headers"], status
    tools = doc["paths"]["/v1/users/{user_id}/tools"]["get"]["responses"]
    assert "Retry-After" in tools["503"]["headers"]
    events = doc["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]
    assert "Retry-After" in events["429"]["headers"]  # too many streams: was not listed
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
    assert "unavailable" in error["retry_after_s"]["description"]
