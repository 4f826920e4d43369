"""Text that is not valid Unicode from the desktop (a file name that is not UTF-8, as
Linux allows and Python decodes with lone surrogates), with real processes: one
``deskbridge-hub serve`` on Redis, a real sidecar with ``--files-root`` and
``odd_text_tools``, callers over HTTP and the MCP endpoint (the SDK's client, both eras).

Found by fault injection: ``files_list`` of a folder holding ``caf\\xe9.txt`` answered
HTTP callers ``"caf\\udce9.txt"`` (a JSON escape no strict parser accepts, and which the
hub itself refuses in ``args``), and an MCP caller got no answer at all (the SDK could
not serialise the result: "SSE stream ended without a response", or a JSON error in the
2026 era); an error message naming such a file did the same. Now every answer is valid
Unicode text and truthful: the listing names the file escaped and says so
(``name_not_utf8``), a tool's result holding such text is ``failed`` ``bad_result`` (it
ran once: the ledger says so), and an error message carries U+FFFD in its place.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.chaos._harness import TIMINGS, headers, wait_online
from tests.procs import API_KEY, Ledger, Sidecar, issue

pytestmark = pytest.mark.chaos


def strict(raw: bytes) -> object:
    """``raw`` parsed as JSON that holds valid Unicode only (as Rust's serde_json or
    Go's strict decoders demand): a lone surrogate escape raises UnicodeEncodeError."""
    value = json.loads(raw.decode("utf-8"))
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return value


def post(hub_http: str, user: str, body: dict) -> tuple[int, object]:
    with httpx.Client(headers=headers(), timeout=30.0) as client:
        r = client.post(f"{hub_http}/v1/users/{user}/jobs", json={**body, "timeout_s": 10})
    return r.status_code, strict(r.content)


async def mcp_call(hub_http: str, user: str, mode: str, name: str, args: dict):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    async with http:
        transport = streamable_http_client(f"{hub_http}/v1/users/{user}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            with anyio.fail_after(20):
                return await client.call_tool(name, args)


def test_a_file_name_that_is_not_utf8_reaches_every_caller_as_valid_text(tmp_path, procs):
    root = tmp_path / "root"
    root.mkdir()
    Path(root / "plain.txt").write_text("hi")
    with open(bytes(root) + b"/caf\xe9.txt", "w") as f:  # a Latin-1 name
        f.write("hi")
    user = "odd-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = procs.hub(tmp_path, TIMINGS)
    procs.add(
        Sidecar(
            tmp_path, hub.ws, issue(user), tools=["counting_tools", "odd_text_tools"],
            env={**TIMINGS, **ledger.env()}, extra_args=["--files-root", str(root)],
        )
    )  # fmt: skip
    wait_online(hub.http, user)

    status, body = post(hub.http, user, {"name": "files_list", "args": {"path": str(root)}})
    assert status == 200, body
    entries = {e["name"]: e for e in body["result"]["entries"]}
    assert entries["plain.txt"].get("name_not_utf8") is None, entries
    assert entries["caf\\xe9.txt"]["name_not_utf8"] is True, entries

    status, body = post(hub.http, user, {"name": "odd_name", "args": {"key": "k1"}})
    assert status == 422 and body["error"]["code"] == "bad_result", body
    assert ledger.counts() == {"k1": 1}  # it ran, once; its value cannot be sent

    status, body = post(hub.http, user, {"name": "odd_error", "args": {}})
    assert status == 422 and body["error"]["message"] == "cannot open caf\ufffd.txt", body

    for mode in ("legacy", "auto"):
        listed = anyio.run(
            mcp_call, hub.http, user, mode, "files_list", {"path": str(root)}, backend="asyncio"
        )
        assert not listed.is_error, listed
        assert "caf\\\\xe9.txt" in listed.content[0].text, listed
        odd = anyio.run(
            mcp_call, hub.http, user, mode, "odd_name", {"key": f"k-{mode}"}, backend="asyncio"
        )
        assert odd.is_error and "bad_result" in odd.content[0].text, odd
        failed = anyio.run(mcp_call, hub.http, user, mode, "odd_error", {}, backend="asyncio")
        assert failed.is_error and "cannot open caf\ufffd.txt" in failed.content[0].text, failed
    assert ledger.counts() == {"k1": 1, "k-legacy": 1, "k-auto": 1}


async def mcp_list(hub_http: str, user: str, mode: str):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    async with http:
        transport = streamable_http_client(f"{hub_http}/v1/users/{user}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            with anyio.fail_after(20):
                return await client.list_tools()


def test_a_tool_description_that_is_not_utf8_keeps_the_catalogue_usable(tmp_path, procs):
    """A description and schema naming a folder that is not UTF-8: ``GET .../tools``
    answered the escape and MCP ``tools/list`` failed for the user in both protocol
    modes. Now the catalogue carries U+FFFD in its place and every tool stays callable."""
    user = "odd-" + secrets.token_hex(4)
    hub = procs.hub(tmp_path, TIMINGS)
    procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["odd_catalogue_tools"], env=TIMINGS))
    wait_online(hub.http, user)

    with httpx.Client(headers=headers(), timeout=30.0) as client:
        r = client.get(f"{hub.http}/v1/users/{user}/tools")
    assert r.status_code == 200, r.text
    body = strict(r.content)
    assert isinstance(body, dict), body
    tools = {t["name"]: t for t in body["tools"]}
    odd = tools["in_odd_folder"]
    assert odd["description"] == "Return NAME, a file of caf\ufffd.", odd
    assert odd["args_schema"]["properties"]["name"]["description"] == "a file in caf\ufffd"

    for mode in ("legacy", "auto"):
        listed = anyio.run(mcp_list, hub.http, user, mode, backend="asyncio")
        names = {t.name: t for t in listed.tools}
        assert names["in_odd_folder"].description == "Return NAME, a file of caf\ufffd."
        called = anyio.run(
            mcp_call, hub.http, user, mode, "in_odd_folder", {"name": "a"}, backend="asyncio"
        )
        assert not called.is_error, called
    status, body = post(hub.http, user, {"name": "in_odd_folder", "args": {"name": "b"}})
    assert status == 200 and body["result"] == {"name": "b"}, body
