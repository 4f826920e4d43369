"""``POST /v1/users/{user_id}/jobs`` served as plain ASGI, in front of Quart (issue 10).

Why not the Quart route: a call through HTTP cost 1.5-3 ms more hub CPU than the same call
through ``Bridge.call`` (``bench/compare.py``), and part of it was Quart's per-request
machinery: a request context and an app context, the ``before_request`` hook, a Werkzeug
``Headers`` copy, URL routing, error-handler lookup, ``Response`` objects, two tasks per
request, and the garbage all that leaves. Served here, a call is the API-key check, the
body, the dispatch and one JSON answer: the ASGI stack's own CPU per call, in process,
went from about 0.25 to 0.12 ms. What HTTP still adds is mostly Hypercorn (about 0.45 ms
per request with a trivial app) and the caller's half of the call (enqueue and wait, about
0.5 ms), which ``Bridge.call`` spends in the caller's process.

The answers are the route's, byte for byte (``tests/hub/test_jobs_asgi.py`` compares
them): the API key first (401), then the body (413 over Quart's ``MAX_CONTENT_LENGTH``,
by ``Content-Length`` or by what arrived; 408 after Quart's ``BODY_TIMEOUT``), its fields
(400 naming the field: ``_http_body.parse_job``), the drain (503 ``draining``), then
``Bridge.dispatch`` under the caller's W3C trace context, its outcome
(``_http.outcome_answer``) or its error (``_http.bridge_error_answer``), or, when a
graceful restart's grace ends while it waits, 503 ``unavailable`` naming the job
(``_http.released_answer``); anything else
is logged on the app's logger and answered 500, as Quart does. The call's ``timeout_s``
counts from when this handler began (``Bridge.dispatch(started_at=...)``), so the time
its body took to arrive is in it; an overloaded process refuses the call at once (503
``overloaded``, ``Bridge.admission``). A client that goes away
cancels the call, and an answer not taken within ``RESPONSE_TIMEOUT`` is dropped, as with
quart-trio. Every other request (another method, another path, a request under a
``root_path``) goes to Quart unchanged; the Quart route stays for those and for the
path's 405.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import trio
from deskbridge_common import _codes
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.sansio.utils import get_content_length

from . import _metrics, _tracing
from ._http import (
    BRIDGE_ERRORS,
    Answer,
    answer_headers,
    bridge_error_answer,
    draining_answer,
    error_answer,
    http_error_answer,
    key_accepted,
    outcome_answer,
    released_answer,
    unauthorized_message,
    with_chosen_job_id,
)
from ._http_body import JobRequest, check_media_type, parse_job

#: The route's path; the user id is one segment, as Werkzeug's default converter takes it.
_PATH = re.compile(r"/v1/users/([^/]+)/jobs\Z")


def mount_jobs(asgi_app: Any, app: Any, holder: dict[str, Any], config: Any) -> Any:
    """Wrap ``asgi_app`` so ``POST /v1/users/{user_id}/jobs`` is served here (module
    docstring).

    Args:
        asgi_app: the ASGI callable to wrap (Quart's).
        app: the Quart app: its ``config`` (``MAX_CONTENT_LENGTH`` bytes,
            ``BODY_TIMEOUT`` and ``RESPONSE_TIMEOUT`` seconds, read per request) and its
            ``logger`` (unexpected errors).
        holder: the app's holder: ``state`` (``HubState``) and ``bridge`` once serving.
        config: the ``HubConfig``: ``api_keys``.

    Returns:
        The wrapping ASGI callable.
    """

    async def jobs_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await asgi_app(scope, receive, send)
            return
        match = _PATH.match(scope["path"])
        if match is None:
            await asgi_app(scope, receive, send)
            return
        entered = trio.current_time()  # the caller's timeout_s counts from here
        headers = _headers(scope)
        if not key_accepted(headers.get("authorization", ""), config.api_keys):
            message = unauthorized_message(headers.get("authorization", ""))
            await _send(send, error_answer(401, _codes.UNAUTHORIZED, message), app.config)
            return
        answer = await _answer(receive, match.group(1), headers, f"POST {scope['path']}", entered)
        if answer is not None:  # None: the client went away
            await _send(send, answer, app.config)

    async def _answer(
        receive: Any, user_id: str, headers: dict[str, str], where: str, entered: float
    ) -> Answer | None:
        raw: bytes | None = None
        try:
            raw = await _read_body(receive, headers, app.config)
            if raw is None:
                return None
            check_media_type(headers.get("content-type"), raw)
            job = parse_job(raw)
            if holder["state"].drain.active:
                _metrics.call_refused_draining(job.name, user_id=user_id, job_id=job.job_id)
                return with_chosen_job_id(draining_answer(), raw)
        except Exception as exc:
            return with_chosen_job_id(_error_answer(exc, where), raw)
        answer: Answer | None = None
        async with trio.open_nursery() as nursery:  # quart-trio's: cancelled on disconnect
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            dispatched = await _dispatch(user_id, job, headers, where, entered)
            answer = with_chosen_job_id(dispatched, raw)
            nursery.cancel_scope.cancel()
        return answer

    async def _dispatch(
        user_id: str, job: JobRequest, headers: dict[str, str], where: str, entered: float
    ) -> Answer:
        outcome = None
        try:
            with holder["state"].drain.waiting() as call, _tracing.extracted(headers):
                outcome = await job.dispatch(holder["bridge"], user_id, started_at=entered)
        except Exception as exc:
            return _error_answer(exc, where)
        if outcome is None:  # released: the grace of a graceful restart ended meanwhile
            return await released_answer(holder["bridge"], call, job.name, user_id)
        return outcome_answer(outcome)

    def _error_answer(exc: Exception, where: str) -> Answer:
        if isinstance(exc, HTTPException):  # 413, 408
            limit = app.config["MAX_CONTENT_LENGTH"]
            return http_error_answer(
                exc.code, exc.name, where, body_limit=limit, description=exc.description
            )
        if isinstance(exc, BRIDGE_ERRORS):
            return bridge_error_answer(exc)
        # what Quart's ``handle_exception`` logs and answers
        app.logger.error(f"Exception on request {where}", exc_info=exc)
        return http_error_answer(500, "Internal Server Error", where)

    return jobs_app


def _headers(scope: Any) -> dict[str, str]:
    """The request's headers by lower-case name, the first of each (as Werkzeug's
    ``Headers.get``), decoded as Latin-1."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


