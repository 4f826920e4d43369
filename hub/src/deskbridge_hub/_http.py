"""The HTTP API's plumbing, shared by its Quart routes and the plain-ASGI job route
(``_jobs_asgi``): answers as ``(status, JSON body)`` and as Quart responses, error bodies,
the outcome -> status mapping (``HTTP_STATUS``), the bridge errors -> status mapping, and
which paths need the API key, how it is presented (bearer, or HTTP Basic's password) and
checked. The strict parsing of a request's body is ``_http_body``."""

from __future__ import annotations

import base64
import hmac
import json
from typing import Any

import trio
from deskbridge_common import _codes, safe_text
from quart import Response, request

from ._errors import (
    RESTART_RETRY_AFTER_S,
    UNAVAILABLE_RETRY_AFTER_S,
    BadRequest,
    IdempotencyKeyReused,
    JobIdInUse,
    Overloaded,
    QueueFull,
    SubstrateUnavailable,
)
from ._http_body import check_media_type, parse_json_body
from ._outcome import Outcome
from ._unavailable_log import note_unavailable
from ._validate import validate_job_id

#: An answer: (HTTP status, JSON body); ``_respond`` makes it a Quart response.
Answer = tuple[int, dict[str, Any]]

#: The message of a 401 for a missing or wrong API key.
UNAUTHORIZED = "missing or wrong API key (Authorization: Bearer <key>)"

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


#: ``retry_after_s`` of a retryable refusal by its ``error.code``, when it gives none of
#: its own (``queue_full`` and ``overloaded`` do): HTTP's ``Retry-After``, MCP's
#: ``retry_after_s``. ``offline`` has none: the desktop is off, not the server busy.
RETRY_AFTER_BY_CODE = {
    _codes.UNAVAILABLE: UNAVAILABLE_RETRY_AFTER_S,
    _codes.DRAINING: RESTART_RETRY_AFTER_S,
}


def with_retry_after(error: dict[str, Any]) -> dict[str, Any]:
    """``error`` (``{"code", "message", ...}``) with the ``retry_after_s`` of its code
    (:data:`RETRY_AFTER_BY_CODE`) when it has none; unchanged otherwise."""
    seconds = RETRY_AFTER_BY_CODE.get(error.get("code"))  # type: ignore[arg-type]
    if seconds is None or "retry_after_s" in error:
        return error
    return {**error, "retry_after_s": seconds}


def draining_answer() -> Answer:
    """A replica that is shutting down refuses new work before enqueueing anything, so
    the caller can retry on another replica: 503 ``draining``, ``Retry-After: 1``."""
    message = "this hub replica is restarting; retry"
    return 503, {
        "status": "unavailable",
        "error": with_retry_after({"code": _codes.DRAINING, "message": message}),
    }


def restarting_message(job_id: str | None, *, keyed: bool = True) -> str:
    """What a caller released by a graceful restart is told (``restarting_answer``, the
    MCP tool result); ``keyed``: the call had an idempotency key (a retry with it
    attaches; without one a retry is a new job, so only the look-up is offered)."""
    if job_id is None:
        return "this hub replica restarted while the call waited; retry"
    attach = "retry with the same idempotency_key to attach to it, or " if keyed else ""
    return (
        f"this hub replica restarted while the call waited; job {job_id} may still run: "
        f"{attach}GET /v1/jobs/{job_id} (any replica answers)"
    )


def restarting_answer(job_id: str | None, stage: str, *, keyed: bool = True) -> Answer:
    """The answer to a dispatch call still waiting when its replica's grace ended
    (``_shutdown.Draining.release_calls``): 503 ``unavailable`` naming the job and the
    stage it was last known in, like an enqueued job whose outcome is unknown; a retry
    (another replica serves it) after ``RESTART_RETRY_AFTER_S``."""
    message = restarting_message(job_id, keyed=keyed)
    body: dict[str, Any] = {
        "status": "unavailable",
        "error": {
            "code": _codes.UNAVAILABLE,
            "message": message,
            "retry_after_s": RESTART_RETRY_AFTER_S,
        },
    }
    if job_id is not None:
        body = {"job_id": job_id, **body, "detail": {"stage": stage}}
    return 503, body


async def released_stage(bridge: Any, job_id: str | None) -> str:
    """The stage of a released call's job, looked up within ``STAGE_LOOKUP_S``;
    "unknown" when it cannot be told (no job, no state, Redis slow or down)."""
    from ._shutdown import STAGE_LOOKUP_S

    if job_id is None:
        return "unknown"
    with trio.move_on_after(STAGE_LOOKUP_S):
        try:
            state = await bridge.job_state(job_id)
        except Exception:  # a last look only: the answer says "unknown"
            return "unknown"
        return "unknown" if state is None else str(state.stage)
    return "unknown"


async def released_answer(
    bridge: Any, call: Any, tool: str, user_id: str, *, keyed: bool = True
) -> Answer:
    """Count and log a released call (``_shutdown.WaitingCall``) as ``unavailable``,
    look its job's stage up and give its ``restarting_answer`` (``keyed``: the call had
    an idempotency key)."""
    from . import _metrics

    _metrics.call_released(
        tool, user_id=user_id, job_id=call.job_id, elapsed_s=call.elapsed_s, known=call.tool_known
    )
    stage = await released_stage(bridge, call.job_id)
    return restarting_answer(call.job_id, stage, keyed=keyed)


