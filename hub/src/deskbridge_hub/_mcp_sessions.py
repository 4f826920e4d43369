"""2025-era MCP sessions on every hub process (docs/architecture.md, "MCP sessions on
every replica"; the store's part: ``_mcp_store``).

The SDK keeps a handshake-era session (``initialize``, ``Mcp-Session-Id``) in the memory
of the process that created it: its ``StreamableHTTPSessionManager`` answers ``404
Session not found`` for an id it does not hold. Behind a load balancer without affinity
that was every other request. What is shared, so any process serves any request:

* **the session**: when ``initialize`` succeeds its record (negotiated protocol version,
  the client's ``initialize`` params) is written to the store before the answer goes
  out. A process that receives a request for a session it does not hold, whose record
  the store has under the URL's user, **adopts** it: it creates the SDK's own transport
  under that id and serves it with a ``Connection`` that is already initialized at the
  recorded version (:meth:`SharedSessionManager.adopt`), then hands the request to the
  SDK as usual. Every request on a session raises the record's TTL (the idle timeout,
  30 min) and tells a process holding the session whether it still exists: one found
  gone (``DELETE`` elsewhere, expired) is dropped, and the SDK answers 404.
* **its calls**: an unkeyed ``tools/call`` records (session, request id) -> job id while
  it runs, so a ``notifications/cancelled`` that lands on another process withdraws the
  job there; one that comes before the call was recorded leaves a mark the call finds
  (it then does not run). ``DELETE`` on any process drops the record and withdraws the
  jobs of the calls it had in flight.

Progress notifications and a call's answer travel on the POST's own response stream, so
they reach the client from whichever process took the POST. The standalone GET stream
(``notifications/tools/list_changed``) stays on the process it was opened on; each
process watches its user's catalogue itself.

A process keeps at most ``bound`` sessions of a user in memory (the SDK's table): to
adopt one more it drops the least recently used one with no request open, which the
store still holds (its next request adopts it again, anywhere).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import attrs
import mcp_types as types
from anyio.abc import TaskStatus
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ._bridge import Bridge
from ._errors import SubstrateUnavailable
from ._mcp_store import McpSessionSubstrate, call_field, decode_record, encode_record

log = logging.getLogger("deskbridge.hub.mcp")

#: Streamable HTTP sessions idle this long are closed, seconds (the SDK's default): the
#: local copy by the SDK, the record in the store by its TTL (raised by every request).
SESSION_IDLE_TIMEOUT_S = 30 * 60.0
#: What the SDK mints (``uuid4().hex``): anything else is never looked up in the store.
_SESSION_ID = re.compile(r"[0-9a-f]{32}")
#: How long withdrawing the jobs of a cancel or a ``DELETE`` may take, seconds.
WITHDRAW_TIMEOUT_S = 5.0


class SharedSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, able to serve a session another process created.

    Two additions, on the SDK's own objects: :meth:`adopt` (the SDK's transport, its
    dispatcher and ``serve_connection``, with a ``Connection`` initialized from the
    record, as ``run_server`` of ``_serve_opening_request`` does for a new session), and
    :meth:`_discard_session` forgetting a session only while the transport given is the
    one it holds (the SDK forgot whatever held the id, so a dropped copy winding down
    after its session was adopted again would have removed the new one).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Adoptions under way: session id -> set once its transport is in the table (or
        #: the adoption failed). A second request of the session waits for the first's.
        self._adopting: dict[str, anyio.Event] = {}

    def holds(self, session_id: str) -> bool:
        """Whether this process holds the session in memory."""
        return session_id in self._server_instances

    def held(self) -> list[str]:
        """The ids of the sessions held in memory."""
        return list(self._server_instances)

    async def adopt(
        self, session_id: str, protocol_version: str, client: dict[str, Any] | None
    ) -> None:
        """Hold the session ``session_id``, initialized at ``protocol_version`` with the
        client's ``initialize`` params ``client`` (None: not recorded), served in the
        manager's task group until it is deleted, idles out or the manager stops.

        Once only: a session held already, or being adopted by another request (whose
        adoption this one waits for), is not adopted again (a second transport replaced
        the first in the table, and the first, reached by no request, never idled out).
        The transport enters the table only once it is connected (the SDK raised
        ``ValueError`` for a request handed to it before).

        Raises:
            RuntimeError: the manager is not running.
        """
        if self._task_group is None:
            raise RuntimeError("Task group is not initialized. Make sure to use run().")
        if session_id in self._server_instances:
            return
        if session_id in self._adopting:
            await self._adopting[session_id].wait()
            return
        self._adopting[session_id] = anyio.Event()
        try:
            await self._adopt(session_id, protocol_version, client)
        finally:
            self._adopting.pop(session_id).set()

    async def _adopt(
        self, session_id: str, protocol_version: str, client: dict[str, Any] | None
    ) -> None:
        assert self._task_group is not None
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        params = None
        if client is not None:
            try:
                params = types.InitializeRequestParams.model_validate(client, by_name=False)
            except ValidationError:
                params = None  # the version alone serves the hub's handlers

        async def run_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                try:
                    idle_scope = transport.idle_scope or anyio.CancelScope()
                    with idle_scope:
                        dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(
                            read_stream, write_stream, inline_methods=frozenset({"initialize"})
                        )
                        connection = Connection.for_loop(
                            dispatcher,
                            session_id=session_id,
                            protocol_version_hint=protocol_version,
                        )
                        connection.client_params = params
                        connection.initialized.set()
                        await serve_connection(
                            self.app,
                            dispatcher,
                            connection=connection,
                            lifespan_state=self._lifespan_state,
                        )
                except Exception:
                    log.exception("adopted MCP session %s crashed", session_id[:8])
                finally:
                    await self._discard_session(session_id, transport)

        try:
            await self._task_group.start(run_server)
        except BaseException:
            await self._discard_session(session_id, transport)
            raise
        if not transport.is_terminated:  # (its server task may have ended already)
            self._server_instances[session_id] = transport
        if transport.idle_scope is not None and self.session_idle_timeout is not None:
            # the SDK starts the countdown when a request ends: a copy no request reaches
            # (its adopting request refused after all) would otherwise be held for good
            transport.idle_scope.deadline = anyio.current_time() + self.session_idle_timeout

    async def drop(self, session_id: str) -> None:
        """Stop holding the session (its transport is terminated: requests in flight on
        it end); the store's record is untouched."""
        transport = self._server_instances.get(session_id)
        if transport is not None:
            await self._discard_session(session_id, transport)

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        if self._server_instances.get(session_id) is transport:
            del self._server_instances[session_id]
            self._session_owners.pop(session_id, None)
        if not transport.is_terminated:
            with anyio.CancelScope(shield=True):
                await transport.terminate()


