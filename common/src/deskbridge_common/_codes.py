"""Every code the protocol uses, in one place: WebSocket close codes and job error codes.

Close codes follow RFC 6455 section 7.4.1; 4000-4999 are private use (ours below).
Job error codes are ``job_result.error.code`` on the wire and ``error.code`` in a result
payload (docs/outcomes.md). Both sides import them from here; nothing compares a bare
literal. No I/O.
"""

from __future__ import annotations

# -- WebSocket close codes ------------------------------------------------------------
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003  # a binary message: the protocol is text only
#: Never sent on the wire (RFC 6455 7.4.1): reported locally when the connection broke
#: without a close frame.
CLOSE_ABNORMAL = 1006
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_SUPERSEDED = 4001  # a newer sidecar session for the same user took over
CLOSE_PING_TIMEOUT = 4002  # the peer did not answer an application-level ping in time
CLOSE_TOKEN_EXPIRED = 4003  # the sidecar token's lifetime ended during the session

#: Longest close reason, in bytes of UTF-8: a close frame's payload is at most 125 bytes,
#: two of which are the code (RFC 6455 5.5).
MAX_CLOSE_REASON_BYTES = 123


def close_reason(text: str, limit: int = MAX_CLOSE_REASON_BYTES) -> str:
    """``text`` cut to fit a close frame: at most ``limit`` bytes of UTF-8, a cut marked
    with ``...`` (never splitting a character)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


# -- job error codes (job_result.error.code, result payload error.code) ---------------
# Sent by the sidecar:
TOOL_ERROR = "tool_error"  #: the tool raised ToolError (which may carry its own code)
UNKNOWN_TOOL = "unknown_tool"  #: no tool of that name in the sidecar's catalogue
BAD_ARGS = "bad_args"  #: args do not bind to the tool's keyword parameters
#: the tool changed (definition or configuration) since the job was checked against
#: the catalogue: the sidecar restarted meanwhile; it never started
CATALOGUE_CHANGED = "catalogue_changed"
CRASHED = "crashed"  #: the tool raised an unexpected exception (message = its repr)
BAD_RESULT = "bad_result"  #: the tool returned something that is not JSON or too big
# Sent by either side (each is also an outcome of the same name):
EXPIRED = "expired"  #: the deadline passed before the job started; it never started
CANCELLED = "cancelled"  #: cancelled (by the caller via the hub, or the sidecar stopped)
#: the key was first used for another tool or other arguments; nothing ran (issue 12)
IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
#: the job started in a sidecar process that died before it finished (its ledger has
#: the start, no outcome): it may have acted; never run again under that key
IN_DOUBT = "in_doubt"
#: the sidecar could not read or write its ledger; the tool did not start
LEDGER_ERROR = "ledger_error"
#: the person at the desktop declined a tool that needs approval; it never ran
DECLINED = "declined"
# Written by the hub:
LOST = "lost"  #: the queued entry was trimmed or deleted before it ran
MALFORMED = "malformed"  #: the stream entry does not decode into a job
BAD_JOB = "bad_job"  #: the entry decodes but no sidecar could accept it as a frame
OFFLINE = "offline"  #: no sidecar of the user is connected
UNAVAILABLE = "unavailable"  #: the substrate (Redis) cannot be used right now
#: Error codes that are also the job's outcome (every other error code means "failed").
OUTCOME_ERROR_CODES = frozenset({EXPIRED, CANCELLED, IN_DOUBT, DECLINED})

# -- request error codes (``error.code`` of a refused HTTP request) --------------------
# One condition has one code whichever way the request came in: the HTTP API (its ASGI
# fast path and its Quart routes), the admin API, the MCP endpoint, the sidecar handshake.
BAD_REQUEST = "bad_request"  #: a malformed body, path value or query value (``field``)
UNAUTHORIZED = "unauthorized"  #: a missing or wrong API key (or sidecar token)
FORBIDDEN = "forbidden"  #: a sidecar token that is valid but not accepted here
NOT_FOUND = "not_found"  #: no such route, job or user record
METHOD_NOT_ALLOWED = "method_not_allowed"  #: the route exists; ``Allow`` lists its methods
#: the request's ``Accept`` lists no type the route answers with (406: the MCP endpoint)
NOT_ACCEPTABLE = "not_acceptable"
REQUEST_TIMEOUT = "request_timeout"  #: the body did not arrive within the body timeout
#: a body over the size limit (Werkzeug's name of 413; MCP said ``payload_too_large``)
REQUEST_ENTITY_TOO_LARGE = "request_entity_too_large"
#: a JSON body route given a body whose Content-Type is present and not JSON (415)
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
UPGRADE_REQUIRED = "upgrade_required"  #: plain HTTP on the WebSocket-only /v1/sidecar
#: a per-user bound of this process is reached (the message names it; ``Retry-After``)
TOO_MANY_REQUESTS = "too_many_requests"
INTERNAL_SERVER_ERROR = "internal_server_error"  #: a bug: logged with its traceback
DRAINING = "draining"  #: this replica is restarting: nothing was enqueued, retry elsewhere
NOT_CONFIGURED = "not_configured"  #: the hub has no DESKBRIDGE_SECRET
TOKEN_NOT_YET_VALID = "token_not_yet_valid"  #: a sidecar token issued in the future
JOB_ID_IN_USE = "job_id_in_use"  #: a caller-chosen job id that names another job
#: the user already has ``DESKBRIDGE_JOBS_MAXLEN`` jobs queued or running (429, ``limit``)
QUEUE_FULL = "queue_full"
#: this hub process is past what it can answer in time (calls in flight or loop lag):
#: refused at once, nothing enqueued (503, ``retry_after_s``, ``Retry-After``)
OVERLOADED = "overloaded"
#: a browser request from another site or origin to a route behind the API key (403)
CROSS_SITE_REQUEST = "cross_site_request"
#: The code of each HTTP status whose answer is the status itself (not an outcome).
HTTP_STATUS_CODES = {
    400: BAD_REQUEST,
    401: UNAUTHORIZED,
    403: FORBIDDEN,
    404: NOT_FOUND,
    405: METHOD_NOT_ALLOWED,
    406: NOT_ACCEPTABLE,
    408: REQUEST_TIMEOUT,
    413: REQUEST_ENTITY_TOO_LARGE,
    415: UNSUPPORTED_MEDIA_TYPE,
    426: UPGRADE_REQUIRED,
    429: TOO_MANY_REQUESTS,
    500: INTERNAL_SERVER_ERROR,
}
#: Every code a refused request may carry (besides the job outcomes' codes above).
HTTP_ERROR_CODES = frozenset(
    {
        *HTTP_STATUS_CODES.values(),
        DRAINING,
        NOT_CONFIGURED,
        TOKEN_NOT_YET_VALID,
        JOB_ID_IN_USE,
        QUEUE_FULL,
        OVERLOADED,
        CROSS_SITE_REQUEST,
        IDEMPOTENCY_KEY_REUSED,
        UNAVAILABLE,
    }
)

__all__ = [
    "BAD_ARGS",
    "BAD_REQUEST",
    "CROSS_SITE_REQUEST",
    "DRAINING",
    "FORBIDDEN",
    "HTTP_ERROR_CODES",
    "HTTP_STATUS_CODES",
    "INTERNAL_SERVER_ERROR",
    "JOB_ID_IN_USE",
    "METHOD_NOT_ALLOWED",
    "NOT_ACCEPTABLE",
    "NOT_CONFIGURED",
    "OVERLOADED",
    "QUEUE_FULL",
    "TOO_MANY_REQUESTS",
    "NOT_FOUND",
    "REQUEST_ENTITY_TOO_LARGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "REQUEST_TIMEOUT",
    "TOKEN_NOT_YET_VALID",
    "UNAUTHORIZED",
    "UPGRADE_REQUIRED",
    "BAD_JOB",
    "BAD_RESULT",
    "CATALOGUE_CHANGED",
    "DECLINED",
    "IDEMPOTENCY_KEY_REUSED",
    "IN_DOUBT",
    "LEDGER_ERROR",
    "CANCELLED",
    "CLOSE_ABNORMAL",
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_INVALID_PAYLOAD",
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_NORMAL",
    "CLOSE_PING_TIMEOUT",
    "CLOSE_POLICY_VIOLATION",
    "CLOSE_PROTOCOL_ERROR",
    "CLOSE_SERVICE_RESTART",
    "CLOSE_SUPERSEDED",
    "CLOSE_TOKEN_EXPIRED",
    "CLOSE_TRY_AGAIN_LATER",
    "CLOSE_UNSUPPORTED_DATA",
    "CRASHED",
    "EXPIRED",
    "LOST",
    "MALFORMED",
    "MAX_CLOSE_REASON_BYTES",
    "OFFLINE",
    "OUTCOME_ERROR_CODES",
    "TOOL_ERROR",
    "UNAVAILABLE",
    "UNKNOWN_TOOL",
    "close_reason",
]
