"""Strict parsing of an HTTP request's JSON body and its fields, shared by the Quart
routes (``_http._json_body``) and the plain-ASGI job route (``_jobs_asgi``): every
refusal is a ``BadRequest`` naming the field (the API answers 400), except a body of
another media type (415, :func:`check_media_type`)."""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

from deskbridge_common import _strict_json as strict_json
from deskbridge_common._logtext import safe_text
from werkzeug.exceptions import UnsupportedMediaType

from ._bridge_jobs import MAX_TIMEOUT_S
from ._errors import BadRequest


def finite_float(text: str) -> float:
    """``parse_float`` of the strict parser: the float of ``text``, or ValueError when it
    overflows (``1e999``)."""
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def no_constant(name: str) -> Any:
    """``parse_constant`` of the strict parser: ``NaN`` and ``Infinity`` are not JSON."""
    raise ValueError(f"{name} is not JSON")


def check_media_type(content_type: str | None, raw: bytes) -> None:
    """Refuse a body of another media type than JSON, before it is read as JSON.

    A body with no ``Content-Type`` (or an empty one) is read as JSON: scripts and HTTP
    clients that send none keep working. ``application/json`` and any structured
    ``+json`` type (RFC 6839), whatever their parameters, are JSON. An empty body has no
    media type to refuse (``curl -X POST -d ''`` sends the form type).

    Raises:
        werkzeug.exceptions.UnsupportedMediaType: 415; its ``description`` names the
            expected type and the one given (the routes answer it as JSON,
            ``unsupported_media_type``).
    """
    if not raw.strip() or not (content_type or "").strip():
        return
    essence = content_type.split(";", 1)[0].strip().lower()  # type: ignore[union-attr]
    if essence == "application/json" or (
        essence.startswith("application/") and essence.endswith("+json")
    ):
        return
    raise UnsupportedMediaType(
        description=f"Content-Type must be application/json (or none), got "
        f"{safe_text(essence[:100])!r}"
    )


def json_problem(what: str, exc: ValueError | RecursionError) -> str:
    """Why ``what`` (``body``, ``--args``) could not be parsed, in a client's words: the
    parser's own message, except Python's words for its limits (a RecursionError's
    "maximum recursion depth exceeded ...", and "use sys.set_int_max_str_digits() to
    increase the limit", advice for the hub's code, not for a client)."""
    if isinstance(exc, RecursionError):
        return f"{what} is not valid JSON (nested too deeply)"
    if "sys.set_int_max_str_digits" in str(exc):
        return f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"{what} is not valid JSON ({exc})"[:200]


def parse_json_body(raw: bytes, *, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request body as a JSON object: strict RFC 8259 (no NaN, no Infinity, no
    number that overflows a float), so everything accepted can be re-encoded for the
    stream and the job frame (which refuse non-finite numbers), and no object with a
    repeated key (400 naming the key and the top-level field holding it).

    Args:
        raw: the body's bytes (UTF-8 JSON).
        empty: what an empty body stands for (None: an empty body is refused).

    Raises:
        BadRequest: not JSON, not an object, or a repeated key (``field`` names it).
    """
    if not raw.strip() and empty is not None:
        return dict(empty)
    try:
        body = strict_json.loads(
            raw or b"null", parse_constant=no_constant, parse_float=finite_float
        )
    except strict_json.DuplicateKey as exc:  # {"name": "echo", "name": "sleep"}
        raise BadRequest(str(exc), field=exc.field) from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(json_problem("body", exc), field="$") from None
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


def timeout_option(value: Any) -> float | None:
    """A call's ``timeout_s`` given outside a body (MCP's ``_meta``), checked as the HTTP
    body's: seconds in (0, ``MAX_TIMEOUT_S``], or None when absent (None).

    Raises:
        BadRequest: not a number, or out of range (``field`` is ``timeout_s``).
    """
    return _timeout_s({"timeout_s": value}, default=None)


def string_option(name: str, value: Any) -> str | None:
    """``value`` of the option ``name`` given outside a body (MCP's ``_meta``): a string,
    or None when absent (None).

    Raises:
        BadRequest: not a string (``field`` is ``name``).
    """
    found: str | None = _field({name: value}, name, str, required=False)
    return found


def _no_other_fields(body: dict[str, Any], allowed: set[str]) -> None:
    """Raises BadRequest naming the first (sorted) field of ``body`` not in ``allowed``."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unexpected field {unknown[0]!r}", field=unknown[0])


class JobRequest(NamedTuple):
    """The fields of a ``POST /v1/users/{user_id}/jobs`` body (docs/outcomes.md)."""

    name: str
    args: dict[str, Any]
    idempotency_key: str | None
    job_id: str | None
    timeout_s: float | None  # seconds; None: the bridge's default

    async def dispatch(self, bridge: Any, user_id: str, *, started_at: float | None = None) -> Any:
        """``bridge.dispatch(user_id, ...)`` with these fields; returns its ``Outcome``
        and raises what it raises (the routes map the errors to answers). ``started_at``:
        when the request's handling began (``trio.current_time()``), if the route knows:
        its ``timeout_s`` counts from then (``Bridge.dispatch``)."""
        return await bridge.dispatch(
            user_id,
            self.name,
            self.args,
            idempotency_key=self.idempotency_key,
            timeout_s=self.timeout_s,
            job_id=self.job_id,
            started_at=started_at,
        )


def parse_job(raw: bytes) -> JobRequest:
    """Parse a job request's body: ``{"name", "args"?, "idempotency_key"?, "job_id"?,
    "timeout_s"?}``, nothing else.

    Args:
        raw: the body's bytes.

    Raises:
        BadRequest: not a JSON object, a field missing, of the wrong type or out of
            range, or an unknown field (``field`` names it; "$": the body as a whole).
            Identifiers and the size of ``args`` are checked by ``Bridge.dispatch``
            (the same for HTTP, MCP and Python callers).
    """
    body = parse_json_body(raw)
    name = _field(body, "name", str, required=True)
    args = _field(body, "args", dict, required=False, default={})
    key = _field(body, "idempotency_key", str, required=False)
    job_id = _field(body, "job_id", str, required=False)
    timeout_s = _timeout_s(body, default=None)
    _no_other_fields(body, {"name", "args", "idempotency_key", "timeout_s", "job_id"})
    return JobRequest(name, args, key, job_id, timeout_s)
