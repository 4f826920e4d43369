"""Issue 13 item 1: the MCP endpoint, with the SDK's own client against a real hub process
(``deskbridge-hub serve``, real Redis) and real sidecar processes.

Both wire eras the SDK speaks are covered: ``mode="legacy"`` (the 2025 initialize
handshake, ``notifications/cancelled``, spontaneous ``notifications/tools/list_changed``)
and the default ``mode="auto"`` (2026-07-28: per-request envelopes, cancellation by
abandoning the request, change events on ``subscriptions/listen``).

The clients run on asyncio (``anyio.run(..., backend="asyncio")``), as agent frameworks
do; the hub they talk to is the real trio one. (Under trio, the SDK's HTTP client leaves
async generators to the garbage collector, which trio reports as ResourceWarnings.)
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ToolsListChanged

from tests.mcp_wire import initialize_2025
from tests.procs import API_KEY, Hub, Ledger, Sidecar, issue, running, wait_until
from tests.sites import serve_site

pytestmark = pytest.mark.integration

MODES = ["legacy", "auto"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@asynccontextmanager
async def mcp_client(hub: Hub, user: str, *, mode: str, key: str = API_KEY, **kwargs):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0)
    async with http:
        transport = streamable_http_client(f"{hub.http}/v1/users/{user}/mcp", http_client=http)
        async with Client(transport, mode=mode, **kwargs) as client:
            yield client


def wait_online(hub: Hub, user: str, online: bool = True) -> None:
    url = f"{hub.http}/v1/users/{user}/presence"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    wait_until(
        lambda: httpx.get(url, headers=headers).json()["online"] is online,
        timeout_s=20,
        what=f"{user} online={online}",
    )


def run(scenario, *args) -> None:
    anyio.run(scenario, *args, backend="asyncio")


@pytest.fixture
def hub(tmp_path):
    hub = Hub(tmp_path, workers=1)
    with running(hub):
        hub.wait_healthy()
        yield hub


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_and_calls_through_a_real_sidecar(hub, tmp_path, mode):
    user = "mcp-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    with running(sidecar):
        wait_online(hub, user)
        run(_tools_list_and_calls, hub, user, mode, ledger)


async def _tools_list_and_calls(hub: Hub, user: str, mode: str, ledger: Ledger) -> None:
    with anyio.fail_after(60):
        async with mcp_client(hub, user, mode=mode) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert set(listed) == {"status", "echo", "sleep", "record", "record_sync"}
            record = listed["record"]
            assert record.description == "Append KEY to the test ledger, then sleep SECONDS."
            assert record.input_schema["properties"]["key"] == {"type": "string"}
            assert record.input_schema["required"] == ["key"]
            assert record.annotations.read_only_hint is False
            assert record.annotations.destructive_hint is True
            assert listed["echo"].annotations.read_only_hint is True
            assert listed["sleep"].input_schema["properties"]["seconds"]["minimum"] == 0

            echoed = await client.call_tool("echo", {"x": [1, "two"], "mode": mode})
            assert not echoed.is_error
            assert json.loads(echoed.content[0].text) == {"x": [1, "two"], "mode": mode}
            assert echoed.structured_content == {"x": [1, "two"], "mode": mode}

            done = await client.call_tool("record", {"key": f"k-{mode}"})
            assert not done.is_error and done.structured_content["key"] == f"k-{mode}"
            assert ledger.counts() == {f"k-{mode}": 1}

            bad = await client.call_tool("sleep", {"seconds": -1})
            # refused by the hub as HTTP refuses it: 400's code and field, nothing ran
            assert bad.is_error and bad.structured_content["error"]["code"] == "bad_request"
            assert bad.structured_content["error"]["field"] == "args"
            assert "seconds" in bad.content[0].text

            with pytest.raises(MCPError) as refused:
                await client.call_tool("no_such_tool", {})
            assert refused.value.code == types.INVALID_PARAMS
            assert "no tool 'no_such_tool'" in refused.value.message


def test_an_offline_desktop_is_a_clear_tool_error(hub):
    run(_offline, hub)


async def _offline(hub: Hub) -> None:
    user = "mcp-off-" + secrets.token_hex(4)
    with anyio.fail_after(30):
        async with mcp_client(hub, user, mode="auto") as client:
            assert (await client.list_tools()).tools == []
            result = await client.call_tool("echo", {"a": 1})
    assert result.is_error
    assert result.structured_content["status"] == "offline"
    assert result.content[0].text.startswith("offline: offline: desktop of")


def test_the_endpoint_needs_the_api_key(hub):
    url = f"{hub.http}/v1/users/someone/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["data"]["code"] == "unauthorized"
        assert r.json()["jsonrpc"] == "2.0" and r.json()["id"] is None  # body unread
        assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(
        f"{hub.http}/v1/users/bad%20user/mcp",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.status_code == 400 and r.json()["error"]["data"]["field"] == "user_id"


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_a_call_cancels_the_job_on_the_desktop(hub, tmp_path, mode):
    user = "mcp-c-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    key = f"cancel-{mode}-" + secrets.token_hex(3)
    with running(sidecar):
        wait_online(hub, user)
        anyio.run(_abandon, hub, user, mode, ledger, key, {}, backend="asyncio")
        wait_until(
            lambda: "cancel requested (delivered)" in hub.output(), timeout_s=20, what="the cancel"
        )
        assert len(ledger.starts(key)) == 1 and ledger.ends(key) == []  # started, never ended


@pytest.mark.parametrize("mode", MODES)
def test_an_abandoned_call_with_a_key_leaves_the_job_to_its_retry(hub, tmp_path, mode):
    """A keyed request may be shared (another caller, HTTP or MCP, attached by the key):
    giving up on one call does not cancel it; the same request again attaches and gets
    the one run's outcome."""
    user = "mcp-k-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    key = f"keep-{mode}-" + secrets.token_hex(3)
    meta = {"deskbridge/idempotency_key": key}
    with running(sidecar):
        wait_online(hub, user)
        again = anyio.run(_abandon, hub, user, mode, ledger, key, meta, backend="asyncio")
        assert not again.is_error, again.content
        assert len(ledger.starts(key)) == 1 and len(ledger.ends(key)) == 1
    assert "cancel requested (delivered)" not in hub.output()