def _draining() -> Response:
    return _respond(draining_answer())


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def answer_headers(answer: Answer) -> list[tuple[str, str]]:
    """The headers an answer carries besides its content type: ``Retry-After`` when its
    error says when to retry (``error.retry_after_s``: a full queue's 429, an overloaded
    process's 503, an ``unavailable`` or ``draining`` 503); ``WWW-Authenticate: Bearer``
    on a 401 (RFC 9110 15.5.2: a 401 must name the scheme; the connectors page replaces
    it with ``Basic``)."""
    headers = [("WWW-Authenticate", "Bearer")] if answer[0] == 401 else []
    error = answer[1].get("error")
    if isinstance(error, dict) and isinstance(error.get("retry_after_s"), int):
        headers.append(("Retry-After", str(error["retry_after_s"])))
    return headers


def _respond(answer: Answer) -> Response:
    response = _json(answer[1], answer[0])
    for name, value in answer_headers(answer):
        response.headers[name] = value
    return response


def error_answer(status: int, code: str, message: str, **extra: Any) -> Answer:
    """``(status, {"error": {"code", "message", **extra}})``: every error body's shape."""
    return status, {"error": {"code": code, "message": message, **extra}}


def _error(status: int, code: str, message: str, **extra: Any) -> Response:
    return _respond(error_answer(status, code, message, **extra))


#: The dispatch API's errors that have an answer of their own (``bridge_error_answer``).
BRIDGE_ERRORS = (
    SubstrateUnavailable,
    IdempotencyKeyReused,
    JobIdInUse,
    QueueFull,
    Overloaded,
    BadRequest,
)


def bridge_error_answer(
    exc: SubstrateUnavailable
    | IdempotencyKeyReused
    | JobIdInUse
    | QueueFull
    | Overloaded
    | BadRequest,
) -> Answer:
    """The answer to an error of ``BRIDGE_ERRORS``: ``SubstrateUnavailable`` -> 503
    ``unavailable`` with its ``retry_after_s`` (naming the job if it was enqueued: its
    outcome is unknown),
    ``IdempotencyKeyReused`` -> 422, ``JobIdInUse`` -> 409, ``QueueFull`` -> 429
    ``queue_full`` with its ``limit`` and ``retry_after_s`` (``Retry-After``: see
    :func:`answer_headers`), ``Overloaded`` -> 503 ``overloaded`` with its ``reason``
    and ``retry_after_s`` (``Retry-After``), ``BadRequest`` -> 400 naming the field."""
    if isinstance(exc, SubstrateUnavailable):
        note_unavailable(str(exc))
        body: dict[str, Any] = {
            "status": "unavailable",
            "error": {
                "code": _codes.UNAVAILABLE,
                "message": str(exc),
                "retry_after_s": exc.retry_after_s,
            },
        }
        if exc.job_id is not None:  # it was enqueued: its outcome is unknown
            body = {"job_id": exc.job_id, **body, "detail": {"stage": "unknown"}}
        return 503, body
    if isinstance(exc, IdempotencyKeyReused):
        return error_answer(
            422, _codes.IDEMPOTENCY_KEY_REUSED, str(exc), field="idempotency_key", job_id=exc.job_id
        )
    if isinstance(exc, JobIdInUse):
        return error_answer(409, _codes.JOB_ID_IN_USE, str(exc), field="job_id")
    if isinstance(exc, QueueFull):
        return error_answer(
            429, _codes.QUEUE_FULL, str(exc), limit=exc.limit, retry_after_s=exc.retry_after_s
        )
    if isinstance(exc, Overloaded):
        return error_answer(
            503, _codes.OVERLOADED, str(exc), reason=exc.reason, retry_after_s=exc.retry_after_s
        )
    return error_answer(400, _codes.BAD_REQUEST, str(exc), field=exc.field)


#: The largest request body on every route, bytes: 4 MiB, the MCP SDK's own default (a
#: job's args are at most ~1 MiB, ``MAX_ARGS_BYTES_LIMIT``). The app sets Quart's
#: ``MAX_CONTENT_LENGTH`` to it: /jobs and /status took 16 MiB (Quart's default) while MCP
#: refused past 4 MiB, and only MCP's 413 said the limit.
MAX_BODY_BYTES = 4 * 1024 * 1024


def body_too_large_message(limit: int, where: str) -> str:
    """The message of every 413, naming the limit: ``request bodies are limited to N
    bytes: POST /path``."""
    return f"request bodies are limited to {limit} bytes: {safe_text(where)}"


