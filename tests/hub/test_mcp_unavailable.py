"""An MCP tool call answered ``unavailable`` after its job was enqueued names the job, as
the HTTP API does (docs/outcomes.md): it was the short answer of a call that enqueued
nothing, though the job may still run."""

from __future__ import annotations

from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._mcp import unavailable_result


def test_unavailable_while_waiting_names_the_job() -> None:
    result = unavailable_result(SubstrateUnavailable("Redis at h:1 unavailable (x)", job_id="j1"))
    assert result.is_error
    assert result.structured_content == {
        "status": "unavailable",
        "error": {
            "code": "unavailable",
            "message": "Redis at h:1 unavailable (x)",
            "retry_after_s": 5,
        },
        "job_id": "j1",
        "detail": {"stage": "unknown"},
    }


def test_unavailable_before_enqueueing_names_none() -> None:
    result = unavailable_result(SubstrateUnavailable("Redis at h:1 unavailable (submit)"))
    assert result.structured_content == {
        "status": "unavailable",
        "error": {
            "code": "unavailable",
            "message": "Redis at h:1 unavailable (submit)",
            "retry_after_s": 5,
        },
        "job_id": None,
    }


async def test_tools_list_with_redis_down_says_unavailable_as_http_does(
    autojump_clock, caplog, monkeypatch
) -> None:
    """``tools/list`` with Redis down is the JSON-RPC error the hub gives for its own 503
    on the MCP endpoint: ``-32603`` with HTTP's code in ``data`` (``GET .../tools`` answers
    503 ``unavailable``), and the cause in the log as for every ``unavailable`` answer. It
    had no ``data`` (a client could not tell it from a crash) and left no line."""
    import logging

    import mcp_types as types
    from deskbridge_hub import Bridge
    from deskbridge_hub import _unavailable_log as unavailable
    from deskbridge_hub._http import bridge_error_answer
    from deskbridge_hub._mcp import UserEndpoint
    from deskbridge_hub._peer_noise import LogBudget
    from mcp.shared.exceptions import MCPError

    from tests.hub.test_openapi import _Down

    substrate = _Down()
    substrate.down = True
    bridge = Bridge(substrate)
    try:
        await bridge.tools("alice")
    except SubstrateUnavailable as exc:
        _, http = bridge_error_answer(exc)
    monkeypatch.setattr(unavailable, "_budget", LogBudget(burst=0, interval_s=unavailable.EVERY_S))
    caplog.clear()
    try:
        await UserEndpoint("alice", bridge)._list_tools(None, None)  # type: ignore[arg-type]
    except MCPError as exc:
        error = exc.error
    else:
        raise AssertionError("tools/list answered with Redis down")
    assert error.code == types.INTERNAL_ERROR
    assert error.data == {"code": http["error"]["code"], "retry_after_s": 5}
    assert error.message == f"unavailable: {http['error']['message']}"
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "deskbridge.hub.unavailable" and r.levelno == logging.WARNING
    ]
    assert len(lines) == 1 and "Redis at test:0 unavailable" in lines[0]