async def _abandon(
    hub: Hub, user: str, mode: str, ledger: Ledger, key: str, meta: dict[str, str]
) -> types.CallToolResult:
    """Abandon a ``record`` call (3 s) once it started on the desktop, then send the
    very same request again (a reused key with other args is refused) and return its
    answer."""
    with anyio.fail_after(60):
        async with mcp_client(hub, user, mode=mode) as client:
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await client.call_tool("record", {"key": key, "seconds": 3}, meta=meta)
                    assert scope.cancelled_caught

                tg.start_soon(call)
                while not ledger.starts(key):  # noqa: ASYNC110 - a file another process writes
                    await anyio.sleep(0.05)
                scope.cancel()
            if not meta:
                return types.CallToolResult(content=[])
            return await client.call_tool("record", {"key": key, "seconds": 3}, meta=meta)


@pytest.mark.parametrize("mode", MODES)
def test_a_catalogue_change_is_announced(hub, tmp_path, mode):
    user = "mcp-l-" + secrets.token_hex(4)
    first = Sidecar(tmp_path, hub.ws, issue(user), name="plain")
    with running(first):
        wait_online(hub, user)
        run(_catalogue_change, hub, tmp_path, user, mode, first)


async def _catalogue_change(hub: Hub, tmp_path: Path, user: str, mode: str, first: Sidecar) -> None:
    seen = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.set()

    with anyio.fail_after(60):
        async with mcp_client(hub, user, mode=mode, message_handler=on_message) as client:
            assert {t.name for t in (await client.list_tools()).tools} == {
                "status",
                "echo",
                "sleep",
            }
            if mode == "auto":
                async with client.listen(tools_list_changed=True) as sub:
                    await _swap_sidecar(first, tmp_path, hub, user)
                    event = await sub.__anext__()
                    assert isinstance(event, ToolsListChanged)
            else:
                await _swap_sidecar(first, tmp_path, hub, user)
                await seen.wait()
            names = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
            assert "record" in names