async def _read_body(receive: Any, headers: dict[str, str], quart: Any) -> bytes | None:
    """The whole body, or None if the client went away first.

    Raises:
        RequestEntityTooLarge: ``Content-Length`` or the bytes received exceed
            ``MAX_CONTENT_LENGTH`` (None: no limit).
        RequestTimeout: the body took longer than ``BODY_TIMEOUT`` seconds (None: no limit).
    """
    limit = quart["MAX_CONTENT_LENGTH"]
    expected = get_content_length(headers.get("content-length"), headers.get("transfer-encoding"))
    if limit is not None and expected is not None and expected > limit:
        raise RequestEntityTooLarge()
    body = bytearray()
    with trio.move_on_after(_seconds(quart["BODY_TIMEOUT"])):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if message["type"] != "http.request":
                continue
            body += message.get("body", b"")
            if limit is not None and len(body) > limit:
                raise RequestEntityTooLarge()
            if not message.get("more_body", False):
                return bytes(body)
    raise RequestTimeout()


async def _cancel_on_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _send(send: Any, answer: Answer, quart: Any) -> None:
    """Send ``answer`` as ``application/json``, within ``RESPONSE_TIMEOUT`` seconds."""
    status, body = answer
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    headers += [(k.lower().encode(), v.encode()) for k, v in answer_headers(answer)]
    with trio.move_on_after(_seconds(quart["RESPONSE_TIMEOUT"])):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _seconds(timeout: float | None) -> float:
    return math.inf if timeout is None else timeout


__all__ = ["mount_jobs"]
