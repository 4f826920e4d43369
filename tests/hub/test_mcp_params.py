"""``_mcp_params.invalid_params``: only the SDK's validation of a request's ``params`` is
renamed; a validation error of anything else (the hub's own result models) keeps the SDK's
answer, so it is never passed off as the caller's field."""

from __future__ import annotations

import mcp_types as types
import pydantic
import pytest
from deskbridge_hub._mcp_params import invalid_params
from mcp_types import methods


def _error(method: str, params: object) -> pydantic.ValidationError:
    with pytest.raises(pydantic.ValidationError) as caught:
        methods.validate_client_request(method, "2025-06-18", params)
    return caught.value


def test_a_request_s_params_are_named() -> None:
    named = invalid_params(_error("tools/call", {"name": "echo", "arguments": "x"}))
    assert named is not None
    assert named.error.code == types.INVALID_PARAMS
    assert named.error.message == "arguments: arguments must be a JSON object"
    assert named.error.data == {"code": "bad_request", "field": "arguments"}


def test_a_validation_error_of_a_result_is_left_to_the_sdk() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        types.CallToolResult.model_validate({"content": 5})
    assert invalid_params(caught.value) is None