async def _swap_sidecar(first: Sidecar, tmp_path: Path, hub: Hub, user: str) -> None:
    """Replace the sidecar with one that offers one more tool (a new hello, a new
    catalogue); a second sidecar for the same user supersedes the first."""
    await anyio.to_thread.run_sync(first.stop)
    _LATE.append(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], name="more"))


_LATE: list[Sidecar] = []


@pytest.fixture(autouse=True)
def _stop_late_sidecars():
    yield
    while _LATE:
        _LATE.pop().stop()


def test_an_agent_fills_a_form_in_headless_chromium_through_mcp(hub, tmp_path):
    """The done-when path: the SDK's client lists a real sidecar's tools (its browser and
    files toolsets on), calls ``echo`` and browser tools against a loopback page in
    headless Chromium; then ``examples/mcp_agent.py`` does the same as a user would run it."""
    user = "mcp-b-" + secrets.token_hex(4)
    files = tmp_path / "files"
    files.mkdir()
    with serve_site() as site:
        sidecar = Sidecar(
            tmp_path,
            hub.ws,
            issue(user),
            extra_args=[
                "--browser-origin", site, "--browser-headless",
                "--browser-profile", str(tmp_path / "profile"),
                "--files-root", str(files),
            ],
        )  # fmt: skip
        with running(sidecar):
            wait_online(hub, user)
            run(_browse, hub, user, site)
            agent = subprocess.run(
                [
                    sys.executable, str(EXAMPLES / "mcp_agent.py"),
                    "--hub", hub.http, "--user", user, "--api-key", API_KEY,
                    "--url", f"{site}/form", "--name", "Grace",
                ],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert agent.returncode == 0, agent.stdout + agent.stderr
            assert "the page at" in agent.stdout and "'Hello Grace'" in agent.stdout
            assert "browser_fill" in agent.stdout and "changes things" in agent.stdout
            assert sidecar.stop() == 0  # SIGTERM: the daemon stops, then the browser closes
        log = sidecar.log_path.read_text()
        assert "Traceback" not in log and "browser started" in log


async def _browse(hub: Hub, user: str, site: str) -> None:
    with anyio.fail_after(90):
        async with mcp_client(hub, user, mode="auto") as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert {"browser_open", "browser_fill", "files_write", "echo"} <= set(listed)
            assert listed["browser_fill"].annotations.destructive_hint is True
            assert listed["browser_text"].annotations.read_only_hint is True
            assert listed["files_write"].annotations.read_only_hint is False
            echoed = await client.call_tool("echo", {"hi": 1})
            assert echoed.structured_content == {"hi": 1}
            opened = await client.call_tool("browser_open", {"url": f"{site}/form"})
            assert not opened.is_error, opened.content[0].text
            assert opened.structured_content["title"] == "Form"
            await client.call_tool("browser_fill", {"selector": "#name", "value": "Ada"})
            clicked = await client.call_tool("browser_click", {"selector": "#send"})
            assert clicked.structured_content["url"] == f"{site}/submitted?name=Ada"
            text = await client.call_tool("browser_text", {"selector": "#r"})
            assert text.structured_content["text"] == "Hello Ada"
            denied = await client.call_tool("browser_open", {"url": "https://example.com/"})
            assert denied.is_error
            assert denied.structured_content["error"]["code"] == "origin_not_allowed"


def test_progress_reaches_mcp_sse_and_bridge_callers(hub, tmp_path):
    """A long tool's progress: MCP ``notifications/progress`` (both wire eras), the SSE
    stream ``GET /v1/jobs/{job_id}/events`` ending with the outcome."""
    user = "mcp-p-" + secrets.token_hex(4)
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["progress_tools"])
    with running(sidecar):
        wait_online(hub, user)
        for mode in MODES:
            reports = anyio.run(_progress_over_mcp, hub, user, mode, backend="asyncio")
            assert len(reports) >= 3, (mode, reports)
            assert [r[0] for r in reports] == sorted(r[0] for r in reports)
            assert all(total == 8 for _, total, _ in reports)
            assert reports[-1][2].endswith("/8")

        job_id = "sse-" + secrets.token_hex(6)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        events: list[tuple[str, dict]] = []

        def post() -> None:
            body = {"name": "count", "args": {"n": 8, "delay_s": 0.25}, "job_id": job_id}
            r = httpx.post(f"{hub.http}/v1/users/{user}/jobs", json=body, headers=headers,
                           timeout=30)  # fmt: skip
            assert r.status_code == 200, r.text

        poster = threading.Thread(target=post)
        poster.start()
        url = f"{hub.http}/v1/jobs/{job_id}/events"
        wait_until(lambda: _job_known(hub, job_id), timeout_s=10, what="job dispatched")
        with httpx.stream("GET", url, headers=headers, timeout=30) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            kind = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line[6:])))
                    if kind == "outcome":
                        break
        poster.join(30)
        kinds = [k for k, _ in events]
        assert kinds[-1] == "outcome" and kinds.count("outcome") == 1
        assert events[-1][1]["status"] == "completed"
        assert events[-1][1]["result"] == {"counted": 8}
        progress = [d for k, d in events if k == "progress"]
        assert progress and progress[-1]["total"] == 8
        missing = httpx.get(f"{hub.http}/v1/jobs/nope-{secrets.token_hex(3)}/events",
                            headers=headers)  # fmt: skip
        assert missing.status_code == 404


