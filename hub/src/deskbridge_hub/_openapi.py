"""The OpenAPI 3.1 document of the hub's HTTP API, served at ``GET /openapi.json``.

Written once, here, from the route and body definitions in ``_app``, ``_admin``,
``_events`` and ``_connectors`` (quart-schema would generate it, but it validates through
pydantic on asyncio-first hooks and the API's bodies are parsed strictly by hand already);
``tests/hub/test_openapi.py`` fails when a route exists that the document does not
describe, or the document names a route or method the app does not serve.
"""

from __future__ import annotations

from typing import Any

from ._admin import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET
from ._bridge_jobs import MAX_TIMEOUT_S
from ._validate import JOB_ID_PATTERN, KEY_PATTERN, TOOL_NAME_PATTERN, USER_ID_PATTERN

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: Any, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _err(description: str) -> dict[str, Any]:
    return _json(_ERROR, description)


def _retry(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with the ``Retry-After`` header (seconds), as every retryable refusal
    sends it (``_http.answer_headers``)."""
    header = {
        "description": "seconds to wait before a retry (also `error.retry_after_s`): "
        "unavailable 5, draining and a call released by a restart 1, queue_full 5, "
        "overloaded 2",
        "schema": {"type": "integer", "minimum": 1},
    }
    return {**answer, "headers": {"Retry-After": header}}


def _challenge(scheme: str) -> dict[str, Any]:
    """A 401 with its ``WWW-Authenticate`` header (RFC 9110 15.5.2), which names
    ``scheme``: ``Bearer`` on the API (``_http.answer_headers``), ``Basic`` on the
    connectors page (the browser asks for the key once)."""
    header = {"description": f"`{scheme}`", "schema": {"type": "string", "const": scheme}}
    description = "missing or wrong API key" if scheme == "Bearer" else "credentials required"
    return {**_err(description), "headers": {"WWW-Authenticate": header}}


_UNAUTHORIZED = _challenge("Bearer")
_UNAUTHORIZED_PAGE = _challenge('Basic realm="deskbridge admin"')

_USER = {
    "name": "user_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": USER_ID_PATTERN},
}
_JOB = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": JOB_ID_PATTERN},
}
_OUTCOME = {"$ref": "#/components/schemas/Outcome"}
#: A refusal before anything ran (``idempotency_key_reused``, ``job_id_in_use``) shares its
#: status with outcomes but is an error body: ``{"error": ...}``, no ``status``.
_OUTCOME_OR_ERROR = {"anyOf": [_OUTCOME, _ERROR]}
_OUTCOME_CODES = {
    "200": _json(_OUTCOME, "completed"),
    "400": _err("bad request: `error.field` names the field"),
    "401": _UNAUTHORIZED,
    "409": _json(
        _OUTCOME_OR_ERROR,
        "cancelled, declined (at the desktop), in_doubt (outcomes); or the error `job_id_in_use`",
    ),
    "410": _json(_OUTCOME, "expired or lost"),
    "429": _retry(
        _err(
            "queue_full: the user already has DESKBRIDGE_JOBS_MAXLEN jobs queued or running "
        "(`error.limit`); nothing was enqueued, retry after `Retry-After` seconds "
            "(`error.retry_after_s`) with the same idempotency_key"
        )
    ),
    "422": _json(
        _OUTCOME_OR_ERROR,
        "failed (the tool's error; an outcome), or the error `idempotency_key_reused`",
    ),
    "503": _retry(
        _json(
            _OUTCOME_OR_ERROR,
            "offline (no Retry-After: the desktop is off), unavailable (Redis; or this "
            "replica restarted while the call waited: `job_id` and `detail.stage`) or "
            "draining; or the error `overloaded`: this hub process has DESKBRIDGE_MAX_CALLS "
            "calls in flight or its loop lags (`error.reason`: calls, lag); nothing was "
            "enqueued (but where a `job_id` is named), retry after `Retry-After` seconds or "
            "at another replica",
        )
    ),
    "504": _json(
        _OUTCOME,
        "timeout; `detail.stage` says what is known (`detail.may_start_within_s`: an attached "
        "retry's job may still start)",
    ),
}
#: Every route behind the API key takes it either way (``_http.key_accepted``): as a
#: bearer token, or as HTTP Basic's password (what a browser sends).
_AUTH: list[dict[str, list[str]]] = [{"bearer": []}, {"basic": []}]
#: The query parameters of a desktops page, with the bounds ``_admin`` enforces (400).
_PAGING: list[dict[str, Any]] = [
    {
        "name": "offset",
        "in": "query",
        "description": "rows to skip",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0},
    },
    {
        "name": "limit",
        "in": "query",
        "description": "rows in the page",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "default": DEFAULT_LIMIT,
        },
    },
]


def document(version: str) -> dict[str, Any]:
    """The OpenAPI document for hub ``version``: the routes below, each with the answers
    every route of its kind gives (``_with_common_answers``)."""
    return _with_common_answers(_routes(version))


def _with_common_answers(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the answers a route gives for reasons not its own, where it does not describe
    them itself: 401 (an API key is required: ``security``), 400 (a path value that is
    not a valid user id or job id, a query value out of its bounds), 408, 413 and 415 (a
    body that did not arrive within Quart's ``BODY_TIMEOUT``, over ``MAX_CONTENT_LENGTH``,
    or of another media type than JSON: ``_http_body.check_media_type``)
    and 503 (Redis unavailable: every ``/v1/`` route and the admin page's ``/admin/api/``
    reads or writes it).
    ``tests/hub/test_openapi.py`` probes each route for these and fails on a status the
    document does not list."""
    for path, ops in doc["paths"].items():
        for op in ops.values():
            answers = op["responses"]
            if op.get("security"):
                answers.setdefault("401", _UNAUTHORIZED)
            if op.get("parameters") and any(p["in"] == "path" for p in op["parameters"]):
                answers.setdefault("400", _err("a path value is not valid: `error.field` names it"))
            if any(p["in"] == "query" for p in op.get("parameters", ())):
                answers.setdefault(
                    "400", _err("a query value is out of its bounds: `error.field` names it")
                )
            if "requestBody" in op:
                answers.setdefault("408", _err("the body did not arrive within 60 s"))
                answers.setdefault("413", _err("body over the size limit"))
                answers.setdefault(
                    "415",
                    _err(
                        "a body whose Content-Type is present and not JSON "
                        "(application/json or a +json type; none is read as JSON)"
                    ),
                )
            if path.startswith(("/v1/", "/admin/api/")):
                answers.setdefault("503", _retry(_err("Redis unavailable")))
    return doc


def _routes(version: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "deskbridge hub",
            "version": version,
            "description": "Relays jobs from any backend replica to a user's desktop sidecar. "
            "Outcomes and their codes: docs/outcomes.md. Not described here: the MCP "
            "endpoint POST/GET/DELETE /v1/users/{user_id}/mcp (Streamable HTTP, served by the "
            "MCP SDK; docs/mcp.md) and the sidecar WebSocket /v1/sidecar (docs/protocol.md).",
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "DESKBRIDGE_API_KEY"},
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "any user name, DESKBRIDGE_API_KEY as the password "
                    "(browsers, /admin/)",
                },
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "job_id": {
                            "type": "string",
                            "description": "a refused call's caller-chosen job id, echoed: "
                            "it names no job of this call (after job_id_in_use: the other "
                            "job that holds it; docs/outcomes.md)",
                        },
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "field": {"type": "string"},
                                "limit": {
                                    "type": "integer",
                                    "description": "queue_full: the bound, jobs queued or "
                                    "running per user",
                                },
                                "retry_after_s": {
                                    "type": "integer",
                                    "description": "queue_full, overloaded, unavailable, "
                                    "draining, too_many_requests: as the Retry-After header",
                                },
                                "reason": {
                                    "type": "string",
                                    "enum": ["calls", "lag"],
                                    "description": "overloaded: which bound of the process "
                                    "(DESKBRIDGE_MAX_CALLS, DESKBRIDGE_SHED_LAG_S)",
                                },
                                "job_id": {
                                    "type": "string",
                                    "description": "idempotency_key_reused: the job the key "
                                    "started",
                                },
                            },
                        },
                    },
                },
                "JobRequest": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {
                            "type": "string",
                            "pattern": TOOL_NAME_PATTERN,
                            "description": "tool name",
                        },
                        "args": {"type": "object", "default": {}},
                        "idempotency_key": {"type": "string", "pattern": KEY_PATTERN},
                        "job_id": {
                            "type": "string",
                            "pattern": JOB_ID_PATTERN,
                            "description": "choose the job id (not . or ..)",
                        },
                        "timeout_s": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_TIMEOUT_S,
                        },
                    },
                },
                "StatusRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "description": "optional: an empty body is the same as `{}`",
                    "properties": {
                        "timeout_s": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_TIMEOUT_S,
                            "default": 5,
                        },
                    },
                },
                "Outcome": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {
                        "job_id": {"type": ["string", "null"]},
                        "status": {
                            "enum": [
                                "completed",
                                "failed",
                                "expired",
                                "lost",
                                "cancelled",
                                "timeout",
                                "offline",
                                "unavailable",
                                "declined",
                                "in_doubt",
                            ],
                        },  # fmt: skip
                        "result": {},
                        "error": {"type": "object"},
                        "detail": {"type": "object"},
                        "elapsed_ms": {"type": "number"},
                    },
                },
                "Desktop": {
                    "type": "object",
                    "properties": {
                        "user_id": {"type": "string"},
                        "online": {
                            "type": ["boolean", "null"],
                            "description": "as a call decides it; null: presence in doubt "
                            "(a call is answered unavailable)",
                        },
                        "status": {
                            "type": "string",
                            "enum": ["online", "offline", "asleep", "unknown"],
                            "description": "as `GET /v1/users/{user_id}/presence` says it "
                            "(`unknown` where it answers 503)",
                        },
                        "since": {"type": ["number", "null"], "description": "Unix seconds"},
                        "session_id": {"type": ["string", "null"]},
                        "sidecar_version": {"type": ["string", "null"]},
                        "tools": {"type": ["array", "null"], "items": {"type": "string"}},
                        "connected_at": {"type": ["number", "null"]},
                        "ended_at": {"type": ["number", "null"]},
                        "end": {"type": ["object", "null"]},
                        "hub_consumer": {"type": ["string", "null"]},
                        "queue": {"type": "object"},
                        "revoked": {
                            "type": ["object", "null"],
                            "description": "one user only: `{before, at}` (Unix seconds), "
                            "its tokens issued before `before` are refused "
                            "(`deskbridge-hub revoke`); null: never revoked",
                        },
                    },
                },
            },
        },
        "paths": {
            "/livez": {"get": _probe("Liveness: the process serves HTTP (no Redis round trip).")},
            "/healthz": {
                "get": _probe(
                    "Readiness: Redis is usable and the replica takes calls (503 with the "
                    "cause if not: Redis, or draining). 200 with `warnings` when only an "
                    "operator view cannot work (Redis commands refused that only it sends)."
                )
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics of this process (docs/operations.md)",
                    "security": _AUTH,
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        "401": _UNAUTHORIZED,
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
                }
            },
            "/v1/users/{user_id}/presence": {
                "get": {
                    "summary": "Is the user's desktop connected (as every replica sees it)?",
                    "security": _AUTH,
                    "parameters": [_USER],
                    "responses": {
                        "200": _json(
                            {"type": "object"},
                            "`{user_id, online, session_id, status, since?}`: status online, "
                            "offline or asleep (with since, Unix seconds)",
                        ),
                        "401": _UNAUTHORIZED,
                        "503": _err(
                            "Redis unavailable, or no presence while this hub's own writes "
                            "are in doubt (a call is answered unavailable too)"
                        ),
                    },
                }
            },
            "/v1/users/{user_id}/jobs": {
                "post": {
                    "summary": "Run a tool on the user's desktop and wait for its outcome",
                    "security": _AUTH,
                    "parameters": [
                        _USER,
                        {
                            "name": "traceparent",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                            "description": "W3C trace context, carried to the tool",
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/JobRequest"}
                            }
                        },
                    },
                    "responses": dict(_OUTCOME_CODES),
                }
            },
            "/v1/users/{user_id}/tools": {
                "get": {
                    "summary": "The tool catalogue the desktop announced",
                    "security": _AUTH,
                    "parameters": [_USER],
                    "responses": {
                        "200": _json({"type": "object"}, "`{user_id, online, tools}`"),
                        "401": _UNAUTHORIZED,
                    },
                }
            },
            "/v1/users/{user_id}/status": {
                "post": {
                    "summary": "Round trip through the desktop's status worker",
                    "security": _AUTH,
                    "parameters": [_USER],
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/StatusRequest"}
                            }
                        },
                    },
                    "responses": dict(_OUTCOME_CODES),
                }
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "summary": "One job's state",
                    "security": _AUTH,
                    "parameters": [_JOB],
                    "responses": {
                        "200": _json(
                            {"type": "object"},
                            "`{job_id, stage, user_id, at, terminal}`, `running: true` once "
                            "the desktop reported the job running (absent: delivered at most, "
                            "not known to have started), and `outcome` (the result payload, as "
                            "`POST /jobs` answers) once answered",
                        ),
                        "404": _err("unknown, or its state expired"),
                    },
                },
                "delete": {
                    "summary": "Cancel a job",
                    "security": _AUTH,
                    "parameters": [_JOB],
                    "responses": {
                        "202": _json({"type": "object"}, "cancel requested; `stage`"),
                        "404": _err("no such job"),
                        "409": _json({"type": "object"}, "already finished"),
                    },
                },
            },
            "/v1/jobs/{job_id}/events": {
                "get": {
                    "summary": "Server-sent events: the job's progress, then its outcome",
                    "security": _AUTH,
                    "parameters": [_JOB],
                    "responses": {
                        "200": {
                            "description": "event stream",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "404": _err("no such job"),
                        "429": _retry(
                            _err(
                                "the user already has MAX_EVENT_STREAMS_PER_USER event "
                                "streams open on this hub process: close one"
                            )
                        ),
                    },
                }
            },
            "/v1/admin/desktops": {
                "get": {
                    "summary": "Desktops, newest activity first (docs/operations.md)",
                    "security": _AUTH,
                    "parameters": _PAGING,
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "total": {"type": "integer"},
                                    "offset": {"type": "integer"},
                                    "limit": {"type": "integer"},
                                    "next_offset": {"type": ["integer", "null"]},
                                    "desktops": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Desktop"},
                                    },
                                },
                            },
                            "one page",
                        ),
                        "400": _err("bad offset or limit"),
                    },
                }
            },
            "/v1/admin/users/{user_id}": {
                "get": {
                    "summary": "One desktop: presence, session, catalogue, queue, in-flight jobs",
                    "security": _AUTH,
                    "parameters": [_USER],
                    "responses": {"200": _json({"$ref": "#/components/schemas/Desktop"}, "")},
                }
            },
            "/admin/api/desktops": {
                "get": {
                    **_page("Same as /v1/admin/desktops (for the page)"),
                    "parameters": _PAGING,
                },
            },
            "/admin/api/users/{user_id}": {
                "get": {
                    **_page("Same as /v1/admin/users/{user_id} (for the page)"),
                    "parameters": [_USER],
                },
            },  # fmt: skip
            "/admin": {
                "get": {
                    **_page("Redirects to /admin/"),
                    "responses": {
                        "308": {"description": "to /admin/ (`Location`)"},
                        "401": _UNAUTHORIZED_PAGE,
                    },
                }
            },
            "/admin/": {"get": _page("The connectors page (HTML)")},
            "/admin/connectors.js": {"get": _page("The connectors page's script")},
        },
    }


def _probe(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "responses": {
            "200": _json({"type": "object"}, "ok"),
            "503": _json({"type": "object"}, "not ok (draining, or Redis unusable)"),
        },
    }


def _page(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": _AUTH,
        "responses": {"200": {"description": summary}, "401": _UNAUTHORIZED_PAGE},
    }
