"""The MCP endpoint: one Model Context Protocol server per user, at
``/v1/users/{user_id}/mcp`` (Streamable HTTP), built on the official ``mcp`` SDK.

What an agent sees: ``tools/list`` is the user's desktop catalogue (as the sidecar
announced it in its last ``hello``), each tool's ``inputSchema`` its ``args_schema`` and
its annotations derived from the tool's ``side_effects`` declaration; ``tools/call``
dispatches through :meth:`Bridge.dispatch`, exactly as ``POST /v1/users/{id}/jobs`` does.
Outcomes map as follows:

- ``completed`` -> a result: the JSON value as text, and as ``structuredContent``
  (an object as is, anything else as ``{"result": value}``);
- ``failed`` / ``offline`` / ``timeout`` / ``expired`` / ``lost`` / ``cancelled`` /
  ``unavailable`` -> a result with ``isError: true`` whose text starts with the status and
  whose ``structuredContent`` is ``{"status", "error", "job_id"}`` (the model sees it and
  can react: retry later, tell the user to open the laptop);
- args the hub refuses (they fail the tool's schema, are over ``max_args_bytes`` or are
  not JSON-able) -> a result with ``isError: true``, status and error code
  ``bad_request`` and ``error.field`` ``args``: HTTP's 400 for the same ``args``, the
  same code and field (the 2025-11-25 spec: input validation errors are tool execution
  errors, so the model can correct itself); nothing was enqueued, nothing ran (so not
  ``failed``, which says the tool ran);
- anything else the hub refuses before enqueueing (unknown tool, bad ``_meta``) -> the
  JSON-RPC error ``-32602`` naming the field, ``data: {"code": "bad_request", "field"}``
  (the spec: an unknown tool is a protocol error);
- a full queue (HTTP's 429 ``queue_full``: the user already has ``jobs_maxlen`` jobs
  queued or running) -> the JSON-RPC error ``-32603``, as the MCP mount's own 429s,
  ``data: {"code": "queue_full", "limit", "retry_after_s"}``;
- an overloaded process (HTTP's 503 ``overloaded``: this process has its bound of calls
  in flight, or its loop lags past its bound; nothing was enqueued) -> the JSON-RPC error
  ``-32603`` likewise, ``data: {"code": "overloaded", "reason", "retry_after_s"}``.

Progress: a ``tools/call`` carrying a ``progressToken`` gets ``notifications/progress``
for the tool's progress reports (``Bridge.dispatch(on_progress=...)``), leaving out a
report whose ``progress`` does not exceed the last one sent (the spec: it MUST increase
with each notification).

Cancellation: when the SDK cancels a ``tools/call`` handler (``notifications/cancelled``
on the 2025 wire, the client abandoning the request stream on the 2026 wire) the job is
cancelled through :meth:`Bridge.withdraw` (as ``DELETE /v1/jobs/{job_id}`` would, and also
when its enqueue was sent but had not landed yet), unless the call carried
``deskbridge/idempotency_key``: another caller with that key may be attached to the job,
and keeps it.

Catalogue changes: a watcher per user endpoint re-reads the catalogue every
``CATALOGUE_POLL_S`` while someone can hear a change (it sleeps, without waking, until a
request comes otherwise) and, when it differs, sends ``notifications/tools/list_changed`` to
every handshake-era session that has made a request, and publishes ``ToolsListChanged``
to ``subscriptions/listen`` streams (2026 wire).

Why one SDK server per user: a session belongs to the endpoint (the URL) it was opened
on, so a session id minted for one user can never be replayed against another's URL, and
change notifications go to exactly that user's sessions. Endpoints are created on first
use and stopped once unused (``_mcp_mount.McpEndpoints``: after 10 idle minutes, or
sooner to make room at ``MAX_ENDPOINTS`` per process).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import attrs
import mcp_types as types
from deskbridge_common import _codes
from mcp.server import NotificationOptions, Server
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from . import _metrics
from ._bridge import Bridge
from ._errors import (
    BadRequest,
    IdempotencyKeyReused,
    JobIdInUse,
    Overloaded,
    QueueFull,
    SubstrateUnavailable,
)
from ._http import bridge_error_answer, released_answer, with_retry_after
from ._http_body import string_option, timeout_option
from ._mcp_mount import MAX_SESSIONS_PER_USER, STARTED_AT
from ._mcp_params import name_invalid_params
from ._mcp_sessions import (
    SESSION_IDLE_TIMEOUT_S,
    SessionSharing,
    SharedSessionManager,
    session_of,
    withdraw_job,
)
from ._outcome import Outcome
from ._progress import ProgressReport
from ._shutdown import Draining, WaitingCall
from ._unavailable_log import note_unavailable

log = logging.getLogger("deskbridge.hub.mcp")

#: How often a user endpoint re-reads the catalogue to notice a change, seconds. The
#: holder's heartbeat rewrites it every 10 s (heartbeat interval), a new hello at once.
CATALOGUE_POLL_S = 2.0
#: How long one session may take to accept a ``list_changed`` notification, seconds.
NOTIFY_TIMEOUT_S = 5.0
#: ``_meta`` keys a ``tools/call`` may carry.
META_IDEMPOTENCY_KEY = "deskbridge/idempotency_key"
META_TIMEOUT_S = "deskbridge/timeout_s"
#: HTTP's body fields that MCP takes in ``_meta``, as MCP's refusals name them.
_META_FIELDS = {
    "idempotency_key": f"_meta.{META_IDEMPOTENCY_KEY}",
    "timeout_s": f"_meta.{META_TIMEOUT_S}",
}
#: ``_meta`` key of a listed tool that needs the person's approval (seconds; 0: always).
META_APPROVAL_AFTER_WAIT_S = "deskbridge/approval_after_wait_s"


def tool_entry(spec: dict[str, Any]) -> types.Tool:
    """An MCP ``Tool`` for one catalogue entry (``name``, ``description``,
    ``args_schema``, ``side_effects``, ``approval_after_wait_s``).

    A tool that needs the person's approval says so at the end of its description (the
    model reads it: the call may wait, or come back ``declined``) and in ``_meta``
    (``deskbridge/approval_after_wait_s``).

    ``side_effects: false`` -> ``readOnlyHint: true`` (and idempotent); ``true`` ->
    ``readOnlyHint: false, destructiveHint: true, idempotentHint: false``.

    Raises:
        ValueError: the ``args_schema`` cannot be an MCP ``inputSchema``
            (:func:`object_schema`).
    """
    side_effects = bool(spec.get("side_effects"))
    schema = object_schema(spec.get("args_schema") or {"type": "object"})
    if schema is None:
        raise ValueError(f"tool {spec['name']!r}: args_schema cannot be met by an object")
    description = spec.get("description") or None
    approval = spec.get("approval_after_wait_s")
    meta = None
    if isinstance(approval, int | float) and not isinstance(approval, bool):
        when = "" if approval == 0 else f" when the call waited {approval:g} s or more"
        note = f"Needs the approval of the person at the desktop before it runs{when}."
        description = f"{description} {note}" if description else note
        meta = {META_APPROVAL_AFTER_WAIT_S: approval}
    return types.Tool(
        name=spec["name"],
        description=description,
        input_schema=schema,
        _meta=meta,
        annotations=types.ToolAnnotations(
            read_only_hint=not side_effects,
            destructive_hint=side_effects,
            idempotent_hint=not side_effects,
            open_world_hint=True,
        ),
    )


def object_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` as an MCP ``inputSchema``, whose ``type`` is ``"object"``: no ``type``
    -> ``"object"`` added; a list of types holding ``"object"`` -> narrowed to it (the
    ``arguments`` of a call are always an object); any other ``type`` -> None (no call
    can meet it: HTTP refuses every call's ``args`` too)."""
    kind = schema.get("type")
    if kind == "object":
        return schema
    if kind is None or (isinstance(kind, list) and "object" in kind):
        return {**schema, "type": "object"}
    return None


