"""The hub's ASGI app: the sidecar WebSocket and the dispatch HTTP API (Quart-Trio).

``create_app(config, substrate=None)`` builds it; the substrate is opened in
``while_serving`` so its lifetime is the app's. Response/body helpers live in ``_http``
and ``_http_body``, the ASGI middleware (access log, request tracking) in ``_middleware``;
the sidecar WebSocket (``_sidecar_asgi``), ``POST /v1/users/{user_id}/jobs``
(``_jobs_asgi``) and MCP (``_mcp_mount``) are served as plain ASGI in front of Quart.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import trio
from deskbridge_common import _codes
from quart import Response, has_request_context, request, websocket
from quart.globals import request_ctx
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import WebsocketMismatch

from . import (
    _admin,
    _connectors,
    _cross_site,
    _gcwatch,
    _h11_errors,
    _metrics,
    _openapi,
    _tracing,
)
from ._admission import CallAdmission
from ._bridge import STATUS_TIMEOUT_S, Bridge
from ._config import MEMORY_URL, HubConfig
from ._disconnects import DisconnectWatch
from ._errors import SubstrateMisconfigured, SubstrateUnavailable, UnknownJob
from ._events import add_event_routes
from ._http import (
    BRIDGE_ERRORS,
    MAX_BODY_BYTES,
    _draining,
    _error,
    _json,
    _json_body,
    _needs_key,
    _outcome_response,
    _respond,
    bridge_error_answer,
    draining_answer,
    http_error_answer,
    key_accepted,
    outcome_answer,
    released_answer,
    unauthorized_message,
    with_chosen_job_id,
)
from ._http import HTTP_STATUS as HTTP_STATUS  # re-exported: tests import it from here
from ._http_body import _no_other_fields, _timeout_s, check_media_type, parse_job
from ._jobs_asgi import mount_jobs
from ._mcp_mount import mount_mcp
from ._middleware import _access_log, _tracking_http, _whole_last_send
from ._process import HubState
from ._progress import ProgressRelay
from ._retry import CLEANUP_TIMEOUT_S, HEALTHZ_PING_TIMEOUT_S
from ._shutdown import announce_serving, drain_on_sigterm
from ._sidecar_asgi import mount_sidecar
from ._substrate import Substrate

if TYPE_CHECKING:  # the substrates load lazily (importing the package must not import coredis)
    from ._memory import MemorySubstrate
    from ._redis import RedisSubstrate

log = logging.getLogger("deskbridge.hub")


def make_consumer_name() -> str:
    """A consumer name unique per process: host, pid and a random suffix."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _default_substrate(config: HubConfig) -> RedisSubstrate | MemorySubstrate:
    if config.redis_url and config.redis_url != MEMORY_URL:
        from ._redis import RedisSubstrate

        return RedisSubstrate.from_url(
            config.redis_url,
            max_connections=config.redis_max_connections,
            # at most every 10 s (the field's heartbeat), whatever the heartbeat
            health_interval_s=min(config.timings.heartbeat_s, 10.0),
        )
    from ._memory import MemorySubstrate

    return MemorySubstrate()


def _exit_now() -> None:
    logging.shutdown()
    os._exit(0)  # Hypercorn's supervisor replaces a worker that exits 0


