"""The MCP endpoint's HTTP refusals, as an MCP client reads them.

The Streamable HTTP transport refuses a message with a JSON-RPC error response as the
HTTP body (the SDK's client reads only that from a non-2xx answer and reports anything
else as ``-32603`` "Server returned an error response", hiding the reason). Three rules
hold for every refusal on ``/v1/users/{user_id}/mcp``, whoever answers it:

- the body is a JSON-RPC error (:func:`error_body`): the hub's own refusals are built so,
  and :func:`guarded_send` rewrites an SDK refusal sent with no JSON body (its modern
  entry answers ``405`` and ``406`` empty) into one;
- a refused request that carried no ``Mcp-Session-Id`` is handed none
  (:func:`guarded_send`): the SDK opens a session for every such request and discards it
  when its answer is a refusal, but still sent the dead session's id;
- an ``MCP-Protocol-Version`` that names no protocol revision the SDK knows is refused
  ``400`` with the SDK's own error for an unsupported version (``-32022``,
  ``data: {"supported", "requested"}``), naming both (:func:`unsupported_version`).
  The SDK took any such header for the 2026 wire and answered that ``params._meta``
  lacks the envelope keys, which says nothing to a client of another version.

No module of the SDK is imported here: the mount and the cross-site guard use this
before the SDK is loaded (``_mcp_mount._mcp_module``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from deskbridge_common import _codes, safe_text

#: The MCP endpoint's path; group 1 is the user id.
MCP_PATH = re.compile(r"/v1/users/([^/]+)/mcp/?\Z")
#: JSON-RPC's "Parse error", "Invalid Request" and "Internal error".
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
#: The SDK's code for an unsupported protocol version (``mcp_types.jsonrpc``).
UNSUPPORTED_PROTOCOL_VERSION = -32022
#: The JSON-RPC error code of a refusal by HTTP status: Invalid Request for a request
#: refused as it stands, an implementation-defined server error (-32000..-32099) for a
#: missing or wrong key, Internal error otherwise (a hub that cannot serve it).
RPC_CODE_OF_STATUS = {
    400: INVALID_REQUEST,
    401: -32001,
    403: INVALID_REQUEST,
    404: INVALID_REQUEST,
    405: INVALID_REQUEST,
    406: INVALID_REQUEST,
    408: INVALID_REQUEST,
    413: INVALID_REQUEST,
    415: INVALID_REQUEST,
}
#: ``data.code`` of an SDK refusal rewritten by :func:`guarded_send`, by HTTP status.
_CODE_OF_STATUS = {**_codes.HTTP_STATUS_CODES, 406: _codes.NOT_ACCEPTABLE}
#: Why the SDK refused, for the statuses it answers with no body.
_WHY = {
    405: "this endpoint takes POST only on the 2026 wire (GET and DELETE are for "
    "2025-era sessions: send no 2026 MCP-Protocol-Version with them)",
    406: "the Accept header must list application/json and text/event-stream",
}
_SESSION_HEADER = b"mcp-session-id"

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def error_body(
    status: int, code: str, message: str, request_id: str | int | None = None, **extra: Any
) -> bytes:
    """The JSON-RPC error response refusing a request with HTTP ``status``: ``id``
    ``request_id`` (null when the body was not read or had none), ``error.code`` by
    :data:`RPC_CODE_OF_STATUS`, ``error.message`` ``"<code>: <message>"``, ``error.data``
    ``{"code": code, **extra}`` (what the HTTP API's error body holds)."""
    error = {
        "code": RPC_CODE_OF_STATUS.get(status, INTERNAL_ERROR),
        "message": f"{code}: {message}",
        "data": {"code": code, **extra},
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


async def send_body(
    send: Send, status: int, body: bytes, extra_headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``status`` with the JSON ``body`` (and ``extra_headers``)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def unsupported_version(scope: Any, known: tuple[str, ...]) -> bytes | None:
    """The ``400`` body refusing the request's ``MCP-Protocol-Version`` when it names
    no revision in ``known`` (the SDK's ``KNOWN_PROTOCOL_VERSIONS``), else None. The
    ``id`` is left null: the caller fills in the request's."""
    header = next((v for k, v in scope.get("headers", []) if k == b"mcp-protocol-version"), None)
    if header is None:
        return None
    requested = header.decode("latin-1")
    if requested in known:
        return None
    message = (
        f"Unsupported protocol version: MCP-Protocol-Version {safe_text(requested)!r} is "
        f"none this server speaks ({', '.join(known)}; the 2025 ones after initialize)"
    )
    error = {
        "code": UNSUPPORTED_PROTOCOL_VERSION,
        "message": message,
        "data": {"supported": list(known), "requested": requested},
    }
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def with_id(body: bytes, request_id: str | int | None) -> bytes:
    """``body`` (a JSON-RPC error) answering the request ``request_id``."""
    if request_id is None:
        return body
    return json.dumps({**json.loads(body), "id": request_id}).encode()


def guarded_send(send: Send, scope: Any) -> Send:
    """``send`` for the SDK's answer to ``scope``'s request, keeping the rules above:
    a response of status 400 or more loses ``Mcp-Session-Id`` when the request carried
    none, and one whose body is not JSON gets a JSON-RPC error body instead. Successful
    responses (SSE streams included) pass through unchanged, message by message."""
    had_session = any(k == _SESSION_HEADER for k, _ in scope.get("headers", []))
    held: list[MutableMapping[str, Any]] = []  # a refusal's start, then its body until complete

    async def guarded(message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start" and message.get("status", 200) >= 400:
            headers = message.get("headers", [])
            if not had_session:
                headers = [(k, v) for k, v in headers if k.lower() != _SESSION_HEADER]
            held.append({**message, "headers": headers})
            return
        if not held:
            await send(message)
            return
        held.append(message)
        if kind == "http.response.body" and not message.get("more_body", False):
            await _flush(send, held)

    return guarded


async def _flush(send: Send, held: list[MutableMapping[str, Any]]) -> None:
    start, *chunks = held
    held.clear()
    body = b"".join(m.get("body", b"") for m in chunks)
    headers = start["headers"]
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    if body and kind.split(b";")[0].strip().lower() == b"application/json":
        await send(start)
        await send({"type": "http.response.body", "body": body})
        return
    status = start["status"]
    code = _CODE_OF_STATUS.get(status, _codes.INTERNAL_SERVER_ERROR)
    why = _WHY.get(status) or (body.decode("utf-8", "replace")[:200] or f"HTTP {status}")
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
    await send_body(send, status, error_body(status, code, why), kept)


__all__ = [
    "INTERNAL_ERROR",
    "MCP_PATH",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "RPC_CODE_OF_STATUS",
    "error_body",
    "guarded_send",
    "send_body",
    "unsupported_version",
    "with_id",
]
