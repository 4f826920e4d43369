"""Mounting the MCP endpoint on the hub's ASGI app: ``/v1/users/{user_id}/mcp``.

An ASGI middleware in front of the Quart app (``app.asgi_app = mount_mcp(...)``, the
Flask/Quart middleware pattern): requests to an MCP path go to that user's
:class:`~deskbridge_hub._mcp.UserEndpoint` (the SDK's Streamable HTTP session manager,
a plain ASGI app), everything else to Quart unchanged. The endpoint is authenticated like
the rest of ``/v1/``: ``Authorization: Bearer <DESKBRIDGE_API_KEY>``.

Running the SDK under the hub's trio worker: the SDK is written against anyio, so it runs
on trio as is. What had to be adapted is only the lifetime: the SDK's session manager
wants ``async with manager.run()`` held open by one task for the app's whole life (its
task group owns the sessions); quart-trio offers that as ``app.nursery`` (the lifespan
nursery), so each user endpoint's ``run`` is started there on first use and ends when the
app stops serving.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from deskbridge_common import _codes, safe_text
from deskbridge_common import _strict_json as strict_json
from werkzeug.exceptions import HTTPException

from ._asgi_body import read_body
from ._bridge import Bridge
from ._errors import UNAVAILABLE_RETRY_AFTER_S
from ._http import asgi_headers, http_error_answer, key_accepted, unauthorized_message
from ._mcp_answers import (
    INVALID_REQUEST,
    MCP_PATH,
    PARSE_ERROR,
    error_body,
    guarded_send,
    send_body,
    unsupported_version,
    with_id,
)
from ._peer_noise import LogBudget
from ._shutdown import Draining
from ._validate import validate_user_id

if TYPE_CHECKING:
    from ._mcp import UserEndpoint

log = logging.getLogger("deskbridge.hub.mcp")

#: The ASGI scope key holding when the hub began a POST to the MCP endpoint, on
#: ``anyio.current_time()``: ``Bridge.dispatch(started_at=...)`` of its tools/call.
STARTED_AT = "deskbridge.started_at"

_PATH = MCP_PATH
#: The methods of Streamable HTTP (others: 405 ``method_not_allowed``, as on every route).
_METHODS = frozenset({"GET", "POST", "DELETE", "OPTIONS"})
#: Its ``Allow`` header (a 405, and the 204 answering ``OPTIONS``).
ALLOW = ", ".join(sorted(_METHODS))
#: An endpoint with no request for this long, seconds, and no handshake-era session
#: left (the SDK closes those after 30 minutes idle) is stopped; the next request starts
#: it again (its only state is the catalogue digest). 10 minutes.
EVICT_IDLE_S = 600.0
#: How often unused endpoints are looked for, seconds.
REAP_EVERY_S = 60.0
#: Most 2025-era sessions (``initialize``, ``Mcp-Session-Id``) one user's endpoint keeps
#: in one process; the next ``initialize`` is 429 naming this bound (the SDK's own bound,
#: set to the same, answers 503 for one that races past the check). Each session holds
#: about 40 KB for up to ``SESSION_IDLE_TIMEOUT_S`` (30 min) idle: with the SDK's default
#: of 10,000 per user, one API-key holder opening 4,000 took a process from 180 to
#: 340 MB, which every user of the process pays. An agent needs one session per
#: conversation with a desktop; the 2026 wire needs none.
MAX_SESSIONS_PER_USER = 64
#: ``Retry-After`` of that 429 (and of the one at :data:`MAX_ENDPOINTS`), seconds.
RETRY_AFTER_S = 5
#: Most user endpoints (each its own SDK server and session manager) one process keeps.
#: A request for a user with none, at the bound, stops the least recently used endpoint
#: nobody uses (no request open, no listening stream, no 2025 session alive) to make
#: room; when every one is in use it is 429 naming this bound. Why 4,096: each endpoint
#: costs about 22 KB (a real ``serve --workers 1``: 5,000 new ids took it from 103 to
#: 210 MB), so the bound holds that to ~90 MB; its catalogue watcher sleeps until a
#: request comes (it woke every 2 s, 10-15 % of a core at the bound); a stopped idle
#: endpoint costs its user only a new one (~2 ms) at the next request, so the bound
#: refuses only when 4,096 users have a call, a listening stream or a session open on
#: this very process at once. Unbounded, an API-key holder touching 100 new user ids a
#: second would have held 60,000 endpoints (~1.3 GB) for their 10 idle minutes.
MAX_ENDPOINTS = 4096


class EndpointsFull(Exception):
    """Every one of the process's :data:`MAX_ENDPOINTS` endpoints is in use (a request
    open, a listening stream, a 2025 session alive): no endpoint for a new user now."""

    def __init__(self, bound: int) -> None:
        super().__init__(f"{bound} MCP user endpoints in use")
        self.bound = bound


@attrs.define(eq=False)
class McpEndpoints:
    """Every user's MCP endpoint in this process, created on first use and stopped once
    unused for ``EVICT_IDLE_S`` (no request open, no handshake-era session left), so user
    ids that came and went (a typo, a one-off agent) cost nothing for good. At most
    :data:`MAX_ENDPOINTS` at once: a new user's endpoint takes the place of the least
    recently used one nobody uses (:meth:`using` raises :class:`EndpointsFull` when every
    one is in use).

    Args:
        get_nursery: the nursery endpoints run in (quart-trio's ``app.nursery``).
        get_bridge: the dispatch API (available while the app serves).
        is_draining: True while this replica is shutting down.
        get_drain: this process's ``Draining`` (None while not serving): a tool call
            still waiting when a graceful restart's grace ends is released and answered.
    """

    get_nursery: Callable[[], Any]
    get_bridge: Callable[[], Bridge | None]
    is_draining: Callable[[], bool]
    get_drain: Callable[[], Draining | None] = lambda: None
    _endpoints: dict[str, UserEndpoint] = attrs.field(factory=dict)
    _scopes: dict[str, anyio.CancelScope] = attrs.field(factory=dict)
    _lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    _reaping: bool = False

    @contextlib.asynccontextmanager
    async def using(self, user_id: str) -> AsyncIterator[UserEndpoint | None]:
        """The running endpoint for ``user_id`` (started if new) for one request, or None
        while the app is not serving. It is not stopped while a request uses it.

        Raises:
            EndpointsFull: ``user_id`` has no endpoint, the process holds
                :data:`MAX_ENDPOINTS` and every one is in use (raised on entry).
        """
        endpoint = self._endpoints.get(user_id)
        if endpoint is None:
            endpoint = await self._start(user_id)
        if endpoint is None:
            yield None
            return
        endpoint.request_started()  # no await since the lookup: the reaper cannot cut in
        try:
            yield endpoint
        finally:
            endpoint.request_ended(anyio.current_time())
            if self._endpoints.get(user_id) is endpoint:  # the most recently used: last
                self._endpoints[user_id] = self._endpoints.pop(user_id)

    async def _start(self, user_id: str) -> UserEndpoint | None:
        bridge = self.get_bridge()
        if bridge is None:
            return None
        async with self._lock:
            found = self._endpoints.get(user_id)
            if found is None:
                if len(self._endpoints) >= MAX_ENDPOINTS and not self._evict_one():
                    raise EndpointsFull(MAX_ENDPOINTS)
                mcp = await _mcp_module()
                found = mcp.UserEndpoint(
                    user_id, bridge, is_draining=self.is_draining, get_drain=self.get_drain
                )
                found.last_used_s = anyio.current_time()
                await self.get_nursery().start(self._run, found)
                if not self._reaping:
                    self._reaping = True
                    self.get_nursery().start_soon(self._reap)
            return found

    async def _run(self, endpoint: UserEndpoint, *, task_status: Any) -> None:
        scope = anyio.CancelScope()

        def register() -> None:
            # Only once running: ``using`` takes a registered endpoint without the lock,
            # and the SDK's manager refuses requests (500, "Task group is not
            # initialized") until its ``run`` has started (it used to be registered
            # before: concurrent first requests for a new user got that 500).
            self._endpoints[endpoint.user_id] = endpoint
            self._scopes[endpoint.user_id] = scope

        try:
            with scope:
                await endpoint.run(task_status=_OnStarted(task_status, register))
        finally:
            if self._endpoints.get(endpoint.user_id) is endpoint:  # not a successor's
                del self._endpoints[endpoint.user_id]
                del self._scopes[endpoint.user_id]
            if endpoint.open_requests == 0:  # (a request may still hold it at app stop)
                endpoint.release()  # freed by reference counting, even once frozen

    async def _reap(self) -> None:
        """Every ``REAP_EVERY_S``, stop the endpoints unused for ``EVICT_IDLE_S``."""
        try:
            while True:
                await anyio.sleep(REAP_EVERY_S)
                self.reap(anyio.current_time())
        finally:  # the app stopped serving: the next serve starts a reaper again
            self._reaping = False

    def reap(self, now_s: float) -> list[str]:
        """Stop the endpoints unused for ``EVICT_IDLE_S`` at ``now_s``; returns whose."""
        gone = [u for u, e in self._endpoints.items() if e.unused_since(now_s, EVICT_IDLE_S)]
        for user_id in gone:
            self._stop(user_id)
        if gone:
            log.debug("stopped %d unused MCP endpoints", len(gone))
        return gone

    def _evict_one(self) -> bool:
        """Stop the least recently used endpoint nobody uses (``_endpoints`` is kept in
        order of last use, oldest first); False when every one is in use."""
        victim = next((u for u, e in self._endpoints.items() if not e.in_use()), None)
        if victim is None:
            return False
        self._stop(victim)
        return True

    def _stop(self, user_id: str) -> None:
        """Forget ``user_id``'s endpoint at once and cancel its task (which ends at its
        next checkpoint; its end leaves a successor's registration alone)."""
        del self._endpoints[user_id]
        self._scopes.pop(user_id).cancel()


@attrs.define
class _OnStarted:
    """A task status that calls ``then`` just before it reports the task started."""

    task_status: Any
    then: Callable[[], None]

    def started(self, value: Any = None) -> None:
        self.then()
        self.task_status.started(value)


async def _mcp_module() -> Any:
    """``deskbridge_hub._mcp`` (and the MCP SDK), imported on the first MCP request, in a
    worker thread so the event loop keeps serving sockets meanwhile (issue 16). The SDK
    and its pydantic models are about 40 % of the hub's import time (``python -X
    importtime``: 2.6 of 6.7 s on the loaded 2-core machine; a pod's start cost about 3 s
    of CPU): a pod restarted under churn is ready sooner, and spends no CPU on MCP unless
    it is used. The first MCP request of a process waits for the import (about 1 s)."""
    name = f"{__package__}._mcp"
    module = sys.modules.get(name)
    if module is None:
        module = await anyio.to_thread.run_sync(importlib.import_module, name)
    return module


#: The WARNING about a refusal at ``MAX_ENDPOINTS``: one a minute, counting the rest.
_full_log = LogBudget(burst=0, interval_s=60.0)


def mount_mcp(
    asgi_app: Any, app: Any, holder: dict[str, Any], api_keys: tuple[str, ...]
) -> Callable[..., Any]:
    """Wrap ``asgi_app`` so ``/v1/users/{user_id}/mcp`` is served by the MCP endpoint.

    Args:
        asgi_app: the app's ASGI callable (Quart's ``app.asgi_app``).
        app: the QuartTrio app (its ``nursery`` hosts the endpoints).
        holder: the app's shared dict (``bridge`` and ``state`` while serving).
        api_keys: accepted bearer keys; empty means no authentication (loopback dev).

    Returns:
        The wrapping ASGI callable.
    """
    endpoints = McpEndpoints(
        get_nursery=lambda: app.nursery,
        get_bridge=lambda: holder.get("bridge"),
        is_draining=lambda: _draining(holder),
        get_drain=lambda: _drain_of(holder),
    )
    holder["mcp"] = endpoints

    async def mcp_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        match = _PATH.match(scope.get("path", ""))
        if match is None:
            await asgi_app(scope, receive, send)
            return
        user_id = match.group(1)
        if scope.get("method") not in _METHODS:  # the SDK's was a JSON-RPC -32600 body
            await _send_json(
                send,
                405,
                _codes.METHOD_NOT_ALLOWED,
                f"Method Not Allowed: {scope.get('method')} {safe_text(scope.get('path', ''))}",
                allow=ALLOW,
            )
            return
        if not _authorised(scope, api_keys):
            await _send_json(
                send,
                401,
                _codes.UNAUTHORIZED,
                unauthorized_message(_authorization(scope)),
            )
            return
        if scope.get("method") == "OPTIONS":  # as on every route (``_app._options``)
            await send({"type": "http.response.start", "status": 204, "headers": [
                (b"allow", ALLOW.encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            validate_user_id(user_id)
        except ValueError as exc:
            await _send_json(send, 400, _codes.BAD_REQUEST, str(exc), field="user_id")
            return
        if scope.get("method") == "POST":
            # a tools/call's timeout_s counts from here, its body read included, as an
            # HTTP call's does (``_call_tool`` reads it from the request's scope)
            scope[STARTED_AT] = anyio.current_time()
            try:  # bounded as every route's body: Quart's MAX_CONTENT_LENGTH, BODY_TIMEOUT
                raw = await read_body(receive, asgi_headers(scope), app.config)
            except HTTPException as exc:  # 413 (declared or sent), 408
                where = f"POST {scope.get('path', '')}"
                limit = app.config["MAX_CONTENT_LENGTH"]
                status, answer = http_error_answer(exc.code, exc.name, where, body_limit=limit)
                await _send_json(send, status, answer["error"]["code"], answer["error"]["message"])
                return
            if raw is None:  # the client left mid-body: nobody to answer
                return
            refusal = _content_type_refusal(scope, raw) or _refusal(raw)
            if refusal is not None:  # answered here: the SDK never sees it
                await _send_jsonrpc_error(send, *refusal)
                return
            receive = _replayed(raw, receive)
            method = _method(raw)
            drain = _drain_of(holder)
            if drain is not None and method == "tools/call":
                # counted like an HTTP dispatch request: a graceful shutdown gives it the
                # grace, then waits (bounded) for its answer to be written
                with drain.tracking_request():
                    await _serve(endpoints, user_id, scope, receive, send, raw)
                return
            await _serve(
                endpoints, user_id, scope, receive, send, raw, initialize=method == "initialize"
            )
            return
        if scope.get("method") == "GET":
            # No event store, so no SSE event ids were ever sent and nothing can be
            # replayed: a Last-Event-ID is a plain GET (the SDK left it unanswered: 500)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"last-event-id"]
        await _serve(endpoints, user_id, scope, receive, send)

    return mcp_app


async def _serve(
    endpoints: McpEndpoints,
    user_id: str,
    scope: Any,
    receive: Any,
    send: Any,
    raw: bytes | None = None,
    *,
    initialize: bool = False,
) -> None:
    """Hand the request to the user's endpoint, or answer 503 (not serving yet) or 429
    (``initialize`` past the user's sessions; every endpoint of the process in use)
    naming the id of the POST body ``raw``: parsed only then, not on every call's path."""
    try:
        async with endpoints.using(user_id) as endpoint:
            await _serve_with(endpoint, user_id, scope, receive, send, raw, initialize)
    except EndpointsFull as exc:
        await _send_json(
            send,
            429,
            _codes.TOO_MANY_REQUESTS,
            f"this hub process already has {exc.bound} MCP user endpoints, each in use (a "
            "request, a listening stream or a 2025 session open) (MAX_ENDPOINTS): retry "
            "later (another replica may serve it), or end idle 2025 sessions (DELETE)",
            request_id=_id_of(raw),
            retry_after_s=RETRY_AFTER_S,
        )
        quiet = _full_log.admit(anyio.current_time())
        if quiet is not None:
            more = f" ({quiet} more since the last line)" if quiet else ""
            log.warning(
                "MCP endpoints full: %d in use; a new user's request answered 429%s",
                exc.bound,
                more,
            )


def _id_of(raw: bytes | None) -> str | int | None:
    return None if raw is None else _request_id(raw)


async def _serve_with(
    endpoint: UserEndpoint | None,
    user_id: str,
    scope: Any,
    receive: Any,
    send: Any,
    raw: bytes | None,
    initialize: bool,
) -> None:
    """One request on ``endpoint`` (None: the app is not serving yet, 503)."""
    if endpoint is None:
        await _send_json(
            send,
            503,
            _codes.UNAVAILABLE,
            "the hub is not serving yet",
            request_id=_id_of(raw),
            retry_after_s=UNAVAILABLE_RETRY_AFTER_S,
        )
        return
    if initialize and endpoint.sessions_open() >= MAX_SESSIONS_PER_USER and _opens_session(scope):
        await _send_json(
            send,
            429,
            _codes.TOO_MANY_REQUESTS,
            f"user {user_id!r} already has {MAX_SESSIONS_PER_USER} MCP sessions open on "
            "this hub process (MAX_SESSIONS_PER_USER): end one (DELETE with its "
            "Mcp-Session-Id), let one idle out, or use the 2026 wire (no session)",
            request_id=_id_of(raw),
            retry_after_s=RETRY_AFTER_S,
        )
        return
    from mcp_types.version import KNOWN_PROTOCOL_VERSIONS  # loaded with the endpoint

    refused = unsupported_version(scope, KNOWN_PROTOCOL_VERSIONS)
    if refused is not None:
        await send_body(send, 400, with_id(refused, _id_of(raw)))
        return
    async with endpoint.sessions.serving(scope, raw) as refusal:  # shared sessions
        if refusal is not None:
            status, code, message = refusal
            retry = RETRY_AFTER_S if status == 429 else None
            await _send_json(
                send, status, code, message, request_id=_id_of(raw), retry_after_s=retry
            )
            return
        await endpoint.manager.handle_request(scope, receive, guarded_send(send, scope))


def _opens_session(scope: Any) -> bool:
    """True for a request that would open a 2025-era session: a POST with no
    ``Mcp-Session-Id`` and no 2026 ``Mcp-Protocol-Version`` (the SDK's own test of which
    wire a request speaks) whose body the caller found to be ``initialize``."""
    headers = dict(scope.get("headers", []))
    if scope.get("method") != "POST" or b"mcp-session-id" in headers:
        return False
    version = headers.get(b"mcp-protocol-version")
    if version is None:
        return True
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS  # loaded with the SDK

    return version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS


def _request_id(raw: bytes) -> str | int | None:
    """The ``id`` of the JSON-RPC request in a POST body, if it has a valid one (a
    string or an integer), else None."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    rid = value.get("id") if isinstance(value, dict) else None
    return None if isinstance(rid, bool) or not isinstance(rid, str | int) else rid


def _method(raw: bytes) -> str | None:
    """The ``method`` of a POST body (``initialize`` opens a 2025 session, ``tools/call``
    is a dispatch call), or None: one parse for both questions."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    method = value.get("method") if isinstance(value, dict) else None
    return method if isinstance(method, str) else None


def _replayed(raw: bytes, receive: Any) -> Callable[[], Awaitable[Any]]:
    """A ``receive`` that hands the SDK the body read already, then the client's own."""
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def replay() -> Any:
        return pending.pop() if pending else await receive()

    return replay


def _refusal(raw: bytes) -> tuple[int, str, str | int | None] | None:
    """The JSON-RPC error (code, message, id) a POST body gets before the SDK sees it, or
    None to hand it on:

    - an object holding a key twice: ``-32700`` (the SDK's parser would keep the last
      value: a ``name`` or an argument chosen by position; the HTTP API refuses it);
    - JSON that is not one JSON-RPC message (:func:`_not_a_message`): ``-32600``
      Invalid Request (the SDK said ``-32602`` with a pydantic dump, or took a request
      with a null, boolean or fractional id for a notification and never answered).

    Malformed JSON is the SDK's to answer (``-32700``)."""
    try:
        value = strict_json.loads(raw, parse_float=float, parse_constant=float)
    except strict_json.DuplicateKey as exc:
        return PARSE_ERROR, f"Parse error: {exc}", None
    except (ValueError, RecursionError):
        return None
    why = _not_a_message(value)
    if why is None:
        return None
    rid = value.get("id") if isinstance(value, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        rid = None
    return INVALID_REQUEST, f"Invalid Request: {why}", rid


def _content_type_refusal(scope: Any, raw: bytes) -> tuple[int, str, str | int | None] | None:
    """``-32600`` for a POST whose ``Content-Type`` is not JSON, or None. The SDK's answer
    was ``400 Invalid Content-Type header`` as text/plain (curl's default type is a
    form's): the hub's one answer that was not JSON, which an MCP client could not read.

    JSON is the media type ``application/json`` in any case, with any parameters (RFC
    9110 8.3.1, as the HTTP routes read it); the header is then rewritten in ``scope`` to
    the lower-case form the SDK compares with. This check took any type *starting* with
    ``application/json`` (``application/jsonx``) and left ``Application/JSON`` as sent:
    the SDK refused both ``415`` with ``id: null``, a second answer for one condition."""
    headers = scope.get("headers", [])
    header = next((v for k, v in headers if k == b"content-type"), b"")
    given = header.decode("latin-1")
    if given.split(";", 1)[0].strip().lower() == "application/json":
        scope["headers"] = [(k, v) for k, v in headers if k != b"content-type"]
        scope["headers"].append((b"content-type", b"application/json"))
        return None
    rid = _request_id(raw)
    shown = safe_text(given) if given else "none"
    message = f"Invalid Request: Content-Type must be application/json (got {shown})"
    return INVALID_REQUEST, message, rid


def _not_a_message(value: Any) -> str | None:
    """Why ``value`` is not one JSON-RPC 2.0 message as MCP has them (a request, a
    notification, or a response to the server's request), or None if it is one."""
    if isinstance(value, list):
        return "a batch (JSON array) is not supported; send one message per POST"
    if not isinstance(value, dict):
        return "the body must be a JSON-RPC message (a JSON object)"
    if value.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if "id" in value and (isinstance(value["id"], bool) or not isinstance(value["id"], str | int)):
        return "id must be a string or an integer (MCP: never null)"
    if "method" in value:
        return None if isinstance(value["method"], str) else "method must be a string"
    if "id" in value and ("result" in value or "error" in value):
        return None  # a response to a request the server sent
    return "method is missing (and it is not a response)"


async def _send_jsonrpc_error(
    send: Any, code: int, message: str, request_id: str | int | None = None
) -> None:
    """A JSON-RPC error for a request the SDK never saw, HTTP 400 (``id`` null unless
    the request had a valid one)."""
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    body = json.dumps(error).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _drain_of(holder: dict[str, Any]) -> Draining | None:
    state = holder.get("state")
    return None if state is None else state.drain


def _draining(holder: dict[str, Any]) -> bool:
    state = holder.get("state")
    return state is not None and bool(state.drain.active)


def _authorised(scope: Any, api_keys: tuple[str, ...]) -> bool:
    """The API key as every /v1 route takes it (``_http.key_accepted``): bearer, or
    HTTP Basic's password (Basic was refused here only)."""
    return key_accepted(_authorization(scope), api_keys)


def _authorization(scope: Any) -> str:
    header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
    return str(header.decode("latin-1"))


async def _send_json(
    send: Any,
    status: int,
    code: str,
    message: str,
    *,
    allow: str | None = None,
    request_id: str | int | None = None,
    retry_after_s: int | None = None,
    **extra: Any,
) -> None:
    """The hub's own refusal of an MCP request (before the SDK sees it), HTTP
    ``status``: a JSON-RPC error response, as the Streamable HTTP transport has them
    (the SDK's server answers its own refusals so; its client reads only such a body
    and reported anything else as ``-32603`` "Server returned an error response",
    hiding the reason). ``id``: ``request_id`` when the body was read and had one, else
    null (the client puts its request's id on it). ``error.message`` is
    ``"<code>: <message>"``; ``error.data`` holds what the HTTP API's error body holds
    (``code``, e.g. ``unauthorized``, and ``field``, ``retry_after_s``...). A 401 keeps
    its ``WWW-Authenticate``, a 405 its ``Allow``, a retryable refusal its
    ``Retry-After``."""
    headers = []
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after_s is not None:  # the header, and in ``data`` as HTTP's body has it
        headers.append((b"retry-after", str(retry_after_s).encode()))
        extra["retry_after_s"] = retry_after_s
    await send_body(send, status, error_body(status, code, message, request_id, **extra), headers)


__all__ = ["STARTED_AT", "McpEndpoints", "mount_mcp"]
