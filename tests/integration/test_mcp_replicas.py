"""A 2025-era MCP session (``initialize``, ``Mcp-Session-Id``) works on every hub process
of a deployment: two ``deskbridge-hub serve`` processes on one Redis, behind HAProxy
round-robin (no session affinity), as pods behind a Kubernetes Service.

Was: a session lived in the memory of the process that created it, so every request
that another process received was ``404 Session not found`` (about half of an agent's
calls failed behind round-robin), a ``notifications/cancelled`` that landed on another
process did not cancel the job, and a ``DELETE`` there did not end the session.

The SDK's client runs on asyncio, as agent frameworks do (see test_mcp.py); requests
aimed at one process on purpose are plain HTTP.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.test_mcp import wait_online
from tests.mcp_wire import initialize_2025
from tests.procs import API_KEY, HAProxy, Hub, Ledger, Sidecar, issue, running, wait_until

pytestmark = pytest.mark.integration

BOTH = "application/json, text/event-stream"
HEADERS = {
    "Authorization": f"Bearer {API_KEY}",
    "Accept": BOTH,
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-06-18",
}


@pytest.fixture
def pods(tmp_path) -> Iterator[tuple[Hub, Hub, HAProxy]]:
    first, second = (Hub(tmp_path, workers=1, name=f"pod{i}") for i in (1, 2))
    with running(first, second):
        first.wait_healthy()
        second.wait_healthy()
        lb = HAProxy(tmp_path, [first.port, second.port])
        with running(lb):
            lb.wait_ready()
            yield first, second, lb


def _url(base: str, user: str) -> str:
    return f"{base}/v1/users/{user}/mcp"


def _open(base: str, user: str) -> dict[str, str]:
    """A new session on the process at ``base``: its request headers."""
    r = httpx.post(_url(base, user), json=initialize_2025(), headers=HEADERS, timeout=10)
    assert r.status_code == 200, r.text
    session = {**HEADERS, "Mcp-Session-Id": r.headers["mcp-session-id"]}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(_url(base, user), json=done, headers=session, timeout=10).status_code == 202
    return session


def _sse_answer(text: str, rid: int) -> dict[str, Any]:
    """The JSON-RPC response for ``rid`` in an SSE body."""
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if message.get("id") == rid and ("result" in message or "error" in message):
                return message
    raise AssertionError(f"no answer for id {rid} in {text!r}")


def _list(base: str, user: str, session: dict[str, str], rid: int = 2) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}
    return httpx.post(_url(base, user), json=body, headers=session, timeout=10)


def _call_in_thread(
    base: str, user: str, session: dict[str, str], rid: int, args: dict[str, Any]
) -> tuple[threading.Thread, dict[str, Any]]:
    """POST a ``record`` tools/call on the process at ``base``; its answer (or the
    exception) lands in the returned dict once the thread ends."""
    out: dict[str, Any] = {}
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "record", "arguments": args}}  # fmt: skip

    def run() -> None:
        try:
            r = httpx.post(_url(base, user), json=body, headers=session, timeout=60)
            out["status"] = r.status_code
            out["answer"] = _sse_answer(r.text, rid)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_legacy_session_works_whichever_process_serves_each_request(pods, tmp_path):
    first, second, lb = pods
    user = "mcp-rr-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, lb.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    with running(sidecar):
        wait_online(lb, user)  # HAProxy has .http, as a Hub
        seen = anyio.run(_legacy_session, lb, user, ledger, backend="asyncio")
        # the cancelled call started on the desktop and never ended there
        wait_until(
            lambda: "cancel requested" in first.output() + second.output(),
            timeout_s=20,
            what="the cancel",
        )
        assert len(ledger.starts(seen["cancel_key"])) == 1
        assert ledger.ends(seen["cancel_key"]) == []
    (session_id,) = seen["sessions"]
    for pod in (first, second):  # DELETE ended it everywhere
        gone = _list(pod.http, user, {**HEADERS, "Mcp-Session-Id": session_id})
        assert gone.status_code == 404, (pod.http, gone.text)
    # each process served part of it: the one that did not create it adopted it
    assert "adopted" in first.output() + second.output()


@asynccontextmanager
async def _legacy_client(base: str, user: str, sessions: set[str]):
    async def note(response: httpx2.Response) -> None:
        if "mcp-session-id" in response.headers:
            sessions.add(response.headers["mcp-session-id"])

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=30.0,
        event_hooks={"response": [note]},
    )
    async with http:
        transport = streamable_http_client(_url(base, user), http_client=http)
        async with Client(transport, mode="legacy") as client:
            yield client


async def _legacy_session(lb: HAProxy, user: str, ledger: Ledger) -> dict[str, Any]:
    sessions: set[str] = set()
    key = "cancel-" + secrets.token_hex(3)
    with anyio.fail_after(90):
        async with _legacy_client(lb.http, user, sessions) as client:
            for round_ in range(3):  # round-robin: each request on the other process
                listed = {t.name for t in (await client.list_tools()).tools}
                assert {"echo", "record"} <= listed
                for i in range(3):
                    echoed = await client.call_tool("echo", {"round": round_, "i": i})
                    assert not echoed.is_error, echoed.content
                    assert echoed.structured_content == {"round": round_, "i": i}
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await client.call_tool("record", {"key": key, "seconds": 30})

                tg.start_soon(call)
                while not ledger.starts(key):  # noqa: ASYNC110 - a file another process writes
                    await anyio.sleep(0.05)
                scope.cancel()  # notifications/cancelled, on whichever process
            done = await client.call_tool("echo", {"after": "cancel"})
            assert not done.is_error, done.content
    return {"sessions": sessions, "cancel_key": key}


@contextmanager
def _a_call_running(first: Hub, tmp_path, rid: int) -> Iterator[dict[str, Any]]:
    """A session opened on ``first`` (which holds the desktop's socket) and a 30 s
    ``record`` call of it (request id ``rid``) running there: yields ``session`` (its
    headers), ``user``, ``key``, ``thread`` and ``out`` (see :func:`_call_in_thread`) and
    ``ledger``."""
    user = "mcp-x-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, first.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    with running(sidecar):
        wait_online(first, user)
        session = _open(first.http, user)
        key = "x-" + secrets.token_hex(3)
        thread, out = _call_in_thread(first.http, user, session, rid, {"key": key, "seconds": 30})
        wait_until(lambda: ledger.starts(key), timeout_s=15, what="the call started")
        yield {"session": session, "user": user, "key": key, "thread": thread, "out": out,
               "ledger": ledger}  # fmt: skip


def _cancelled_there(call: dict[str, Any]) -> None:
    """The call's own stream, on the first process, answered ``cancelled``; the tool was
    cancelled on the desktop, not run to its end."""
    call["thread"].join(20)
    assert not call["thread"].is_alive(), "the call on the first process never ended"
    assert "error" not in call["out"], call["out"]
    result = call["out"]["answer"]["result"]
    assert result["isError"] and result["structuredContent"]["status"] == "cancelled"
    assert call["ledger"].ends(call["key"]) == []


def test_a_cancel_sent_to_another_process_withdraws_the_job(pods, tmp_path):
    first, second, _ = pods
    with _a_call_running(first, tmp_path, 5) as call:
        session, user = call["session"], call["user"]
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 5, "reason": "the user gave up"}}  # fmt: skip
        r = httpx.post(_url(second.http, user), json=cancel, headers=session, timeout=10)
        assert r.status_code == 202, r.text
        _cancelled_there(call)
        # the session goes on, on both
        assert _list(second.http, user, session).status_code == 200
        assert _list(first.http, user, session).status_code == 200


def test_a_delete_sent_to_another_process_ends_the_session_and_its_calls(pods, tmp_path):
    first, second, _ = pods
    with _a_call_running(first, tmp_path, 9) as call:
        session, user = call["session"], call["user"]
        r = httpx.delete(_url(second.http, user), headers=session, timeout=10)
        assert r.status_code == 200, r.text
        _cancelled_there(call)  # its job was withdrawn
        for pod in (second, first):
            gone = _list(pod.http, user, session)
            assert gone.status_code == 404, (pod.http, gone.text)


def test_a_session_id_is_refused_for_another_user_on_every_process(pods):
    first, second, _ = pods
    alice, bob = ("mcp-" + secrets.token_hex(4) for _ in range(2))
    session = _open(first.http, alice)
    for pod in (first, second):
        refused = _list(pod.http, bob, session)
        assert refused.status_code == 404, (pod.http, refused.text)
        assert "mcp-session-id" not in refused.headers
    # ... while alice's own URL serves it on both (the second adopts it)
    for pod in (second, first):
        served = _list(pod.http, alice, session)
        assert served.status_code == 200, (pod.http, served.text)
        assert _sse_answer(served.text, 2)["result"]["tools"] == []
    unknown = {**session, "Mcp-Session-Id": secrets.token_hex(16)}
    for pod in (first, second):  # an id nobody minted
        assert _list(pod.http, alice, unknown).status_code == 404
