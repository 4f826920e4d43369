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
        "error": {"code": "unavailable", "message": "Redis at h:1 unavailable (x)"},
        "job_id": "j1",
        "detail": {"stage": "unknown"},
    }


def test_unavailable_before_enqueueing_names_none() -> None:
    result = unavailable_result(SubstrateUnavailable("Redis at h:1 unavailable (submit)"))
    assert result.structured_content == {
        "status": "unavailable",
        "error": {"code": "unavailable", "message": "Redis at h:1 unavailable (submit)"},
        "job_id": None,
    }