def http_error_answer(
    status: int | None,
    name: str | None,
    where: str,
    *,
    body_limit: int | None = None,
    description: str | None = None,
) -> Answer:
    """The JSON answer to an HTTP error (Werkzeug's ``HTTPException``: its ``code`` and
    ``name``) for the request ``where`` ("POST /path"), e.g. 404 ``not_found`` "Not
    Found: GET /x" (Quart's default is an HTML page). The request's path is the
    client's: capped, its control characters escaped (a decoded ``%0a`` is not echoed).
    The code is the one ``_codes.HTTP_STATUS_CODES`` lists for the status, whichever way
    in; Werkzeug's name, in snake case, only for a status it does not list. A 415 says
    its ``description`` (``_http_body.check_media_type``: the type expected and given)."""
    code = _codes.HTTP_STATUS_CODES.get(status or 500) or (
        (name or "error").lower().replace(" ", "_").replace("'", "")
    )
    if status == 413 and body_limit is not None:
        return error_answer(413, code, body_too_large_message(body_limit, where))
    if status == 415 and description:
        return error_answer(415, code, f"{description}: {safe_text(where)}")
    return error_answer(status or 500, code, f"{name}: {safe_text(where)}")


def with_chosen_job_id(answer: Answer, raw_body: bytes | None) -> Answer:
    """``answer`` naming the ``job_id`` its caller chose in ``raw_body`` (a JSON object
    whose ``job_id`` passes ``validate_job_id``) when the answer names none: a call
    refused before anything was enqueued (offline, 400, 409, 422, an ``unavailable`` or
    ``draining`` 503) echoes the caller's own id (docs/outcomes.md). It names no job.
    A body that is not such an object (unreadable, the id malformed) adds nothing, and
    neither does a 415 (the body was not read: another media type) or a 500 (an
    unexpected error: what it left behind is not known)."""
    status, body = answer
    if status in (415, 500) or body.get("job_id") is not None or not raw_body:
        return answer
    try:
        request_body = json.loads(raw_body)
        chosen = validate_job_id(request_body.get("job_id"))
    except (ValueError, RecursionError, AttributeError):
        return answer
    return status, {"job_id": chosen, **{k: v for k, v in body.items() if k != "job_id"}}


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


def unauthorized_message(header: str) -> str:
    """The message of a 401 for the ``Authorization`` header ``header``: ``UNAUTHORIZED``,
    and when the key presented is a sidecar token (a JWT: ``eyJ...``.``...``.``...``, from
    ``deskbridge-hub token``) a word that it is the other credential (a newcomer's
    mistake: the token got the same line as a typo)."""
    given = _presented_key(header)
    if given.startswith("eyJ") and given.count(".") == 2:
        return (
            f"{UNAUTHORIZED}: that is a sidecar token (deskbridge-hub token), for "
            "deskbridge-sidecar; the API takes a key of DESKBRIDGE_API_KEY"
        )
    return UNAUTHORIZED


def key_accepted(header: str, api_keys: tuple[str, ...]) -> bool:
    """Whether the ``Authorization`` header ``header`` presents one of ``api_keys``
    (always, when none is configured); compared with every key, in constant time."""
    if not api_keys:
        return True
    given = _presented_key(header)
    if not given:
        return False
    ok = False
    for key in api_keys:  # compare with every key: constant time overall
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


#: Where :func:`asgi_headers` keeps an ASGI request's headers, parsed once per request.
_HEADERS_KEY = "deskbridge.headers"


def asgi_headers(scope: dict[str, Any]) -> dict[str, str]:
    """An ASGI HTTP request's headers by lower-case name, the first of each (as
    Werkzeug's ``Headers.get``), decoded as Latin-1. Parsed once per request: kept in
    ``scope`` for the next middleware that asks (the cross-site guard, then the job
    route)."""
    headers: dict[str, str] | None = scope.get(_HEADERS_KEY)
    if headers is None:
        headers = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        scope[_HEADERS_KEY] = headers
    return headers


def _needs_key(path: str) -> bool:
    """Routes behind the API key: the dispatch API, metrics and the admin pages."""
    return path.startswith(("/v1/", "/admin")) or path == "/metrics"


async def _json_body(*, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """The current Quart request's body as a JSON object (``check_media_type``, then
    ``parse_json_body``)."""
    raw = await request.get_data(cache=True, as_text=False, parse_form_data=False)
    check_media_type(request.headers.get("Content-Type"), raw)
    return parse_json_body(raw, empty=empty)


def outcome_answer(outcome: Outcome) -> Answer:
    """A call's answer: ``{"job_id", "status", "result" | "error", "detail"?,
    "elapsed_ms"}`` with the status's HTTP code (``HTTP_STATUS``; 500 if unknown)."""
    body: dict[str, Any] = {"job_id": outcome.job_id, "status": outcome.status}
    if outcome.status == "completed":
        body["result"] = outcome.result
    else:
        body["error"] = outcome.error
        if outcome.status == "unavailable":
            note_unavailable(str((outcome.error or {}).get("message", "")))
            body["error"] = with_retry_after(outcome.error or {"code": outcome.status})
    if outcome.detail:
        body["detail"] = outcome.detail
    body["elapsed_ms"] = round(outcome.elapsed_s * 1000, 3)
    return HTTP_STATUS.get(outcome.status, 500), body


def _outcome_response(outcome: Outcome) -> Response:
    return _respond(outcome_answer(outcome))