def _refuse_now(group: BaseExceptionGroup[SubstrateMisconfigured]) -> None:
    """Redis refused the configuration at start (a database it does not have): one line
    on stderr and exit status 2, as for the configuration refused at import
    (``_startup``), instead of Hypercorn's lifespan traceback."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    print(f"deskbridge-hub: {first}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(2)


def create_app(
    config: HubConfig | None = None,
    substrate: Substrate | None = None,
    *,
    handle_sigterm: bool = False,
) -> QuartTrio:
    """Build the hub app.

    Args:
        config: hub configuration (default: ``HubConfig.from_env()``).
        substrate: use this substrate instead of building one from ``config`` (tests,
            the demo). It is closed when the app stops serving either way.
        handle_sigterm: on SIGTERM drain gracefully (see ``_shutdown``) and exit the
            process with status 0. Only for a process's main trio run (the ASGI entry).

    Returns:
        A QuartTrio app; ``app.extensions["deskbridge"]`` holds the ``Bridge`` and
        ``HubState`` while serving.
    """
    config = HubConfig.from_env() if config is None else config
    app = QuartTrio("deskbridge_hub")
    app.config["DESKBRIDGE"] = config
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES  # every route's, MCP's too
    holder: dict[str, Any] = {}

    @app.while_serving
    async def _lifetime():  # type: ignore[no-untyped-def]
        if substrate is not None:
            async for _ in _serve_with(substrate):
                yield
            return
        owned = _default_substrate(config)
        async with owned:  # hold pooled connections for the app's lifetime
            try:
                async for _ in _serve_with(owned):
                    yield
            except* SubstrateMisconfigured as group:
                if not handle_sigterm:  # a test or an embedder: theirs to handle
                    raise
                _refuse_now(group)  # before the connections close (no second line)

    async def _serve_with(sub: Substrate):  # type: ignore[no-untyped-def]
        state = HubState(
            substrate=sub,
            timings=config.timings,
            consumer=make_consumer_name(),
            wall_clock=time.time,
            max_inflight_per_session=config.max_inflight_per_session,
        )
        admission = CallAdmission(config.max_calls, config.shed_lag_s, trio.current_time)
        bridge = Bridge(
            sub, config.timings, max_args_bytes=config.max_args_bytes, admission=admission
        )
        relay = ProgressRelay(sub, config.timings.result_ttl_s)
        disconnects = DisconnectWatch()  # the job route's watchers (``_disconnects``)
        holder.update(state=state, bridge=bridge, progress=relay, disconnects=disconnects)
        app.extensions["deskbridge"] = holder
        if handle_sigterm:  # a served process (``asgi.py``), not a test
            app.add_background_task(drain_on_sigterm, state, config.timings.grace_s, _exit_now)
            _gcwatch.install()
        reading = trio.CancelScope()  # the process reader: one per process (``_reader``)
        await app.nursery.start(_start_in, reading, state.reader.run)
        watching = trio.CancelScope()
        await app.nursery.start(_start_in, watching, disconnects.run)
        lag_probe = trio.CancelScope()
        app.add_background_task(
            _run_in, lag_probe, _metrics.probe_loop_lag, trio.sleep, trio.current_time
        )
        relaying = trio.CancelScope()  # one scope per task: a scope enters one with-block
        app.add_background_task(_run_in, relaying, relay.run)
        admission_probe = trio.CancelScope()
        app.add_background_task(_run_in, admission_probe, admission.probe, trio.sleep)
        log.info("hub serving; consumer %s; substrate %s", state.consumer, type(sub).__name__)
        announce_serving()  # to ``serve --workers N``'s supervisor: a crash from now on
        try:
            yield
        finally:
            lag_probe.cancel()
            admission_probe.cancel()
            relaying.cancel()
            reading.cancel()
            watching.cancel()
            with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
                await sub.aclose()

    @app.before_request
    async def _check_api_key():  # type: ignore[no-untyped-def]
        if _needs_key(request.path) and not key_accepted(
            request.headers.get("Authorization", ""), config.api_keys
        ):
            message = unauthorized_message(request.headers.get("Authorization", ""))
            response = _error(401, _codes.UNAUTHORIZED, message)
            if request.path.startswith("/admin"):  # a browser asks for the key once
                response.headers["WWW-Authenticate"] = 'Basic realm="deskbridge admin"'
            return response
        return None

    async def _options() -> Response:
        """``OPTIONS`` on any route: 204 with ``Allow`` naming its methods, after the
        route's key check (Quart's own was 200 ``text/html`` with an empty body). No
        CORS headers: the hub grants no cross-origin access (docs/security.md)."""
        methods = sorted(request_ctx.url_adapter.allowed_methods())  # type: ignore[union-attr]
        response = Response(b"", status=204, headers={"Allow": ", ".join(methods)})
        del response.headers["Content-Type"]
        del response.headers["Content-Length"]  # a 204 must not have one (RFC 9110 8.6)
        return response

    app.make_default_options_response = _options  # type: ignore[method-assign]

    async def _bridge_error(exc: Any):  # type: ignore[no-untyped-def]
        """503 / 422 / 409 / 400 (``_http.bridge_error_answer``)."""
        return _respond(bridge_error_answer(exc))

    for kind in BRIDGE_ERRORS:
        app.register_error_handler(kind, _bridge_error)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException):  # type: ignore[no-untyped-def]
        """Unmatched routes, wrong methods and the like answer JSON, as every other
        error of the API does (Quart's default is an HTML page)."""
        # a WebSocket upgrade to an unknown path has no request context: reading
        # ``request`` there raised, and every attempt was a 500 with two tracebacks
        if has_request_context():
            where = f"{request.method} {request.path}"
        else:
            where = f"WebSocket {websocket.path}"
            if isinstance(exc, WebsocketMismatch):
                # an upgrade to an HTTP route (ws://hub/healthz): no WebSocket is served
                # there, as at an unknown path; Werkzeug's 400 left the sidecar without
                # its "check --hub" hint, retrying for ever
                exc = NotFound()
        limit = app.config["MAX_CONTENT_LENGTH"]
        answer = http_error_answer(
            exc.code, exc.name, where, body_limit=limit, description=exc.description
        )
        response = _respond(answer)
        allowed = getattr(exc, "valid_methods", None)
        if allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response

    @app.get("/livez")
    async def livez():  # type: ignore[no-untyped-def]
        """Liveness: the process serves HTTP (no Redis round trip). A load balancer that
        routes sidecars should check this, so a Redis outage does not take every replica
        out (sockets stay up and callers get the hub's own 503 "unavailable")."""
        state: HubState = holder["state"]
        return _json(
            {"ok": not state.drain.active, "draining": state.drain.active},
            503 if state.drain.active else 200,
        )

    @app.get("/metrics")
    async def metrics():  # type: ignore[no-untyped-def]
        """Prometheus exposition (API key required, as /v1/; docs/operations.md)."""
        await _metrics.refresh(holder["state"])
        return Response(_metrics.render(), status=200, content_type=_metrics.CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz():  # type: ignore[no-untyped-def]
        """Readiness: Redis answers PING and this replica takes calls (a draining one
        refuses every call ``503 draining``: not ready, ``draining: true``). What stops
        only an operator view (Redis commands refused to the hub's user that only the
        admin views send) is listed in ``warnings`` and keeps it ready: a balancer must
        not take a serving replica out for a dashboard grant."""
        state: HubState = holder["state"]
        try:
            with trio.fail_after(HEALTHZ_PING_TIMEOUT_S):
                await state.substrate.ping()
        except SubstrateUnavailable as exc:
            return _json({"ok": False, "substrate": "unavailable", "error": str(exc)}, 503)
        except trio.TooSlowError:
            error = f"Redis did not answer PING within {HEALTHZ_PING_TIMEOUT_S:g} s"
            return _json({"ok": False, "substrate": "unavailable", "error": error}, 503)
        if state.drain.active:
            body = {"ok": False, "substrate": "ok", "draining": True, "consumer": state.consumer}
            return _json(body, 503)
        ready: dict[str, Any] = {"ok": True, "substrate": "ok", "consumer": state.consumer}
        warnings = state.substrate.health_warnings()
        if warnings:
            ready["warnings"] = list(warnings)
        return _json(ready)

    @app.get("/v1/users/<user_id>/presence")
    async def presence(user_id: str):  # type: ignore[no-untyped-def]
        p = await holder["bridge"].presence(user_id)
        body = {"user_id": p.user_id, "online": p.online, "session_id": p.session_id}
        body["status"] = p.status  # online | offline | asleep (issue 12.6)
        if p.asleep_since is not None:
            body["since"] = p.asleep_since
        return _json(body)

    @app.post("/v1/users/<user_id>/jobs")
    async def jobs(user_id: str):  # type: ignore[no-untyped-def]
        """Served by ``_jobs_asgi`` in front of Quart, the same way; this route answers
        only what that one hands on (a request under a ``root_path``) and gives the path
        its 405 ``Allow: POST`` for other methods."""
        raw = await request.get_data(cache=True, as_text=False, parse_form_data=False)
        check_media_type(request.headers.get("Content-Type"), raw)  # 415: Quart's handler
        try:
            job = parse_job(raw)
            state: HubState = holder["state"]
            if state.drain.active:
                _metrics.call_refused_draining(job.name, user_id=user_id, job_id=job.job_id)
                return _respond(with_chosen_job_id(draining_answer(), raw))
            # werkzeug's Headers is mapping-like (case-insensitive get) but not a Mapping.
            headers = request.headers
            outcome = None
            with (
                state.drain.waiting() as call,
                _tracing.extracted(headers),  # type: ignore[arg-type]  # W3C traceparent
            ):
                outcome = await job.dispatch(holder["bridge"], user_id)
        except BRIDGE_ERRORS as exc:  # refused: the caller's own job_id, echoed
            return _respond(with_chosen_job_id(bridge_error_answer(exc), raw))
        if outcome is None:  # released: a graceful restart's grace ended meanwhile
            keyed = job.idempotency_key is not None
            answer = await released_answer(holder["bridge"], call, job.name, user_id, keyed=keyed)
            return _respond(with_chosen_job_id(answer, raw))
        return _respond(with_chosen_job_id(outcome_answer(outcome), raw))

    @app.get("/v1/users/<user_id>/tools")
    async def tools(user_id: str):  # type: ignore[no-untyped-def]
        catalogue = await holder["bridge"].tools(user_id)
        presence = await holder["bridge"].presence(user_id)
        return _json({"user_id": user_id, "online": presence.online, "tools": catalogue})

    @app.delete("/v1/jobs/<job_id>")
    async def cancel(job_id: str):  # type: ignore[no-untyped-def]
        try:
            stage = await holder["bridge"].cancel(job_id)
        except UnknownJob as exc:
            return _error(404, _codes.NOT_FOUND, str(exc))
        if stage == "finished":
            return _json({"job_id": job_id, "cancel_requested": False, "stage": stage}, 409)
        return _json({"job_id": job_id, "cancel_requested": True, "stage": stage}, 202)

    @app.post("/v1/users/<user_id>/status")
    async def status(user_id: str):  # type: ignore[no-untyped-def]
        # The body is optional (``curl -X POST``); when given it is held to the rules of
        # a job's body: a JSON object whose only field is ``timeout_s``.
        body = await _json_body(empty={})
        timeout_s = _timeout_s(body, default=STATUS_TIMEOUT_S)
        _no_other_fields(body, {"timeout_s"})
        state: HubState = holder["state"]
        if state.drain.active:  # an answer like the job route's: counted and logged
            _metrics.call_refused_draining("status", user_id=user_id, job_id=None, known=True)
            return _draining()
        outcome = await holder["bridge"].status(user_id, timeout_s=timeout_s)
        return _outcome_response(outcome)

    _admin.register(app, holder, _json)
    _connectors.register(app)

    @app.get("/openapi.json")
    async def openapi():  # type: ignore[no-untyped-def]
        """The OpenAPI document of this API (``_openapi``); no key needed."""
        from . import __version__

        return _json(_openapi.document(__version__))

    add_event_routes(app, holder)
    _h11_errors.install()  # what Hypercorn answers itself (431, 400, 501): JSON bodies
    # Innermost first: the job route is served inside the request tracking and the
    # access log, as Quart's routes are.
    app.asgi_app = _whole_last_send(app.asgi_app)  # type: ignore[method-assign]
    app.asgi_app = mount_jobs(app.asgi_app, app, holder, config)  # type: ignore[method-assign]
    app.asgi_app = _tracking_http(app.asgi_app, holder)  # type: ignore[method-assign]
    app.asgi_app = mount_sidecar(app.asgi_app, holder, config)  # type: ignore[method-assign]
    app.asgi_app = mount_mcp(app.asgi_app, app, holder, config.api_keys)  # type: ignore[method-assign]
    app.asgi_app = _cross_site.guard(app.asgi_app, config.api_keys)  # type: ignore[method-assign]
    app.asgi_app = _access_log(app.asgi_app)  # type: ignore[method-assign]
    return app


async def _start_in(
    scope: trio.CancelScope, fn: Any, *, task_status: trio.TaskStatus[None]
) -> None:
    """Run service ``fn(task_status=...)`` under ``scope`` (cancelled when the app stops
    serving); ready once ``fn`` reports started."""
    with scope:
        await fn(task_status=task_status)


async def _run_in(scope: trio.CancelScope, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)`` under ``scope`` (cancelled when the app stops serving)."""
    with scope:
        await fn(*args)
