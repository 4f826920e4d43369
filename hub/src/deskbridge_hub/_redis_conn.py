"""Redis connection handling for ``RedisSubstrate``: lifetime, discard on cancel, error
mapping. The commands and scripts live in ``_redis``; the connections of one event-loop
run in ``_redis_session`` (pub/sub in ``_redis_pubsub``). Only these modules import
coredis.

Lifecycle (what coredis 6.9 requires, read from its source). A coredis connection is
driven by reader and writer tasks, so it needs a task group that outlives each command;
here a *session* bound to the current event-loop run (an anyio ``RunVar``) owns that task
group and the connections it hosts.

* ``async with substrate:`` opens the session (no I/O: the first command connects);
  leaving closes every connection. A server holds it open for its lifetime (the app's
  ``while_serving``).
* Used without ``async with`` (scripts, CLIs, a different event-loop run than the one that
  entered it), each call opens a one-shot session and closes it before returning: correct,
  at the price of one connection per call.
* At most ``max_connections`` (``DESKBRIDGE_REDIS_MAX_CONNECTIONS``, default 16) are held
  at once, and they are kept: steady state opens none. Non-blocking commands share a
  couple of connections, pipelined (coredis lets many requests be in flight on one
  connection; replies come back in order); blocking commands (BLPOP, XREADGROUP ...
  BLOCK) get dedicated ones; pub/sub one subscriber. ``_redis_session`` says how the
  bound is spent and what happens when blocking commands outnumber it.
* A blocking command that is cancelled or times out discards its connection and *waits*
  (shielded, at most ``_CLOSE_WAIT_S``) until the socket is closed before the
  cancellation propagates, so no server-side waiter outlives it. A cancelled
  non-blocking command leaves its shared connection in place (its reply is read and
  dropped); a timed-out one closes it (presumed dead).

Why not coredis's own pool (``coredis.ConnectionPool``, 6.9.0 and its main branch as of
2026-11-30; reproduced by ``tests/hub/test_coredis_pool.py`` against real Redis):

1. **A cancelled blocking command leaks a pool slot.** ``Redis._execute_command`` keeps a
   blocking command's connection leased and creates its request with
   ``disconnect_on_cancellation=True``; cancelling it invalidates the connection, and
   ``ConnectionPool.release()`` then returns nothing to the pool's queue (it only puts back
   *usable* connections; the ``None`` placeholder that lets a new connection be opened is
   appended only for connections that die while idle in the queue). After
   ``max_connections`` cancelled BLPOP / XREADGROUP BLOCK calls every later command waits
   forever for a slot. The relay cancels a blocking read each time a desktop disconnects.
2. **The cancelled command's server-side waiter can take the next reply.** ``invalidate()``
   only cancels the connection's task group; the socket is closed later, when those tasks
   next run. Cancellation returns to the caller at once, so an RPUSH sent next on another
   pooled connection can reach Redis before the close and be popped by the stale BLPOP
   waiter, then lost with the socket (16 of 50 tries under trio, 50 of 50 under asyncio,
   in that test). No public coredis API waits for a connection to finish closing.

Neither is fixable by a setting; a wrapper would have to reach into the pool's private
queue and poll private connection state. So we keep coredis's *connections* (the public
``BaseConnection(location, **kwargs)``, ``run(task_status=)``, ``create_request()``,
``usable``, ``push_messages``) and host them ourselves, which lets a discard wait for
the close and bounds what the process holds.

Errors: connection failures, timeouts and the server states that refuse work (LOADING,
READONLY, OOM, MISCONF, BUSY, MASTERDOWN, UNBLOCKED, auth failures) raise ``SubstrateUnavailable``
naming ``host:port`` (never the password). Other server errors are programming errors and
propagate unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
import anyio.lowlevel
import attrs
from coredis.exceptions import (
    AskError,
    AuthenticationError,
    AuthenticationRequiredError,
    AuthorizationError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
    UnblockedError,
)
from coredis.exceptions import ConnectionError as RedisConnectionError

from . import _metrics
from ._errors import SubstrateMisconfigured, SubstrateUnavailable
from ._own_liveness import own_liveness
from ._redis_cluster import ClusterSession, is_cluster_url, seeds
from ._redis_health import (
    ACL_CHECK_SCRIPT,
    NEEDED_COMMANDS,
    PROBE_SCRIPT,
    Health,
    HealthMonitor,
    interpret,
    password_unchecked,
    refused_commands,
)
from ._redis_session import ConnectionStatistics, _Session, _split
from ._redis_wire import ConnectFailed

#: Server error codes that mean "cannot serve now", not "bad command" (refused before
#: the command ran).
UNAVAILABLE_CODES = (
    "OOM",
    "MISCONF",
    "BUSY",
    "MASTERDOWN",
    "NOREPLICAS",
    "LOADING",
    "NOSCRIPT",
    "NOPERM",
    "CLUSTERDOWN",
    "TRYAGAIN",
)
#: Server states Redis (>= 7.0) fails a script without flags on only at the script's
#: *first write*: once a script has written, these states never fail it
#: (``scriptVerifyWriteCommandAllow`` and ``scriptVerifyOOM`` in Redis' script.c). An
#: error reply with one of these codes to a script that reads all it decides on before
#: its first write (the submit script) proves the script wrote nothing. Not here: codes
#: Redis gives before it runs a command at all (BUSY, LOADING, MASTERDOWN, NOSCRIPT,
#: the Cluster's): the reply is the last send's, and a step sent once more after its
#: connection was found dead (``_redis_resend``) says nothing of the first send; nor
#: NOPERM, which a script meets per command, after earlier writes too.
REFUSED_AT_FIRST_WRITE = ("OOM", "MISCONF", "READONLY", "NOREPLICAS")
_UNAVAILABLE_ERRORS = (
    RedisConnectionError,
    OSError,  # includes TimeoutError
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    AuthorizationError,
    ReadOnlyError,
    NoScriptError,
    # a Cluster's redirections and retries that outlived ``_redis_cluster``'s budget
    # (a slot migrating for long, a node down past its timeout): an outage, not a bug
    AskError,  # and MovedError, its subclass
    TryAgainError,
    ClusterDownError,
    # a blocked command (the wake-up BLMPOP, a caller's mailbox read) ended by the server:
    # "-UNBLOCKED ... instance state changed (master -> replica?)", its primary demoted
    # under it (a failover). Was a 500 for the caller waiting on a running job. The
    # stream read's UNBLOCKED (its stream deleted) is healed in ``_redis_streams`` first.
    UnblockedError,
)


#: The ACL check's arguments (``_redis_health.ACL_CHECK_SCRIPT``): one per command.
_NEEDED_SPECS = tuple(" ".join(command) for command in NEEDED_COMMANDS)

#: Failures of the connection itself (as opposed to an error reply).
_TRANSPORT_ERRORS = (
    RedisConnectionError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


#: Error replies coredis turns into classes, dropping the code from the message.
_CODES = (
    (AuthorizationError, "NOPERM"),
    (ReadOnlyError, "READONLY"),
    (NoScriptError, "NOSCRIPT"),
    (UnblockedError, "UNBLOCKED"),
)


#: How Redis 7.0 words an ACL refusal met *inside* a script ("-ERR The user executing
#: the script can't run this command or subcommand", "... can't access at least one of
#: the keys ...", "... can't publish to the channel ..."): no NOPERM code, unlike the
#: same refusal outside a script (7.2 says NOPERM in both places).
_SCRIPT_ACL_REFUSAL = "The user executing the script can't"


def error_code(exc: BaseException) -> str:
    """The Redis error code of an error reply (its first word: ``OOM``, ``BUSY``, ...);
    ``NOPERM`` for an ACL refusal inside a script, which Redis 7.0 sends without it."""
    text = str(exc)
    if isinstance(exc, ResponseError) and text.removeprefix("ERR ").startswith(
        _SCRIPT_ACL_REFUSAL
    ):
        return "NOPERM"
    return text.split(" ", 1)[0]


def coded(exc: BaseException) -> Exception:
    """``exc`` with its Redis error code in front of the message (coredis keeps the code
    only in the class for NOPERM / READONLY / NOSCRIPT; Redis 7.0 sends none for an ACL
    refusal inside a script), for messages and the probe."""
    text = str(exc)
    for cls, code in _CODES:
        if isinstance(exc, cls) and not text.startswith(code):
            return ResponseError(f"{code} {text}")
    if error_code(exc) == "NOPERM" and not text.startswith("NOPERM"):
        return ResponseError(f"NOPERM {text.removeprefix('ERR ')}")
    return exc if isinstance(exc, Exception) else Exception(text)


def refused_at_first_write(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply a script gets only at its first write
    (:data:`REFUSED_AT_FIRST_WRITE`)."""
    return isinstance(exc, ResponseError) and error_code(coded(exc)) in REFUSED_AT_FIRST_WRITE