def _job_known(hub: Hub, job_id: str) -> bool:
    """The events endpoint answers 404 until the job is dispatched."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    try:
        with httpx.stream(
            "GET", f"{hub.http}/v1/jobs/{job_id}/events", headers=headers, timeout=2
        ) as r:
            return r.status_code == 200
    except httpx.ReadTimeout:
        return True


async def _progress_over_mcp(hub: Hub, user: str, mode: str) -> list:
    reports = []

    async def on_progress(progress, total, message) -> None:
        reports.append((progress, total, message))

    with anyio.fail_after(60):
        async with mcp_client(hub, user, mode=mode) as client:
            result = await client.call_tool(
                "count", {"n": 8, "delay_s": 0.25}, progress_callback=on_progress
            )
    assert not result.is_error, result.content[0].text
    assert result.structured_content == {"counted": 8}
    return reports


def test_initialize_advertises_tools_list_changed(hub):
    """The hub sends notifications/tools/list_changed (below), so the 2025-era handshake must
    advertise ``capabilities.tools.listChanged: true`` (it said false)."""
    body = initialize_2025("curl")
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Accept": "application/json, text/event-stream",
    }
    r = httpx.post(f"{hub.http}/v1/users/someone/mcp", json=body, headers=headers)
    assert r.status_code == 200, r.text
    data = [line[5:] for line in r.text.splitlines() if line.startswith("data:")]
    result = json.loads(data[0])["result"]
    assert result["capabilities"]["tools"]["listChanged"] is True


@pytest.mark.parametrize("mode", MODES)
def test_call_tool_input_the_http_api_refuses_is_refused_over_mcp_too(hub, tmp_path, mode):
    """A hostile tester found the MCP path skipping what POST /jobs checks: a reused
    idempotency key was "Internal server error", a non-string key was dropped (the call
    ran again), and args over the 256 KiB limit reached the stream."""
    user = "mcp-in-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env())
    with running(sidecar):
        wait_online(hub, user)
        run(_refused_input, hub, user, mode, ledger)
    assert ledger.counts() == {f"once-{mode}": 1}


async def _refused_input(hub: Hub, user: str, mode: str, ledger: Ledger) -> None:
    key = {"deskbridge/idempotency_key": f"key-{mode}"}
    with anyio.fail_after(60):
        async with mcp_client(hub, user, mode=mode) as client:
            done = await client.call_tool("record", {"key": f"once-{mode}"}, meta=key)
            assert not done.is_error
            again = await client.call_tool("record", {"key": f"once-{mode}"}, meta=key)
            assert again.structured_content == done.structured_content  # joined, not rerun
            with pytest.raises(MCPError) as reused:
                await client.call_tool("record", {"key": "other"}, meta=key)
            assert reused.value.code == types.INVALID_PARAMS
            assert "deskbridge/idempotency_key" in reused.value.message
            assert reused.value.error.data["code"] == "idempotency_key_reused"
            assert reused.value.error.data["job_id"]  # the job the key names
            for bad in (5, ["k"], {"k": 1}):
                with pytest.raises(MCPError) as typed:
                    await client.call_tool(
                        "record", {"key": "never"}, meta={"deskbridge/idempotency_key": bad}
                    )
                assert typed.value.code == types.INVALID_PARAMS
                assert "must be a string" in typed.value.message
            big = await client.call_tool("echo", {"s": "x" * (256 * 1024)})
            assert big.is_error and big.structured_content["error"]["code"] == "bad_request"
            assert "args larger than 262144 bytes" in big.content[0].text


def test_a_repeated_json_key_is_refused_not_picked(hub):
    """``{"name": "echo", "name": "sleep"}`` ran sleep (the SDK keeps the last value); the
    HTTP API refuses it, and so does MCP now: a JSON-RPC parse error, HTTP 400."""
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-06-18",
    }
    url = f"{hub.http}/v1/users/someone/mcp"
    for body in (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"echo","name":"sleep","arguments":{}}}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call",'
        b'"params":{"name":"echo","arguments":{"a":1,"a":2}}}',
        b'{"jsonrpc":"2.0","id":3,"id":4,"method":"tools/list","params":{}}',
    ):
        r = httpx.post(url, content=body, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == -32700 and "duplicate key" in error["message"], r.text
    # and a well-formed request still goes through the replayed body
    ok = {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    r = httpx.post(url, json=ok, headers=headers)
    assert r.status_code == 200 and "listChanged" in r.text, r.text
    r = httpx.post(url, content=b"x" * (4 * 1024 * 1024 + 1), headers=headers)
    assert r.status_code == 413


def test_a_message_that_is_not_a_json_rpc_request_is_invalid_request(hub):
    """An agent's developer sent what JSON-RPC calls an Invalid Request: a batch (MCP
    removed batching), a bare value, no ``jsonrpc: "2.0"``, a non-string method, no
    method. The SDK answered ``-32602`` (invalid params) with a pydantic dump; and a
    request whose id MCP forbids (null, a boolean, a fraction) was taken for a
    notification: ``202`` and no answer ever, the client waited for good. Now each is
    HTTP 400 with ``-32600``, and nothing reaches the session."""
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-06-18",
    }
    url = f"{hub.http}/v1/users/someone/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    r = httpx.post(url, json=init, headers=headers)
    assert r.status_code == 200, r.text
    session = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}
    r = httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                   headers=session)  # fmt: skip
    assert r.status_code == 202, r.text
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
    for body, answer_id, why in (
        ([listing], None, "batch"),
        ([], None, "batch"),
        (5, None, "object"),
        (None, None, "object"),
        ({"id": 7, "method": "tools/list"}, 7, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 7, "method": "tools/list"}, 7, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 7, "method": 5}, 7, "method"),
        ({"jsonrpc": "2.0", "id": 7}, 7, "method"),
        ({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, None, "id"),
        ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, None, "id"),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}, None, "id"),
    ):
        for h in (headers, session):
            r = httpx.post(url, content=json.dumps(body), headers=h, timeout=10)
            assert r.status_code == 400, (body, r.status_code, r.text)
            answer = r.json()
            assert answer["id"] == answer_id, (body, answer)
            assert answer["error"]["code"] == -32600, (body, answer)
            assert why in answer["error"]["message"], (body, answer)
            assert "validation error" not in answer["error"]["message"].lower()
            assert "mcp-session-id" not in r.headers  # no session minted for it
    # the session still answers a well-formed request
    r = httpx.post(url, json=listing, headers=session)
    assert r.status_code == 200 and '"tools"' in r.text, r.text


def _docs_client_lines() -> str:
    """The lines of docs/mcp.md's quick start that build the agent's HTTP client."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("headers = ", "http = "))]
    assert lines[-1].startswith("http = httpx2.AsyncClient("), lines
    return "\n".join(lines)


