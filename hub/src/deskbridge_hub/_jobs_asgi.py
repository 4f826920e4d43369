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
cancels the call, as with quart-trio, but noticed within ``WATCH_AFTER_S`` (0.25 s): the
process's ``DisconnectWatch`` (``_disconnects``) starts a call's watcher only once it has
waited that long, so most calls start no task. An answer not taken within
``RESPONSE_TIMEOUT`` is dropped, as with quart-trio. Every other request (another
method, another path, a request under a ``root_path``) goes to Quart unchanged; the
Quart route stays for those and for the path's 405.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import trio
from deskbridge_common import _codes
from werkzeug.exceptions import HTTPException

from . import _metrics, _tracing
from ._asgi_body import read_body
from ._http import (
    BRIDGE_ERRORS,
    Answer,
    answer_headers,
    asgi_headers,
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
        holder: the app's holder: ``state`` (``HubState``), ``bridge`` and
            ``disconnects`` (``DisconnectWatch``) once serving.
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
        headers = asgi_headers(scope)
        if not key_accepted(headers.get("authorization", ""), config.api_keys):
            message = unauthorized_message(headers.get("authorization", ""))
            await _send(send, error_answer(401, _codes.UNAUTHORIZED, message), app.config)
            return
        await _serve(receive, send, match.group(1), headers, f"POST {scope['path']}", entered)

    async def _serve(
        receive: Any, send: Any, user_id: str, headers: dict[str, str], where: str, entered: float
    ) -> None:
        raw: bytes | None = None
        try:
            raw = await read_body(receive, headers, app.config)
            if raw is None:
                return  # the client went away
            check_media_type(headers.get("content-type"), raw)
            job = parse_job(raw)
            if holder["state"].drain.active:
                _metrics.call_refused_draining(job.name, user_id=user_id, job_id=job.job_id)
                answer: Answer | None = draining_answer()
            else:
                answer = None
        except Exception as exc:
            answer = _error_answer(exc, where)
        if answer is not None:
            await _send(send, with_chosen_job_id(answer, raw), app.config)
            return
        drain = holder["state"].drain
        watch = None
        sent = False
        try:
            # cancelled when a graceful restart's grace ends (``call.released``) or, by
            # the disconnect watch, when the client goes away (as quart-trio does)
            with drain.waiting() as call:
                watch = holder["disconnects"].watch(receive, call.scope)
                answer = await _dispatch(user_id, job, headers, where, entered)
            watch.answered()
            if answer is None:
                if not call.released:
                    return  # the client went away
                answer = await released_answer(
                    holder["bridge"], call, job.name, user_id, keyed=job.idempotency_key is not None
                )
            sent = await _send(send, with_chosen_job_id(answer, raw), app.config)
        finally:
            if watch is not None:
                watch.release(sent=sent)

    async def _dispatch(
        user_id: str, job: JobRequest, headers: dict[str, str], where: str, entered: float
    ) -> Answer:
        try:
            with _tracing.extracted(headers):
                outcome = await job.dispatch(holder["bridge"], user_id, started_at=entered)
        except Exception as exc:
            return _error_answer(exc, where)
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


async def _send(send: Any, answer: Answer, quart: Any) -> bool:
    """Send ``answer`` as ``application/json``, within ``RESPONSE_TIMEOUT`` seconds.

    Returns:
        Whether it was sent (False: given up after ``RESPONSE_TIMEOUT``).
    """
    status, body = answer
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    headers += [(k.lower().encode(), v.encode()) for k, v in answer_headers(answer)]
    with trio.move_on_after(_seconds(quart["RESPONSE_TIMEOUT"])):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        return True
    return False


def _seconds(timeout: float | None) -> float:
    return math.inf if timeout is None else timeout


__all__ = ["mount_jobs"]
