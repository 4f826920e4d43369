"""The HTTP API's plumbing, shared by its routes: JSON responses and error bodies, the
outcome -> status mapping (``HTTP_STATUS``), strict parsing of a request's JSON body and
its fields (400 naming the field), and which paths need the API key and how it is
presented (bearer, or HTTP Basic's password)."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from deskbridge_common import _strict_json as strict_json
from quart import Response, request

from ._bridge import MAX_TIMEOUT_S
from ._errors import BadRequest
from ._outcome import Outcome

#: HTTP status for each outcome (DESIGN.md, public interface).
HTTP_STATUS = {
    "completed": 200,
    "failed": 422,
    "expired": 410,
    "lost": 410,
    "cancelled": 409,
    "in_doubt": 409,
    "declined": 409,
    "timeout": 504,
    "offline": 503,
    "unavailable": 503,
}


def _draining() -> Response:
    """A replica that is shutting down refuses new work before enqueueing anything, so
    the caller can retry on another replica at once."""
    return _json(
        {
            "status": "unavailable",
            "error": {"code": "draining", "message": "this hub replica is restarting; retry"},
        },
        503,
    )


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def _error(status: int, code: str, message: str, **extra: Any) -> Response:
    return _json({"error": {"code": code, "message": message, **extra}}, status)


def _presented_key(header: str) -> str:
    """The API key in an ``Authorization`` header: a bearer token, or the password of
    HTTP Basic (any user name; what a browser sends for the connectors page)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return ""


def _needs_key(path: str) -> bool:
    """Routes behind the API key: the dispatch API, metrics and the admin pages."""
    return path.startswith(("/v1/", "/admin")) or path == "/metrics"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _json_body(*, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request body as a JSON object: strict RFC 8259 (no NaN, no Infinity, no
    number that overflows a float), so everything accepted can be re-encoded for the
    stream and the job frame (which refuse non-finite numbers), and no object with a
    repeated key (400 naming the key and the top-level field holding it).

    Args:
        empty: what an empty body stands for (None: an empty body is refused).

    Raises:
        BadRequest: not JSON, not an object, or a repeated key (``field`` names it).
    """
    raw = await request.get_data(as_text=False)
    if not raw.strip() and empty is not None:
        return dict(empty)
    try:
        body = strict_json.loads(
            raw or b"null", parse_constant=_no_constant, parse_float=_finite
        )
    except strict_json.DuplicateKey as exc:  # {"name": "echo", "name": "sleep"}
        raise BadRequest(str(exc), field=exc.field) from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON ({exc})"[:200], field="$") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", field="$")
    return body


_KIND_NAMES: dict[Any, str] = {
    dict: "a JSON object",
    str: "a string",
    (int, float): "a number",
}


def _field(
    body: dict[str, Any], name: str, kind: Any, *, required: bool, default: Any = None
) -> Any:
    if name not in body or body[name] is None:
        if required:
            raise BadRequest(f"{name} is required", field=name)
        return default
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadRequest(f"{name} must be {_KIND_NAMES.get(kind, 'of another type')}", field=name)
    return value


def _timeout_s(body: dict[str, Any], *, default: float | None) -> float | None:
    """``timeout_s`` of a request body: seconds in (0, ``MAX_TIMEOUT_S``], or ``default``.

    Raises:
        BadRequest: not a number, or out of range (``field`` is ``timeout_s``).
    """
    value = _field(body, "timeout_s", (int, float), required=False)
    if value is None:
        return default
    if not (0 < value <= MAX_TIMEOUT_S):
        raise BadRequest(
            f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]", field="timeout_s"
        )
    return float(value)


def _no_other_fields(body: dict[str, Any], allowed: set[str]) -> None:
    """Raises BadRequest naming the first (sorted) field of ``body`` not in ``allowed``."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unexpected field {unknown[0]!r}", field=unknown[0])


def _outcome_response(outcome: Outcome) -> Response:
    body: dict[str, Any] = {"job_id": outcome.job_id, "status": outcome.status}
    if outcome.status == "completed":
        body["result"] = outcome.result
    else:
        body["error"] = outcome.error
    if outcome.detail:
        body["detail"] = outcome.detail
    body["elapsed_ms"] = round(outcome.elapsed_s * 1000, 3)
    return _json(body, HTTP_STATUS.get(outcome.status, 500))