def test_the_documented_client_waits_for_a_tool_longer_than_its_default_timeout(hub, tmp_path):
    """docs/mcp.md's quick start built ``httpx2.AsyncClient(headers=...)``: httpx2's
    default 5 s read timeout, while the hub keeps a silent call's stream alive with an SSE
    ping every 15 s (the SDK's). Any tool running over 5 s without progress failed on the
    agent's side (``ReadTimeout``, or "SSE stream ended without a response"), and the
    abandoned call was cancelled on the desktop. The documented client must wait."""
    user = "mcp-t-" + secrets.token_hex(4)
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"])
    with running(sidecar):
        wait_online(hub, user)
        run(_slow_call_with_the_documented_client, hub, user)


async def _slow_call_with_the_documented_client(hub: Hub, user: str) -> None:
    scope = {"httpx2": httpx2, "api_key": API_KEY}
    exec(_docs_client_lines(), scope)  # noqa: S102 - the docs' own lines, as a user copies them
    http = scope["http"]
    with anyio.fail_after(60):
        async with http:
            transport = streamable_http_client(f"{hub.http}/v1/users/{user}/mcp", http_client=http)
            async with Client(transport) as client:
                slept = await client.call_tool("sleep", {"seconds": 7})
    assert not slept.is_error, slept.content
    assert slept.structured_content == {"slept_s": 7}


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_after_a_hub_restart_a_2025_session_carries_on_with_redis_only(tmp_path, store):
    """Pins what docs/mcp.md tells agent developers. On Redis the restarted hub adopts
    the 2025 session from its record (as any other replica would). On the in-memory
    store the session is gone with the process: the restarted hub answers it 404 (the
    spec), which the SDK's legacy client reports as "Session not found" on every later
    call (it does not re-initialize by itself: a new ``Client`` does). The 2026 wire has
    no session and carries on either way."""
    env = {"DESKBRIDGE_REDIS_URL": "memory://"} if store == "memory" else {}
    first = Hub(tmp_path, workers=1, name="first", env=env)
    port = first.port
    seen: dict[str, object] = {}

    async def scenario() -> None:
        with anyio.fail_after(120):
            async with (
                mcp_client(first, "restarts", mode="legacy") as legacy,
                mcp_client(first, "restarts", mode="auto") as modern,
            ):
                assert (await legacy.list_tools()).tools == []
                assert (await modern.list_tools()).tools == []
                await anyio.to_thread.run_sync(first.stop)
                second = Hub(tmp_path, workers=1, port=port, name="second", env=env)
                seen["second"] = second
                await anyio.to_thread.run_sync(second.wait_healthy)
                if store == "redis":
                    assert (await legacy.list_tools(cache_mode="refresh")).tools == []
                    offline = await legacy.call_tool("echo", {"a": 1})
                    assert offline.structured_content["status"] == "offline"
                else:
                    for _ in range(2):
                        with pytest.raises(MCPError) as gone:
                            await legacy.list_tools(cache_mode="refresh")
                        assert "Session not found" in gone.value.message
                assert (await modern.list_tools(cache_mode="refresh")).tools == []
                async with mcp_client(second, "restarts", mode="legacy") as fresh:
                    assert (await fresh.list_tools()).tools == []

    try:
        with running(first):
            first.wait_healthy()
            run(scenario)
    finally:
        second = seen.get("second")
        if isinstance(second, Hub):
            second.stop()