#: A refusal before the SDK sees the request: HTTP status, the hub's error code, message.
Refusal = tuple[int, str, str]


@attrs.define(eq=False)
class SessionSharing:
    """One user endpoint's side of the shared sessions (see the module docstring).

    Args:
        user_id: whose endpoint: a session is looked up under this user only.
        manager: the endpoint's SDK session manager.
        bridge: the dispatch API (its substrate is the shared store; jobs are withdrawn
            through it).
        bound: most sessions held in memory (``MAX_SESSIONS_PER_USER``).
    """

    user_id: str
    manager: SharedSessionManager
    bridge: Bridge
    bound: int
    #: (session id, call field) of the calls running on this process.
    calls: set[tuple[str, str]] = attrs.field(init=False, factory=set)
    _open: Counter[str] = attrs.field(init=False, factory=Counter)
    _last_s: dict[str, float] = attrs.field(init=False, factory=dict)

    async def remember(self, session_id: str, result: Any, params: Any) -> None:
        """Record a session whose ``initialize`` answered ``result`` (the negotiated
        ``protocolVersion``) to the client's ``params``, before the answer goes out.

        Raises:
            SubstrateUnavailable: the store cannot be reached (the session is then this
                process's only, and dropped at its next request).
        """
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if not isinstance(version, str):
            return
        client = None
        if isinstance(params, dict):
            client = {k: v for k, v in params.items() if k != "_meta"}
        record = encode_record(version, client)
        await self.bridge.substrate.open_mcp_session(
            self.user_id, session_id, record, ttl_s=SESSION_IDLE_TIMEOUT_S
        )
        self._last_s[session_id] = anyio.current_time()

    async def track(
        self, session_id: str, request_id: str | int, job_id: str, *, ttl_s: float
    ) -> bool:
        """Record the call before it runs; False: it was cancelled already or its
        session ended, and must not run. Raises SubstrateUnavailable."""
        store: McpSessionSubstrate = self.bridge.substrate
        if not await store.track_mcp_call(
            self.user_id, session_id, request_id, job_id, ttl_s=ttl_s
        ):
            return False
        self.calls.add((session_id, call_field(request_id)))
        return True

    async def untrack(self, session_id: str, request_id: str | int, job_id: str) -> None:
        """Forget the call once it ended (bounded, shielded; a failure is logged: the
        record goes with the session)."""
        self.calls.discard((session_id, call_field(request_id)))
        with anyio.CancelScope(shield=True), anyio.move_on_after(WITHDRAW_TIMEOUT_S):
            try:
                await self.bridge.substrate.untrack_mcp_call(
                    self.user_id, session_id, request_id, job_id
                )
            except SubstrateUnavailable as exc:
                log.debug("MCP call %s not forgotten: %s", request_id, exc)

    @contextlib.asynccontextmanager
    async def serving(self, scope: Any, raw: bytes | None) -> AsyncIterator[Refusal | None]:
        """Around one request the SDK is handed: yields None to serve it, or why not.

        For a 2025-era request naming a session: looks the session up in the store
        (raising its TTL), drops a copy held here whose record is gone (the SDK then
        answers 404), adopts one held elsewhere, and for a ``DELETE`` or a
        ``notifications/cancelled`` does the shared part first (drop the record and
        withdraw its calls' jobs; withdraw the cancelled call's job when it runs on
        another process). Refusals: 503 (the store cannot be reached and the session is
        not held here, or the request is a ``DELETE``), 429 (adopting it would pass
        ``bound`` and every session held has a request open).
        """
        session_id = _session_id(scope)
        if session_id is None or _SESSION_ID.fullmatch(session_id) is None:
            yield None  # a new session, the 2026 wire, or an id the SDK never minted
            return
        refusal = await self._prepare(session_id, scope, raw)
        if refusal is not None:
            yield refusal
            return
        self._open[session_id] += 1
        try:
            yield None
        finally:
            self._open[session_id] -= 1
            if not self._open[session_id]:
                del self._open[session_id]
            self._last_s[session_id] = anyio.current_time()

    async def keep_alive(self, *, every_s: float = SESSION_IDLE_TIMEOUT_S / 3) -> None:
        """Until cancelled: every ``every_s`` seconds, raise the TTL of the sessions with
        a request open here (a standalone GET stream, a long keyed call), which no new
        request refreshes: the SDK never idles out a session while a request is open, and
        its record must not expire under it either."""
        while True:
            await anyio.sleep(every_s)
            for session_id in list(self._open):
                try:
                    await self.bridge.substrate.touch_mcp_session(
                        self.user_id, session_id, ttl_s=SESSION_IDLE_TIMEOUT_S
                    )
                except SubstrateUnavailable as exc:  # next round
                    log.debug("MCP session %s not refreshed: %s", session_id[:8], exc)
                    break

    async def _prepare(self, session_id: str, scope: Any, raw: bytes | None) -> Refusal | None:
        store: McpSessionSubstrate = self.bridge.substrate
        held = self.manager.holds(session_id)
        try:
            record = await store.touch_mcp_session(
                self.user_id, session_id, ttl_s=SESSION_IDLE_TIMEOUT_S
            )
        except SubstrateUnavailable as exc:
            if held and scope.get("method") != "DELETE":
                return None  # served from memory: the calls will say what the store does
            # (a DELETE ending only this copy would be answered 200 while the record
            # kept the session on every other process)
            return 503, "unavailable", f"cannot look up MCP session: {exc}"
        if record is None:
            if held:
                await self.manager.drop(session_id)
                log.info(
                    "MCP session %s of %s ended elsewhere: dropped", session_id[:8], self.user_id
                )
            return None  # the SDK answers 404
        if not self.manager.holds(session_id):  # (again: another request may have adopted it)
            decoded = decode_record(record)
            if decoded is None:
                return None
            if len(self.manager.held()) >= self.bound and not await self._make_room():
                return (
                    429,
                    "too_many_requests",
                    (
                        f"this hub process holds {self.bound} MCP sessions of user "
                        f"{self.user_id!r}, each with a request open (MAX_SESSIONS_PER_USER): "
                        "retry (another replica may serve it)"
                    ),
                )
            await self.manager.adopt(session_id, *decoded)
            log.info("MCP session %s of %s adopted", session_id[:8], self.user_id)
        if scope.get("method") == "DELETE":
            try:
                jobs = await store.end_mcp_session(self.user_id, session_id)
            except SubstrateUnavailable as exc:
                return 503, "unavailable", f"cannot end MCP session: {exc}"
            await self._withdraw(jobs or [])
        elif raw is not None and b"notifications/cancelled" in raw:
            await self._cancel(session_id, raw)
        return None

    async def _cancel(self, session_id: str, raw: bytes) -> None:
        """A ``notifications/cancelled`` for a call not running here: withdraw its job
        wherever it runs (a call running here is the SDK's to cancel)."""
        request_id = _cancelled_request(raw)
        if request_id is None or (session_id, call_field(request_id)) in self.calls:
            return
        try:
            job = await self.bridge.substrate.cancel_mcp_call(self.user_id, session_id, request_id)
        except SubstrateUnavailable as exc:
            log.info("MCP cancel of request %s not shared: %s", request_id, exc)
            return
        if job is not None:
            await self._withdraw([job])

    async def _withdraw(self, jobs: list[str]) -> None:
        with anyio.move_on_after(WITHDRAW_TIMEOUT_S):
            for job_id in jobs:
                await withdraw_job(self.bridge, self.user_id, job_id)

    async def _make_room(self) -> bool:
        """Drop the least recently used session held here with no request open (the
        store still has it); False when every one has a request open."""
        held = set(self.manager.held())
        for gone in [s for s in self._last_s if s not in held]:
            del self._last_s[gone]
        idle = [s for s in held if not self._open.get(s) and s in self._last_s]
        if not idle:
            return False
        oldest = min(idle, key=self._last_s.__getitem__)
        await self.manager.drop(oldest)
        log.info(
            "MCP session %s of %s dropped from memory to adopt another", oldest[:8], self.user_id
        )
        return True


