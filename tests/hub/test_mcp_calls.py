"""``tools/call`` through a user's MCP endpoint (``UserEndpoint._call_tool``) on the memory
substrate, memory sockets and MockClock: the same refusal answers as HTTP (code and
field), and an abandoned call cancels its own job only, never one another caller is
attached to."""

from __future__ import annotations

import types as pytypes
from typing import Any

import mcp_types as types
import pytest
import trio
import trio.testing
from deskbridge_common import ToolSpec
from deskbridge_hub import BadRequest, Bridge
from deskbridge_hub._http import bridge_error_answer
from deskbridge_hub._mcp import UserEndpoint
from mcp.shared.exceptions import MCPError

from tests.hub.test_outcomes import bridge, connect, ignore, sidecar, state  # noqa: F401

SCHEMA = {
    "type": "object",
    "properties": {"selector": {"type": "string"}},
    "required": ["selector"],
    "additionalProperties": False,
}


def _ctx(meta: dict[str, Any] | None = None) -> Any:
    """The part of the SDK's request context ``_call_tool`` reads."""
    return pytypes.SimpleNamespace(params={"_meta": meta or {}}, session=None)


async def _mcp_call(
    via: Bridge, name: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> types.CallToolResult:
    endpoint = UserEndpoint("u1", via)
    params = types.CallToolRequestParams(name=name, arguments=args)
    return await endpoint._call_tool(_ctx(meta), params)


async def _http_error(via: Bridge, name: str, args: dict[str, Any]) -> tuple[int, Any]:
    with pytest.raises(BadRequest) as refused:
        await via.dispatch("u1", name, args, timeout_s=10)
    status, body = bridge_error_answer(refused.value)
    return status, body["error"]


@pytest.mark.parametrize(
    "args",
    [{"selector": 5}, {"selector": "x", "extra": 1}, {"selector": "x" * (300 * 1024)}],
    ids=["schema type", "schema extra field", "over max_args_bytes"],
)
async def test_args_the_hub_refuses_get_http_s_code_and_field_through_mcp(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    args,
):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])
        nursery.start_soon(sidecar, peer, ignore)
        status, http = await _http_error(bridge, "click", args)
        assert status == 400 and http["field"] == "args"
        got = await _mcp_call(bridge, "click", args)
        assert got.is_error
        error = got.structured_content["error"]
        assert (error["code"], error["field"]) == (http["code"], http["field"])
        assert got.structured_content["status"] == http["code"]  # not "failed": nothing ran
        assert got.structured_content["job_id"] is None
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_an_unknown_tool_is_invalid_params_with_http_s_code_and_field(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])
        nursery.start_soon(sidecar, peer, ignore)
        _, http = await _http_error(bridge, "nope", {})
        with pytest.raises(MCPError) as refused:
            await _mcp_call(bridge, "nope", {})
        assert refused.value.error.code == types.INVALID_PARAMS
        assert refused.value.error.data == {"code": http["code"], "field": http["field"]}
        nursery.cancel_scope.cancel()