def outcome_result(outcome: Outcome) -> types.CallToolResult:
    """The MCP result for a terminal :class:`Outcome` (see the module docstring)."""
    if outcome.status == "completed":
        value = outcome.result
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(value))],
            structured_content=value if isinstance(value, dict) else {"result": value},
        )
    error = outcome.error or {"code": outcome.status, "message": outcome.status}
    if outcome.status == "unavailable":
        note_unavailable(str(error.get("message")))
        error = with_retry_after(error)  # as HTTP's Retry-After
    text = f"{outcome.status}: {error.get('code')}: {error.get('message')}"
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content={
            "status": outcome.status,
            "error": error,
            "job_id": outcome.job_id,
            **({"detail": outcome.detail} if outcome.detail else {}),
        },
        is_error=True,
    )


def _error_result(status: str, code: str, message: str) -> types.CallToolResult:
    return outcome_result(
        Outcome(job_id=None, status=status, error={"code": code, "message": message})
    )


async def released_result(
    bridge: Bridge, call: WaitingCall, tool: str, user_id: str, *, keyed: bool
) -> types.CallToolResult:
    """A tool call still waiting when a graceful restart's grace ended: the HTTP API's
    ``restarting_answer`` (503 ``unavailable`` naming the job and its stage) as a result
    with ``isError: true``, counted and logged once as ``unavailable`` (``keyed``: the
    call had an idempotency key)."""
    _, body = await released_answer(bridge, call, tool, user_id, keyed=keyed)
    return outcome_result(
        Outcome(
            job_id=body.get("job_id"),
            status="unavailable",
            error=body["error"],
            detail=body.get("detail") or {},
        )
    )