def test_the_sdk_client_is_told_why_the_hub_refused_the_request(hub):
    """The hub's own refusals on the MCP endpoint (a wrong key: 401, a body over the
    limit: 413) are JSON-RPC error bodies, so the official SDK client reports their
    reason. Was: ``{"error": {"code": "unauthorized", ...}}``, which the SDK does not
    read: every one surfaced as ``-32603`` "Server returned an error response"."""
    run(_refusals_explained, hub)


async def _refusals_explained(hub: Hub) -> None:
    user = "mcp-why-" + secrets.token_hex(4)
    with anyio.fail_after(30):
        with pytest.raises(BaseException) as caught:  # the SDK's task group wraps it
            async with mcp_client(hub, user, mode="legacy", key="wrong"):
                pass
        refused = _only_mcp_error(caught.value)
        assert "API key" in refused.error.message, refused.error
        assert refused.error.data["code"] == "unauthorized"
        async with mcp_client(hub, user, mode="legacy") as client:
            with pytest.raises(MCPError) as too_big:
                await client.call_tool("echo", {"x": "a" * (4 * 1024 * 1024)})
        assert "limited to 4194304 bytes" in too_big.value.error.message, too_big.value.error
        assert too_big.value.error.data["code"] == "request_entity_too_large"


def _only_mcp_error(exc: BaseException) -> MCPError:
    """The one MCPError in ``exc`` (an exception group's, however nested)."""
    while isinstance(exc, BaseExceptionGroup):
        assert len(exc.exceptions) == 1, exc
        exc = exc.exceptions[0]
    assert isinstance(exc, MCPError), exc
    return exc


