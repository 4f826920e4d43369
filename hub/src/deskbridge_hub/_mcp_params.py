"""Malformed ``params`` of an MCP request answered as the HTTP API answers a malformed body:
JSON-RPC ``-32602`` (invalid params) naming the field and what is wrong with it.

The SDK validates each request's ``params`` against its model and answers any failure
``-32602`` "Invalid request parameters" with ``data: ""`` (it puts no validation text on
the wire): ``tools/call`` with ``arguments: [1]``, no ``name``, or a ``progressToken`` that is
an object all read the same, and an agent's developer could not tell which field to fix.
HTTP names it (``400 {"error": {"code": "bad_request", "field": "args", ...}}``).
:func:`name_invalid_params` is a server middleware around the SDK's validation: such a
failure becomes ``-32602`` with the message ``<field>: <field> must be ...`` and ``data:
{"code": "bad_request", "field"}``, the field as the request spells it under ``params``
(``arguments``, ``name``, ``_meta.progressToken``), as for the hub's own ``_meta`` refusals.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pydantic
from deskbridge_common import _codes
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError

#: What a pydantic error type says about the value, in the HTTP API's words.
_WORDS = {
    "missing": "is required",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "list_type": "must be an array",
}

#: The words for each member of a union pydantic names in an error's location (a
#: ``progressToken`` is a string or an integer: its two errors end in ``str`` and ``int``).
_UNION_MEMBERS = {"str": "a string", "int": "an integer", "float": "a number"}


def invalid_params(exc: pydantic.ValidationError) -> MCPError | None:
    """The ``-32602`` naming the field for the SDK's validation of a request's ``params``
    (a model named ``...Request``, errors located under ``params``), or None for any other
    validation error (the hub's own code: the SDK's answer stands)."""
    errors = [e for e in exc.errors() if e["loc"][:1] == ("params",)]
    if not exc.title.endswith("Request") or not errors:
        return None
    loc = errors[0]["loc"][1:]
    members = []
    if loc and loc[-1] in _UNION_MEMBERS:  # one value, several errors: one per member
        loc = loc[:-1]
        members = [
            _UNION_MEMBERS[str(e["loc"][-1])]
            for e in errors
            if e["loc"][1:-1] == loc and e["loc"][-1] in _UNION_MEMBERS
        ]
    field = ".".join(str(part) for part in loc) or "params"
    if members:
        words = "must be " + " or ".join(members)
    else:
        words = _WORDS.get(errors[0]["type"], "is not valid")
    return MCPError(
        types.INVALID_PARAMS,
        f"{field}: {field} {words}",
        data={"code": _codes.BAD_REQUEST, "field": field},
    )


async def name_invalid_params(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """Server middleware (``Server.middleware``): the SDK's refusal of malformed ``params``
    raised again naming the field (:func:`invalid_params`); everything else untouched."""
    try:
        return await call_next(ctx)
    except pydantic.ValidationError as exc:
        named = invalid_params(exc)
        if named is None:
            raise
        raise named from None