def _invalid_params(exc: BadRequest) -> MCPError:
    """JSON-RPC's invalid params for a hub refusal other than the args: the field as MCP
    spells it (``_meta.deskbridge/timeout_s`` for HTTP's ``timeout_s``), HTTP's code and
    field as ``data``. A malformed ``_meta`` value had no ``data`` (docs/mcp.md)."""
    field = _META_FIELDS.get(exc.field or "", exc.field)
    return MCPError(
        types.INVALID_PARAMS,
        f"{field}: {exc}",
        data={"code": _codes.BAD_REQUEST, "field": field},
    )


def bad_args_result(exc: BadRequest) -> types.CallToolResult:
    """``args`` the hub refused before enqueueing (``BadRequest`` with ``field`` ``args``):
    HTTP answers the same args 400 ``bad_request`` naming ``args``; MCP reports it as a
    tool execution error (``isError: true``) with the same status, code and field, so the
    model reads it and corrects its arguments. Nothing was enqueued: no ``job_id``."""
    return outcome_result(
        Outcome(
            job_id=None,
            status=_codes.BAD_REQUEST,
            error={"code": _codes.BAD_REQUEST, "message": str(exc), "field": exc.field},
        )
    )


def unavailable_result(exc: SubstrateUnavailable) -> types.CallToolResult:
    """Redis unavailable: the short answer, or, raised while waiting for a job it had
    enqueued, that job (its outcome unknown), as the HTTP API answers (docs/outcomes.md)."""
    detail = {"stage": "unknown"} if exc.job_id is not None else {}
    return outcome_result(
        Outcome(
            job_id=exc.job_id,
            status="unavailable",
            error={"code": "unavailable", "message": str(exc)},
            detail=detail,
        )
    )


def _digest(catalogue: list[dict[str, Any]] | None) -> str:
    return json.dumps(catalogue or [], sort_keys=True)