def _reason(exc: BaseException) -> str:
    """Why a command failed, never empty: a peer that accepts and never answers as Redis
    does (an HTTP server, a Redis without TLS behind rediss://) timed out with an empty
    message, and the line read "unavailable (health probe): ;"."""
    text = str(coded(exc))
    if text:
        return text
    return (
        f"no answer ({type(exc).__name__}): is it a Redis server (and, for rediss://, one "
        "that speaks TLS)?"
    )


class RedisConnections:
    """The connections of one ``RedisSubstrate``: one session per event-loop run.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS) or
            ``unix://path``. Only ``host:port`` ever appears in messages.
        connect_timeout_s: seconds to open a connection (TCP + TLS + HELLO) before the
            call raises SubstrateUnavailable; short so callers learn "unavailable" fast.
        command_timeout_s: seconds a reply may take beyond a command's own blocking time
            before the connection is presumed dead (SubstrateUnavailable).
        max_connections: most connections one session (one event-loop run) holds at
            once: shared ones for non-blocking commands, dedicated ones for blocking
            commands, one pub/sub subscriber (>= 3; see the module docstring).
        client_name: sent with CLIENT SETNAME on every connection (``CLIENT LIST`` shows
            it), or None.
        health_interval_s: when entered (``async with``), probe whether this Redis can
            serve the hub at once and then this often (``_redis_health``); None: never
            in the background.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float,
        command_timeout_s: float,
        max_connections: int,
        client_name: str | None,
        health_interval_s: float | None = None,
    ) -> None:
        _split(max_connections)  # validate now, not at the first command
        self._url = url
        self._client_name = client_name
        self._connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._max_connections = max_connections
        self._session_var: anyio.lowlevel.RunVar[_Session | None] = anyio.lowlevel.RunVar(
            f"deskbridge-redis-session-{id(self)}", default=None
        )
        parts = urlsplit(url)
        if is_cluster_url(url):
            self.address = ",".join(f"{h}:{p}" for h, p in seeds(url))
        elif parts.scheme == "unix":
            self.address = parts.path
        else:
            self.address = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        # for messages; a unix:// URL names its database as ?db=N
        db = dict(parse_qsl(parts.query)).get("db") if parts.scheme == "unix" else None
        self._db = db or (parts.path.strip("/") if parts.scheme != "unix" else "") or "0"
        self._health_interval_s = health_interval_s
        self._probe_key = f"bridge:health:{{{secrets.token_hex(8)}}}"
        # the default user's password, which the probe checks Redis has (``_redis_health``)
        user = unquote(parts.username or "") or "default"
        self._default_password = (
            unquote(parts.password) if parts.password and user == "default" else None
        )
        self.monitor = HealthMonitor(self.address, self.probe)

    async def enter(self, owner: object) -> None:
        """Open a session for this event-loop run (no I/O yet).

        Raises:
            RuntimeError: a session is already open in this run.
        """
        if self._session_var.get() is not None:
            raise RuntimeError(f"{owner!r} is already open in this event loop")
        session = self._new_session()
        await session.open()
        self._session_var.set(session)
        if self._health_interval_s is not None:
            session.start_soon(functools.partial(self.monitor.run, self._health_interval_s))

    async def exit(self) -> None:
        """Close the session's connections; waits for them (cancellation cannot stop it)."""
        session = self._session_var.get()
        self._session_var.set(None)
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        """Close the connections this event-loop run holds; later calls open new ones.
        Idempotent; never raises."""
        session = self._session_var.get()
        if session is not None:
            session.drop_connections()
        await anyio.lowlevel.checkpoint()

    def _new_session(self) -> _Session:
        if is_cluster_url(self._url):
            return ClusterSession(  # type: ignore[return-value]  # same interface
                self._url,
                connect_timeout_s=self._connect_timeout_s,
                command_timeout_s=self.command_timeout_s,
                max_connections=self._max_connections,
                client_name=self._client_name,
            )
        session = _Session(
            self._url,
            connect_timeout_s=self._connect_timeout_s,
            command_timeout_s=self.command_timeout_s,
            max_connections=self._max_connections,
            client_name=self._client_name,
        )
        session.on_reconnect = self._reconnected
        return session

    def _reconnected(self, why: str) -> None:
        """A connection that had served was replaced (``_Session.on_reconnect``: ``dead``,
        ``replica`` or ``demoted``): counted; did Redis fail over (the probe reads its
        replication history)? A failover with Sentinel's CLIENT KILL showed the hub
        nothing else: the commands were sent again on new connections and succeeded.
        Until the probe has looked and the presence this process holds is rewritten, an
        absent one proves nothing here (``_own_liveness``)."""
        _metrics.redis_reconnected(why)
        own_liveness().store_changed()
        self.monitor.poke()

    def statistics(self) -> ConnectionStatistics | None:
        """The connections of this event-loop run's open session, or None when none is
        open (``async with`` not entered in this run)."""
        session = self._session_var.get()
        return None if session is None or session.closed else session.statistics()

    def session(self, what: str, *, map_errors: bool = True) -> _SessionUse:
        """``async with`` it: the open session of this run, or a one-shot one; maps I/O
        faults at the edge (``what`` names the command in the SubstrateUnavailable
        message) unless ``map_errors`` is False (the block runs someone else's code).
        A plain class, not a generator-based context manager: every Redis command of a
        call passes through here (issue 10, per-call CPU)."""
        return _SessionUse(self, what, map_errors)

    @contextlib.contextmanager
    def mapped(self, what: str) -> Iterator[None]:
        """Raise SubstrateUnavailable for I/O faults and refusing server states."""
        try:
            yield
        except Exception as exc:
            mapped = self.map_error(what, exc)
            if mapped is None:
                raise
            raise mapped from exc

    def map_error(self, what: str, exc: BaseException) -> SubstrateUnavailable | None:
        """The SubstrateUnavailable to raise instead of ``exc`` (an I/O fault or a
        refusing server state; counted, and the health monitor poked), or None when
        ``exc`` is not one (it propagates unchanged). A group of exceptions (a Cluster
        batch split over slots runs one task per node) maps when every member maps, to
        its first member's: one node's outage is an outage, not a bug."""
        if isinstance(exc, BaseExceptionGroup):
            members = [self.map_error(what, e) for e in exc.exceptions]
            if members and all(m is not None for m in members):
                return members[0]
            return None
        if isinstance(exc, ResponseError) and "cluster support disabled" in str(exc):
            # redis+cluster:// at a single Redis: a lifespan traceback at start, exit 1
            _metrics.substrate_error(what)
            return SubstrateMisconfigured(
                f"Redis at {self.address} has cluster support disabled, which "
                "DESKBRIDGE_REDIS_URL's redis+cluster:// asks for: write redis://HOST:PORT/DB "
                "for a single Redis"
            )
        if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
            _metrics.substrate_error(what)
            return SubstrateMisconfigured(
                f"Redis at {self.address} has no database {self._db}, which "
                "DESKBRIDGE_REDIS_URL names (DB index is out of range): choose a lower /DB "
                "or raise the server's `databases` setting"
            )
        if isinstance(exc, AuthenticationError):  # no retry helps: not an outage
            _metrics.substrate_error(what)
            wanted = (
                "requires a password and DESKBRIDGE_REDIS_URL gives none"
                if isinstance(exc, AuthenticationRequiredError)
                else f"refused the user name or password of DESKBRIDGE_REDIS_URL ({exc})"
            )
            return SubstrateMisconfigured(
                f"Redis at {self.address} {wanted}: write it as "
                "redis://[USER]:PASSWORD@HOST:PORT/DB, reserved characters percent-encoded"
            )
        if isinstance(exc, _UNAVAILABLE_ERRORS):
            _metrics.substrate_error(what)
            self.monitor.poke()
            unavailable = SubstrateUnavailable(
                f"Redis at {self.address} unavailable ({what}): {_reason(exc)}"
            )
            unavailable.unsent = isinstance(exc, ConnectFailed)  # nothing reached Redis
            return unavailable
        if isinstance(exc, ResponseError) and error_code(exc) in UNAVAILABLE_CODES:
            _metrics.substrate_error(what)
            self.monitor.poke()
            return SubstrateUnavailable(f"Redis at {self.address} refused {what}: {coded(exc)}")
        return None

    async def call(self, session: _Session, *command: Any, block_s: float | None = 0.0) -> Any:
        """One command; server errors raise. ``block_s``: its own blocking time (None:
        forever), to which the command timeout is added."""
        timeout_s = None if block_s is None else block_s + self.command_timeout_s
        (reply,) = await session.execute(command, timeout_s=timeout_s)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def probe(self) -> Health:
        """One health probe (``_redis_health``): INFO, a scripted write + read of this
        instance's probe key, the ACL check of the commands the hub sends and, when the
        URL gives the default user's password, ``AUTH`` with it, pipelined.

        Raises:
            SubstrateUnavailable: Redis unreachable (transport failure or timeout).
        """
        value = secrets.token_hex(4)
        commands: list[tuple[Any, ...]] = [
            (b"INFO", b"replication", b"memory", b"persistence"),
            (b"EVAL", PROBE_SCRIPT, 1, self._probe_key, value),
            (b"EVAL", ACL_CHECK_SCRIPT, 1, self._probe_key, *_NEEDED_SPECS),
        ]
        if self._default_password is not None:  # does Redis check it?
            commands.append((b"AUTH", self._default_password))
        async with self.session("health probe") as s:
            info, probe, acl, *auth = await s.execute(*commands, timeout_s=self.command_timeout_s)
            for reply in (info, probe, acl, *auth):
                if isinstance(reply, _TRANSPORT_ERRORS):
                    raise reply
        health = interpret(
            coded(info) if isinstance(info, BaseException) else info,
            coded(probe) if isinstance(probe, BaseException) else probe,
            probe_value=value,
            refused=refused_commands(acl),
            unchecked_password=password_unchecked(auth[0] if auth else None),
        )
        if is_cluster_url(self._url):
            # the INFO of the one node owning the probe key's slot: another history
            # there is that node's failover or the slot moved (a resharding), not the
            # store's (``history_changes`` is 0 under Cluster; docs/operations.md)
            health = attrs.evolve(health, replid=None)
        return health

    def refuses_work(self, what: str) -> SubstrateUnavailable | None:
        """The error to raise *before* sending ``what`` when the last probe found the
        ACL refusing this user a command the hub needs, else None: a job enqueued then
        could not be read, delivered or answered (it waited out its caller as "queued",
        the desktop blamed). Nothing is sent, so its ``unsent`` is True."""
        return self._unsent(what, self.monitor.refused)

    def refuses_view(self, view: str, what: str) -> SubstrateUnavailable | None:
        """The error to raise *before* sending ``what`` when the last probe found the
        ACL refusing this user a command the operator view ``view`` needs (a key of
        ``_redis_health.VIEW_COMMANDS``), else None: it names the grant, where Redis'
        NOPERM would name one command (or none: a listing whose index writes were
        refused answers, stale). Calls are not refused for it. ``unsent`` is True."""
        return self._unsent(what, self.monitor.views_refused(view))

    def _unsent(self, what: str, cause: str | None) -> SubstrateUnavailable | None:
        if cause is None:
            return None
        refused = SubstrateUnavailable(f"Redis at {self.address} cannot serve {what}: {cause}")
        refused.unsent = True
        return refused

    def unusable(self, what: str) -> SubstrateUnavailable | None:
        """The error to raise for ``what`` when the last probe found this Redis unable
        to serve the hub, else None."""
        cause = self.monitor.degraded
        if cause is None:
            return None
        return SubstrateUnavailable(f"Redis at {self.address} cannot serve {what}: {cause}")


class _SessionUse:
    """One ``async with connections.session(what)``: the run's open session (nothing
    to open or close), or a one-shot session closed on exit; errors mapped on exit."""

    __slots__ = ("_connections", "_what", "_map", "_own")

    def __init__(self, connections: RedisConnections, what: str, map_errors: bool) -> None:
        self._connections = connections
        self._what = what
        self._map = map_errors
        self._own: _Session | None = None

    async def __aenter__(self) -> _Session:
        session = self._connections._session_var.get()
        if session is not None and not session.closed:
            return session
        session = self._connections._new_session()
        try:
            await session.open()
        except Exception as exc:
            self._raise_mapped(exc)
            raise
        self._own = session
        return session

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        own, self._own = self._own, None
        if own is not None:
            try:
                await own.close()
            except Exception as close_exc:
                if exc is None:
                    self._raise_mapped(close_exc)
                    raise
        if isinstance(exc, Exception):
            self._raise_mapped(exc)
        return False

    def _raise_mapped(self, exc: BaseException) -> None:
        if not self._map:
            return
        mapped = self._connections.map_error(self._what, exc)
        if mapped is not None:
            raise mapped from exc