def _answer(r: httpx.Response) -> dict:
    """The JSON-RPC message of a POST's answer: its JSON body, or its SSE stream's message."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:] for ln in r.text.splitlines() if ln.startswith("data:") and ln[5:].strip()]
        return json.loads(data[-1])
    return r.json()


def test_malformed_params_are_invalid_params_naming_the_field(hub):
    """``tools/call`` with ``arguments: [1]``, no ``name``, a ``name`` that is a number, a
    ``progressToken`` that is a list, ``tools/list`` with a numeric cursor: the SDK
    answered each ``-32602`` "Invalid request parameters" with ``data: ""``, so nobody could
    tell which field to fix (HTTP says ``args must be a JSON object``, field ``args``).
    Now the message and ``data.field`` name it, on both wire eras."""
    base = {
        "Authorization": f"Bearer {API_KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    url = f"{hub.http}/v1/users/someone/mcp"
    legacy = {**base, "MCP-Protocol-Version": "2025-06-18"}
    r = httpx.post(url, json=initialize_2025(), headers=legacy)
    assert r.status_code == 200, r.text
    legacy["Mcp-Session-Id"] = r.headers["mcp-session-id"]
    r = httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                   headers=legacy)  # fmt: skip
    assert r.status_code == 202, r.text
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    cases = [
        (legacy, "tools/call", {"name": "echo", "arguments": [1]}, "arguments",
         "must be a JSON object"),
        (legacy, "tools/call", {"arguments": {}}, "name", "is required"),
        (legacy, "tools/call", {"name": 5, "arguments": {}}, "name", "must be a string"),
        (legacy, "tools/call", {"name": "echo", "_meta": {"progressToken": [1]}},
         "_meta.progressToken", "must be a string or an integer"),
        (legacy, "tools/list", {"cursor": 5}, "cursor", "must be a string"),
        (base, "tools/call", {"name": "echo", "arguments": [1], "_meta": envelope},
         "arguments", "must be a JSON object"),
        (base, "tools/call", {"name": "echo", "_meta": {**envelope, "progressToken": {}}},
         "_meta.progressToken", "must be a string or an integer"),
    ]  # fmt: skip
    for n, (headers, method, params, field, words) in enumerate(cases):
        body = {"jsonrpc": "2.0", "id": 10 + n, "method": method, "params": params}
        if headers is base:  # the 2026 wire: its headers repeat the body's routing
            headers = {**base, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method,
                       "Mcp-Name": str(params["name"])}  # fmt: skip
        r = httpx.post(url, json=body, headers=headers, timeout=10)
        answer = _answer(r)
        assert answer["id"] == 10 + n, (params, answer)
        error = answer["error"]
        assert error["code"] == -32602, (params, answer)
        assert error["message"] == f"{field}: {field} {words}", (params, answer)
        assert error["data"] == {"code": "bad_request", "field": field}, (params, answer)