@attrs.define(eq=False)
class UserEndpoint:
    """The MCP server, its Streamable HTTP session manager and its catalogue watcher
    for one user.

    Args:
        user_id: whose desktop.
        bridge: dispatch API.
        is_draining: True while the replica is shutting down (calls are refused then).
        get_drain: the process's ``Draining`` (None: not serving): a call still waiting
            when a graceful restart's grace ends is released and answered
            ``released_result``.
        poll_s: catalogue poll interval, seconds.
    """

    user_id: str
    bridge: Bridge
    is_draining: Callable[[], bool] = lambda: False
    get_drain: Callable[[], Draining | None] = lambda: None
    poll_s: float = CATALOGUE_POLL_S
    server: Server[Any] = attrs.field(init=False)
    manager: SharedSessionManager = attrs.field(init=False)
    sessions: SessionSharing = attrs.field(init=False)
    bus: InMemorySubscriptionBus = attrs.field(init=False, factory=InMemorySubscriptionBus)
    _connections: weakref.WeakSet[Connection] = attrs.field(init=False, factory=weakref.WeakSet)
    _digest: str | None = attrs.field(init=False, default=None)
    #: HTTP requests being served now (a listening stream stays open), and when the last
    #: one ended (trio clock, seconds): kept by ``_mcp_mount``.
    open_requests: int = attrs.field(init=False, default=0)
    last_used_s: float = attrs.field(init=False, default=0.0)
    #: Set by :meth:`request_started`: the watcher, idle while nobody listens, waits on it.
    _listener_came: anyio.Event = attrs.field(init=False, factory=anyio.Event)

    def request_started(self) -> None:
        """Count one more open HTTP request (``_mcp_mount``; :meth:`request_ended` ends
        it) and wake the catalogue watcher if it waits for a listener."""
        self.open_requests += 1
        self._listener_came.set()

    def request_ended(self, now_s: float) -> None:
        """Count one open HTTP request less; ``now_s`` (trio clock, seconds) is when."""
        self.open_requests -= 1
        self.last_used_s = now_s

    def sessions_open(self) -> int:
        """How many 2025-era sessions this endpoint holds (the SDK's session table)."""
        return len(getattr(self.manager, "_server_instances", ()))

    def in_use(self) -> bool:
        """Stopping this endpoint would cut someone off: a request is open (a call, a
        listening stream) or a handshake-era session is alive. The SDK's session table
        says which are alive (from ``initialize`` to ``DELETE``, idle timeout or crash);
        ``_connections`` does not: a session's ``Connection`` outlives it in the weak set
        until the garbage collector breaks its reference cycles, which kept an endpoint
        whose sessions had all ended from being stopped."""
        return self.open_requests > 0 or self.sessions_open() > 0

    def unused_since(self, now_s: float, idle_s: float) -> bool:
        """True when not :meth:`in_use` and the last request ended ``idle_s`` seconds or
        more before ``now_s``."""
        return not self.in_use() and now_s - self.last_used_s >= idle_s

    def listened_to(self) -> bool:
        """Someone could hear a change: a request is open (a ``subscriptions/listen``
        stream, a standalone GET stream) or a handshake-era session is alive."""
        return self.open_requests > 0 or bool(self._connections)

    def __attrs_post_init__(self) -> None:
        self.server = Server(
            f"deskbridge:{self.user_id}",
            version="1",
            instructions=(
                f"Tools on the desktop of user {self.user_id}, run by its deskbridge sidecar. "
                "A call to an offline desktop fails at once with status 'offline'."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        self.server.middleware.append(self._remember_session)
        self.server.middleware.append(name_invalid_params)  # -32602 naming the field
        # The session manager builds the InitializeResult without NotificationOptions, which
        # would advertise tools.listChanged false although _watch_catalogue sends
        # notifications/tools/list_changed: say so, so clients know to listen.
        self.server.create_initialization_options = functools.partial(  # type: ignore[method-assign]
            self.server.create_initialization_options, NotificationOptions(tools_changed=True)
        )
        self.manager = SharedSessionManager(
            app=self.server,
            session_idle_timeout=SESSION_IDLE_TIMEOUT_S,
            max_sessions=MAX_SESSIONS_PER_USER,
        )
        self.sessions = SessionSharing(
            self.user_id, self.manager, self.bridge, MAX_SESSIONS_PER_USER
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled: the SDK's session manager, the catalogue watcher and
        the refresh of the shared records of sessions with a request open.

        Cancellation: ends every MCP session of this user (the SDK closes its streams).
        """
        async with self.manager.run(), anyio.create_task_group() as tg:
            tg.start_soon(self._watch_catalogue)
            tg.start_soon(self.sessions.keep_alive)
            task_status.started()
            await anyio.sleep_forever()

    def release(self) -> None:
        """Drop what the SDK objects hold, once :meth:`run` has ended: an endpoint is a
        web of reference cycles (handlers bound to the server and to this endpoint, the
        manager's ASGI app bound to the manager), which only the cycle collector frees,
        and a serving hub freezes what survives each full collection (``_gcwatch``):
        a stopped endpoint that had been frozen stayed in memory until the hourly
        unfreeze, about 5 KB per stopped endpoint on average (a process taking 20,000
        user ids grew by another 13 MB every 2,500 past ``MAX_ENDPOINTS``). With the
        cycles cut, reference counting frees it when its task ends."""
        for sdk_object in (self.server, self.manager):
            vars(sdk_object).clear()
        self._connections.clear()

    async def _remember_session(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        # The per-request ServerSession dies with the request; its Connection lives as
        # long as the Streamable HTTP session (the SDK exposes it to handlers only as
        # the session's private attribute, so fall back to nothing if it moves).
        connection = getattr(ctx.session, "_connection", None)
        if isinstance(connection, Connection):
            self._connections.add(connection)
        result = await call_next(ctx)
        session_id = session_of(ctx.session)
        if ctx.method == "initialize" and session_id is not None:
            # recorded before the answer goes out: the client's next request may land
            # on any process, which adopts the session from this record
            try:
                await self.sessions.remember(session_id, result, ctx.params)
            except SubstrateUnavailable as exc:
                note_unavailable(str(exc))
                raise MCPError(
                    types.INTERNAL_ERROR, f"unavailable: {exc}", data={"code": "unavailable"}
                ) from None
        return result

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            catalogue = await self.bridge.tools(self.user_id)
        except SubstrateUnavailable as exc:
            # GET .../tools' 503 ``unavailable``, as the hub's own 503 on this endpoint
            # says it: -32603 with HTTP's code in ``data``, and the cause in the log
            note_unavailable(str(exc))
            data = {"code": _codes.UNAVAILABLE, "retry_after_s": exc.retry_after_s}
            raise MCPError(types.INTERNAL_ERROR, f"unavailable: {exc}", data=data) from None
        if self._digest is None:  # the watcher's baseline, if it has none yet
            # Never more: _digest is what every session has been told about, and this
            # answer tells only this one (a change seen here first is still announced).
            self._digest = _digest(catalogue)
        listed = []
        for spec in catalogue or []:
            try:
                listed.append(tool_entry(spec))
            except ValueError as exc:  # the spec's inputSchema must be an object schema
                log.info("not listed over MCP for %s: %s", self.user_id, exc)
        return types.ListToolsResult(tools=listed)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if self.is_draining():
            _metrics.call_refused_draining(params.name, user_id=self.user_id, job_id=None)
            return _error_result(
                "unavailable", _codes.DRAINING, "this hub replica is restarting; retry"
            )
        meta = (ctx.params or {}).get("_meta") or {}
        try:  # checked as HTTP's body fields are (a key that is no string would run twice)
            key = string_option("idempotency_key", meta.get(META_IDEMPOTENCY_KEY))
            timeout_s = timeout_option(meta.get(META_TIMEOUT_S))
        except BadRequest as exc:
            raise _invalid_params(exc) from None
        job_id = uuid.uuid4().hex
        session_id = session_of(ctx.session) if key is None else None
        if session_id is None or ctx.request_id is None:  # nothing a cancel elsewhere withdraws
            return await self._dispatch(ctx, params, meta, key, timeout_s, job_id)
        # recorded while it runs, so a cancel or a DELETE on another process withdraws it
        ttl_s = (timeout_s or self.bridge.timings.call_timeout_s) + SESSION_IDLE_TIMEOUT_S
        try:
            runs = await self.sessions.track(session_id, ctx.request_id, job_id, ttl_s=ttl_s)
        except SubstrateUnavailable as exc:
            return unavailable_result(exc)
        if not runs:
            return _error_result(
                "cancelled",
                "cancelled",
                "cancelled before it started (notifications/cancelled, or the session was "
                "ended): nothing was enqueued",
            )
        try:
            return await self._dispatch(ctx, params, meta, key, timeout_s, job_id)
        finally:
            await self.sessions.untrack(session_id, ctx.request_id, job_id)

    async def _dispatch(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        meta: dict[str, Any],
        key: str | None,
        timeout_s: float | None,
        job_id: str,
    ) -> types.CallToolResult:
        """:meth:`_call_tool` once its ``_meta`` was read: dispatch, mapped to a result."""
        on_progress = None
        if meta.get("progressToken") is not None:  # the client asked for progress
            last: list[float] = []  # the progress of the last notification sent

            async def on_progress(report: ProgressReport) -> None:
                # MCP: "The progress value MUST increase with each notification"; a tool's
                # reports need not (the approval stage and the run both start at 0).
                if last and report.progress <= last[0]:
                    return
                last[:] = [report.progress]
                await ctx.session.report_progress(report.progress, report.total, report.message)

        drain = self.get_drain()
        outcome: Outcome | None = None
        try:
            with contextlib.nullcontext(None) if drain is None else drain.waiting() as call:
                outcome = await self.bridge.dispatch(
                    self.user_id,
                    params.name,
                    params.arguments or {},
                    idempotency_key=key,
                    timeout_s=timeout_s,
                    job_id=job_id,
                    on_progress=on_progress,
                    started_at=_started_at(ctx),
                )
        except BadRequest as exc:
            if exc.field == "args":  # the model can correct its arguments (SEP-1303)
                return bad_args_result(exc)
            raise _invalid_params(exc) from None
        except IdempotencyKeyReused as exc:  # HTTP's 422: the caller's key, not the model's args
            raise MCPError(
                types.INVALID_PARAMS,
                f"_meta.{META_IDEMPOTENCY_KEY}: {exc}",
                data={
                    "code": exc.status,
                    "field": f"_meta.{META_IDEMPOTENCY_KEY}",  # HTTP's idempotency_key
                    "job_id": exc.job_id,
                },
            ) from None
        except JobIdInUse as exc:  # a fresh UUID: practically impossible
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from None
        except (QueueFull, Overloaded) as exc:
            # HTTP's 429 queue_full, 503 overloaded: as the MCP mount's own 429s, -32603,
            # with HTTP's error body (but its message) as data
            error = bridge_error_answer(exc)[1]["error"]
            raise MCPError(
                types.INTERNAL_ERROR,
                f"{exc.status}: {exc}",
                data={k: v for k, v in error.items() if k != "message"},
            ) from None
        except SubstrateUnavailable as exc:
            return unavailable_result(exc)
        except anyio.get_cancelled_exc_class():
            if key is None:
                # A keyed request may be shared: a retry (HTTP or MCP) with the same key
                # attaches to the job, and must not lose it because this call gave up.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                    await withdraw_job(self.bridge, self.user_id, job_id)
            raise
        if outcome is None:  # released (not withdrawn: a retry may attach to the job)
            assert call is not None
            return await released_result(
                self.bridge, call, params.name, self.user_id, keyed=key is not None
            )
        if outcome.status == "offline":  # nothing enqueued: the id is ours, not the model's
            outcome = attrs.evolve(outcome, job_id=None)
        return outcome_result(outcome)

    async def _watch_catalogue(self) -> None:
        while True:
            if not self.listened_to():
                # Nobody to tell: no wake-ups either until a request comes (an endpoint
                # idle until it is reaped woke every poll_s for nothing: 4,096 of them,
                # the bound per process, took 10-15 % of a core).
                await self._listener_came.wait()
                self._listener_came = anyio.Event()
            await anyio.sleep(self.poll_s)
            if not self.listened_to():  # nobody to tell: no Redis reads for nothing
                continue
            try:
                digest = _digest(await self.bridge.tools(self.user_id))
            except Exception as exc:  # noqa: BLE001 - Redis down: try again next round
                log.debug("catalogue poll for %s failed: %r", self.user_id, exc)
                continue
            if self._digest is None:
                self._digest = digest
                continue
            if digest != self._digest:
                self._digest = digest
                await self.notify_tools_changed()

    async def notify_tools_changed(self) -> None:
        """Tell every session of this user that ``tools/list`` changed: all at once, each
        within ``NOTIFY_TIMEOUT_S`` (a session whose client stopped reading blocks its
        send; it must not hold up the others, nor the watcher's next round)."""
        await self.bus.publish(ToolsListChanged())
        async with anyio.create_task_group() as tg:
            for connection in list(self._connections):
                tg.start_soon(self._tell, connection)

    async def _tell(self, connection: Connection) -> None:
        with anyio.move_on_after(NOTIFY_TIMEOUT_S) as scope:
            try:
                await connection.send_tool_list_changed()
            except Exception as exc:  # noqa: BLE001 - a closed session: forget it
                log.debug("list_changed not delivered: %r", exc)
                self._connections.discard(connection)
        if scope.cancelled_caught:  # not reading its stream: it hears nothing more
            log.info("list_changed not taken within %g s: session forgotten", NOTIFY_TIMEOUT_S)
            self._connections.discard(connection)


def _started_at(ctx: Any) -> float | None:
    """When the hub began the HTTP request carrying this tools/call (``STARTED_AT`` in
    its ASGI scope, stamped by the MCP mount before the body was read), or None when the
    request is not an HTTP one the mount saw (then the dispatch counts from its own
    start)."""
    scope = getattr(getattr(ctx, "request", None), "scope", None)
    started = scope.get(STARTED_AT) if isinstance(scope, dict) else None
    return started if isinstance(started, float) else None


__all__ = [
    "CATALOGUE_POLL_S",
    "UserEndpoint",
    "bad_args_result",
    "object_schema",
    "outcome_result",
    "tool_entry",
]