async def withdraw_job(bridge: Bridge, user_id: str, job_id: str) -> None:
    """Withdraw the job of an MCP call its client gave up on (``notifications/cancelled``,
    an abandoned request, ``DELETE``), logging what came of it; never raises (Redis down:
    the job's own deadline ends it)."""
    try:
        # (withdraw, not cancel: the enqueue may have been sent and not landed yet)
        stage = await bridge.withdraw(user_id, job_id)
        what = "had its answer already" if stage == "finished" else f"cancel requested ({stage})"
        log.info("MCP call abandoned by the client: job %s %s", job_id, what)
    except Exception as exc:  # noqa: BLE001 - Redis down: its deadline ends it
        log.info("MCP call abandoned by the client: job %s not cancelled (%r)", job_id, exc)


def session_of(connection: Any) -> str | None:
    """The id of the 2025-era session a handler's ``ctx.session`` serves, or None (the
    2026 wire: no session). The SDK exposes the ``Connection`` only as the session's
    private attribute; fall back to None if it moves."""
    conn = getattr(connection, "_connection", None)
    if not isinstance(conn, Connection) or conn.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    session_id = conn.session_id
    return session_id if isinstance(session_id, str) else None


def _session_id(scope: Any) -> str | None:
    """The ``Mcp-Session-Id`` of a 2025-era request (no ``MCP-Protocol-Version``, or a
    handshake-era one: the SDK's own routing), else None."""
    headers = dict(scope.get("headers", []))
    version = headers.get(b"mcp-protocol-version")
    if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    value = headers.get(b"mcp-session-id")
    return None if value is None else value.decode("latin-1")


def _cancelled_request(raw: bytes) -> str | int | None:
    """``params.requestId`` of a ``notifications/cancelled`` body, else None."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("method") != "notifications/cancelled":
        return None
    params = value.get("params")
    rid = params.get("requestId") if isinstance(params, dict) else None
    return None if isinstance(rid, bool) or not isinstance(rid, str | int) else rid


__all__ = [
    "SESSION_IDLE_TIMEOUT_S",
    "SessionSharing",
    "SharedSessionManager",
    "session_of",
    "withdraw_job",
]
