"""The daemon: connect, run one session, reconnect — for as long as it runs.

The reconnect policy (when to retry, how soon, when to stop) and its constants live in
``_reconnect``; this module runs it.

The daemon owns the ledger (``_ledger``: SQLite in ``data_dir``, or in memory when none
is given), the tool runner for its whole life, and a nursery in which every tool run
executes, so runs survive dropped sockets (see ``_runner``). It prunes the ledger every
``PRUNE_INTERVAL_S``.
"""

from __future__ import annotations

import functools
import logging
import random as _random
import ssl
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
from deskbridge_common import (
    CLOSE_ABNORMAL,
    CLOSE_INTERNAL_ERROR,
    PROTOCOL_VERSION,
    Hello,
    LocalProtocolError,
    Timings,
    Welcome,
    encode_frame,
)

from ._backoff import Backoff
from ._catalogue import acknowledge, catalogue_at_start
from ._consent import ApprovalDesk, file_desk
from ._daemon_stats import DaemonStatistics
from ._dedupe import DedupeCache
from ._errors import (
    ConnectFailed,
    HandshakeRejected,
    LedgerError,
    ProxyAuthFailed,
    ProxyRefused,
    Superseded,
    TokenRefused,
)
from ._graceful import ANSWER_FLUSH_S as ANSWER_FLUSH_S  # re-exported
from ._graceful import give_up_gracefully
from ._ledger import LEDGER_FILE, MAX_ENTRIES, PRUNE_INTERVAL_S, Ledger, job_keep_s
from ._proxy import Proxy
from ._reconnect import (
    CONNECT_FAILED,
    HEALTHY_SESSION_S,
    IMMEDIATE_RECONNECT_CODES,
    QUICK_RETRIES,
    QUICK_RETRY_JITTER_S,
    QUICK_RETRY_STATUSES,
    REJECTED,
    ReconnectPolicy,
    _final_refusal,
)
from ._reconnect import MAX_RETRY_AFTER_S as MAX_RETRY_AFTER_S  # re-exported
from ._reconnect import TRANSIENT_REFUSAL_CODES as TRANSIENT_REFUSAL_CODES  # re-exported
from ._runner import ToolRunner
from ._session import ASLEEP, INTERNAL_ERROR, Session, SessionEnd
from ._sleep import SLEEP_PAUSE_S, wait_for_wake, watch_sleep_notifications
from ._status import write_loop as write_status_loop
from ._tools import STATUS_SPEC, ToolRegistry
from ._transport import Connector, WebSocketConnector, WebSocketSettings, sidecar_url
from ._version import __version__

log = logging.getLogger("deskbridge.sidecar")


def _default_registry(value: ToolRegistry | None) -> ToolRegistry:
    return ToolRegistry() if value is None else value


def _default_timings(value: Timings | None) -> Timings:
    return Timings() if value is None else value


def token_problem(token: str) -> str | None:
    """What makes ``token`` unusable in an ``Authorization`` header (whitespace, a
    control or non-ASCII character: a paste with a newline, a quoted copy), or None.
    Never quotes the token."""
    if not token:
        return "the token is empty"
    for i, ch in enumerate(token):
        if not ch.isascii() or not ch.isprintable() or ch.isspace():
            what = "whitespace" if ch.isspace() else f"the character U+{ord(ch):04X}"
            return (
                f"the token has {what} at position {i + 1} of {len(token)}: pass it exactly "
                "as `deskbridge-hub token USER_ID` printed it"
            )
    return None


def _check_token(instance: object, attribute: object, token: str) -> None:
    if (problem := token_problem(token)) is not None:
        raise ValueError(problem)


def _redacted(text: str, secret: str) -> str:
    return text.replace(secret, "<token>") if secret else text


@attrs.define(eq=False)
class Daemon:
    """The sidecar daemon. Construct, then ``await daemon.run(task_status=...)``.

    Args:
        hub_url: the hub, e.g. ``ws://127.0.0.1:8080`` (``/v1/sidecar`` is appended when
            the URL has no path) or ``wss://hub.example/v1/sidecar``.
        token: the sidecar token, sent as ``Authorization: Bearer <token>``.
        registry: the tools (default: a registry with the built-ins ``echo``, ``sleep``;
            ``status`` is always offered).
        timings: timing knobs (default ``Timings()``; the CLI uses ``Timings.from_env()``).
        wall_clock: Unix time in seconds (job deadlines, watchdog, status); injectable.
        ssl_context: certificate verification for ``wss://`` (default: system trust).
            Ignored when ``connector`` is given.
        connector: how to open sockets (default :class:`WebSocketConnector`; tests pass
            ``deskbridge_sidecar.testing.FakeHub``).
        proxy: an HTTP proxy for the default connector (``CONNECT``; ``_proxy``), or
            None: direct. The CLI takes it from ``HTTPS_PROXY``/``HTTP_PROXY`` and
            ``NO_PROXY`` (:func:`~._proxy.proxy_from_env`); a daemon built in Python reads
            no environment. Ignored when ``connector`` is given.
        websocket: trio-websocket settings for the default connector (default:
            :class:`WebSocketSettings` with ``disconnect_timeout_s`` =
            ``timings.close_timeout_s``).
        random: floats in [0, 1) for backoff jitter; injectable for tests.
        data_dir: directory of the durable ledger (``ledger.sqlite3``); None keeps the
            ledger in memory (gone with the process: embedders and tests). The CLI
            passes the platform data dir (``--data-dir``, ``DESKBRIDGE_DATA_DIR``).
        ledger_max_entries: the ledger's row cap (:data:`~._ledger.MAX_ENTRIES`).
        ledger: a ledger the caller opened and owns (tests, embedders): used instead of
            ``data_dir`` and not closed by the daemon.
        isolate_sync_tools: run every sync tool in a separate process (see
            ``_isolate``; a tool marked ``@isolated`` always does).
        sleep_notifications: call :meth:`going_to_sleep` when the OS says it is about
            to sleep (``_sleep``: Linux logind through ``gdbus``, best effort).
        approvals: where the person approves tools marked ``@needs_approval``
            (``_consent``; default: files in ``<data_dir>/approvals``, decided by
            ``deskbridge-sidecar approve|decline``; with neither, such tools are
            answered ``declined``).
        status_file: where to keep the status read by ``deskbridge-sidecar status``
            (``_status``; the CLI passes ``<data_dir>/status.json``), or None. It is
            written only while this daemon holds its ledger: from just after the
            ledger is opened (and locked) to a final ``stopped`` record just before it
            is released, so a sidecar refused the ledger (another one holds it, the
            directory cannot be used) never touches the holder's status.

    Raises:
        ValueError: ``hub_url`` is not a ws/wss URL with a host, ``token`` has
            whitespace or a character no HTTP header may carry (:func:`token_problem`),
            or the catalogue does not fit in a ``hello`` frame (more than 256 tools, a
            schema that is not JSON).
    """

    hub_url: str
    token: str = attrs.field(repr=False, validator=_check_token)
    registry: ToolRegistry = attrs.field(default=None, converter=_default_registry, kw_only=True)
    timings: Timings = attrs.field(default=None, converter=_default_timings, kw_only=True)
    wall_clock: Callable[[], float] = attrs.field(default=time.time, kw_only=True)
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, kw_only=True)
    connector: Connector | None = attrs.field(default=None, kw_only=True)
    proxy: Proxy | None = attrs.field(default=None, kw_only=True)
    websocket: WebSocketSettings | None = attrs.field(default=None, kw_only=True)
    random: Callable[[], float] = attrs.field(default=_random.random, kw_only=True)
    data_dir: Path | None = attrs.field(default=None, kw_only=True)
    ledger_max_entries: int = attrs.field(default=MAX_ENTRIES, kw_only=True)
    ledger: Ledger | None = attrs.field(default=None, kw_only=True)
    isolate_sync_tools: bool = attrs.field(default=False, kw_only=True)
    sleep_notifications: bool = attrs.field(default=False, kw_only=True)
    approvals: ApprovalDesk | None = attrs.field(default=None, kw_only=True)
    status_file: Path | None = attrs.field(default=None, kw_only=True)
    url: str = attrs.field(init=False)
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _ran: bool = attrs.field(default=False, init=False)
    _started: bool = attrs.field(default=False, init=False)
    _runner: ToolRunner | None = attrs.field(default=None, init=False)
    _session: Session | None = attrs.field(default=None, init=False)
    _connect_attempts: int = attrs.field(default=0, init=False)
    _sessions_started: int = attrs.field(default=0, init=False)
    _reconnects: int = attrs.field(default=0, init=False)
    _last_end: SessionEnd | None = attrs.field(default=None, init=False)
    _daemon_id: str | None = attrs.field(default=None, init=False)
    #: this start's tool fingerprints, recorded as acknowledged at the first welcome
    #: whose record is written (``_catalogue.acknowledge``); None once written
    _unacknowledged: dict[str, str] | None = attrs.field(default=None, init=False)
    _work: trio.Nursery | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.url = sidecar_url(self.hub_url)
        try:
            encode_frame(self._hello())  # fail now, not as a hello the hub never gets
        except LocalProtocolError as exc:
            raise ValueError(f"the tool catalogue cannot be announced: {exc}") from None
        if self.connector is None:
            settings = self.websocket or WebSocketSettings(
                disconnect_timeout_s=self.timings.close_timeout_s
            )
            self.connector = WebSocketConnector(
                ssl_context=self.ssl_context, settings=settings, proxy=self.proxy
            )

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect and serve, reconnecting, until stopped.

        Args:
            task_status: ``started(session_id)`` is called after the first welcome (so
                ``await nursery.start(daemon.run)`` returns the first session id).

        Returns:
            None, after :meth:`stop` (or when the daemon's scope was cancelled).

        Raises:
            TokenRefused: the hub answered the upgrade with 401 or 403 (logged first).
            ProxyAuthFailed: the HTTP proxy refused our credentials with 407 (logged
                first; not retried: :class:`ProxyAuthFailed` says why).
            LedgerLocked: another sidecar process holds the ledger in ``data_dir``.
            LedgerError: the ledger cannot be created or read (a corrupt file is moved
                aside and replaced, not raised).
            RuntimeError: ``run`` was called twice on one daemon.

        Cancellation (:meth:`stop` or the caller's scope): the open socket is closed with
            1001 (bounded by ``close_timeout_s``); running tools are cancelled (async
            tools at their next checkpoint; a sync tool's thread is abandoned) and their
            outcomes are not recorded.
        """
        if self._ran:
            raise RuntimeError("Daemon.run() was already called; create a new Daemon")
        self._ran = True
        failure: TokenRefused | ProxyAuthFailed | Superseded | LedgerError | None = None
        t = self.timings
        if self.ledger is not None:
            ledger = self.ledger
        elif self.data_dir is None:
            ledger = Ledger.memory(
                max_entries=self.ledger_max_entries,
                wall_clock=self.wall_clock,
                job_keep_s=job_keep_s(t.result_ttl_s),
            )
        else:
            ledger = await trio.to_thread.run_sync(
                functools.partial(
                    Ledger.open,
                    Path(self.data_dir) / LEDGER_FILE,
                    max_entries=self.ledger_max_entries,
                    min_keep_s=t.dedupe_ttl_s,
                    wall_clock=self.wall_clock,
                    now=self.wall_clock(),
                    # the hub keeps a forwarded job a day + ITS result TTL (the one these
                    # timings name), not the default's
                    job_keep_s=job_keep_s(t.result_ttl_s),
                )
            )
            log.info("ledger: %s", ledger.path)
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as work:
                    self._runner = ToolRunner(
                        registry=self.registry,
                        cache=DedupeCache(size=t.dedupe_size, ttl_s=t.dedupe_ttl_s),
                        nursery=work,
                        wall_clock=self.wall_clock,
                        ledger=ledger,
                        result_ttl_s=t.result_ttl_s,
                        isolate_sync=self.isolate_sync_tools,
                        approvals=file_desk(self.data_dir)
                        if self.approvals is None
                        else self.approvals,
                    )
                    try:
                        await self._runner.load()
                        at_start = await catalogue_at_start(ledger, self.registry)
                    except LedgerError as exc:  # raised below, not in an exception group
                        failure = exc
                    else:
                        self._runner.changed_tools = at_start.changed
                        self._runner.changed_at = at_start.changed_at
                        self._unacknowledged = dict(at_start.fingerprints)
                        self._work = work
                        self._daemon_id = ledger.instance_id
                        try:
                            await self._run_with_ledger(work, task_status)
                        except (TokenRefused, ProxyAuthFailed, Superseded) as exc:
                            failure = exc
                    work.cancel_scope.cancel()
        finally:
            # The status writer's final record is written when the work nursery is
            # cancelled, above: before the ledger (and with it the data directory) is
            # released here, so it never lands over a successor's status.
            if ledger is not self.ledger:
                ledger.close()
        if failure is not None:
            raise failure

    async def _run_with_ledger(self, work: trio.Nursery, task_status: trio.TaskStatus[str]) -> None:
        """The ledger is open and loaded: write the status, prune, watch for sleep, and
        run the connect loop (which raises TokenRefused, ProxyAuthFailed or Superseded to stop)."""
        assert self._runner is not None
        if self.status_file is not None:  # the ledger is ours, and so is the status
            work.start_soon(self._write_status, self.status_file)
        work.start_soon(self._prune_loop, self._runner)
        if self.sleep_notifications:
            work.start_soon(watch_sleep_notifications, self.going_to_sleep)
        await self._connect_loop(task_status)

    def going_to_sleep(self) -> None:
        """The machine is about to sleep: send ``sleeping`` and close the socket (1000),
        then wait for the wake-up (at most ``SLEEP_PAUSE_S``) before reconnecting
        (``_sleep``). Running tools are left alone. Safe to call at any time; does
        nothing between sessions."""
        session = self._session
        if session is not None and session.going_to_sleep():
            log.info("the machine is going to sleep: told the hub, socket closed")

    def stop(self) -> None:
        """Stop the daemon: :meth:`run` returns soon after. Safe to call at any time."""
        self._cancel_scope.cancel()

    async def shutdown(self, grace_s: float, *, why: str, now: trio.Event | None = None) -> None:
        """Stop on purpose (SIGTERM, Ctrl-C): let a running tool finish, then stop.

        A tool still running after ``grace_s`` (or once ``now`` is set: a second Ctrl-C)
        is given up: the hub is answered ``in_doubt`` for it at once (it may have acted;
        its caller is answered within a second instead of at its timeout) and the ledger
        records it so, then the socket is closed (1001). Jobs still queued are left to
        the hub, which redelivers them when a sidecar of this user is back.

        Args:
            grace_s: seconds a running tool may take to finish (``Timings.grace_s``).
            why: what stopped the sidecar, for the ``in_doubt`` message.
            now: an event that ends the grace early.

        Returns:
            None, after :meth:`stop` was called (``run`` returns soon after).
        """
        await give_up_gracefully(self._runner, lambda: self._session, grace_s, why=why, now=now)
        self.stop()

    @property
    def session_id(self) -> str | None:
        """The current session's id, or None between sessions."""
        session = self._session
        return None if session is None else session.session_id

    def statistics(self) -> DaemonStatistics:
        """Counters for tests and monitoring (a snapshot)."""
        runner = self._runner
        return DaemonStatistics(
            connect_attempts=self._connect_attempts,
            sessions_started=self._sessions_started,
            reconnects=self._reconnects,
            executions=dict(runner.executions) if runner else {},
            dedupe_hits=runner.dedupe_hits if runner else 0,
            dedupe_entries=len(runner.cache) if runner else 0,
            running=runner.running if runner else None,
            session_id=self.session_id,
            last_end=self._last_end,
        )

    # -- internals ---------------------------------------------------------------------

    async def _write_status(self, path: Path) -> None:
        tools = [STATUS_SPEC.name, *self.registry.names()]
        await write_status_loop(self, path, self.url, tools)

    async def _acknowledge(self, fingerprints: dict[str, str], at: float) -> None:
        """Record the catalogue the hub just welcomed (``_catalogue.acknowledge``),
        shielded: a stop right after the welcome must not lose it. A failed write is
        one WARNING and is tried again at the next welcome; meanwhile the record says
        less than the hub has, which only refuses more jobs at the next start."""
        assert self._runner is not None
        with trio.CancelScope(shield=True):
            try:
                await acknowledge(self._runner.ledger, fingerprints, at)
            except LedgerError as exc:
                log.warning("could not record the catalogue the hub acknowledged: %s", exc)
                self._unacknowledged = fingerprints

    @staticmethod
    async def _prune_loop(runner: ToolRunner) -> None:
        while True:
            await trio.sleep(PRUNE_INTERVAL_S)
            await runner.prune()

    def _hello(self, slept_s: float | None = None) -> Hello:
        return Hello(
            protocol_version=PROTOCOL_VERSION,
            sidecar_version=__version__,
            tools=(STATUS_SPEC, *self.registry.specs()),
            daemon_id=self._daemon_id,
            slept_s=slept_s,
        )

    def _on_welcome(self, task_status: trio.TaskStatus[str], welcome: Welcome) -> None:
        self._sessions_started += 1
        if self._runner is not None and self._runner.serving_since is None:
            self._runner.serving_since = trio.current_time()
        if self._unacknowledged is not None and self._work is not None:
            self._work.start_soon(self._acknowledge, self._unacknowledged, self.wall_clock())
            self._unacknowledged = None
        log.info(
            "welcomed by hub: session %s (ping every %g s, timeout %g s)",
            welcome.session_id,
            welcome.ping_interval_s,
            welcome.ping_timeout_s,
        )
        if not self._started:
            self._started = True
            task_status.started(welcome.session_id)

    async def _connect_loop(self, task_status: trio.TaskStatus[str]) -> None:
        t = self.timings
        assert self.connector is not None and self._runner is not None
        backoff = Backoff(initial_s=t.backoff_initial_s, max_s=t.backoff_max_s, random=self.random)
        policy = ReconnectPolicy(backoff, self.random, self.url)
        headers = [("Authorization", f"Bearer {self.token}")]
        slept_s: float | None = None  # told in each hello until a session is welcomed
        on_welcome = functools.partial(self._on_welcome, task_status)
        while True:
            rejected_status: int | None = None
            retry_after_s: float | None = None
            self._connect_attempts += 1
            log.info(
                "connecting to %s%s (attempt %d)",
                self.url,
                f" through proxy {self.proxy.label}" if self.proxy is not None else "",
                self._connect_attempts,
            )
            started_at = trio.current_time()
            try:
                async with self.connector.connect(self.url, headers) as transport:
                    log.info("connected to %s; sending hello", self.url)
                    session = Session(
                        transport=transport,
                        runner=self._runner,
                        timings=t,
                        wall_clock=self.wall_clock,
                        hello=self._hello(slept_s),
                        on_welcome=on_welcome,
                    )
                    self._session = session
                    try:
                        end = await session.run()
                    except Exception:
                        log.exception("session failed with an internal error")
                        end = SessionEnd(
                            cause=INTERNAL_ERROR,
                            code=CLOSE_INTERNAL_ERROR,
                            reason="internal error",
                            by_hub=False,
                            session_id=session.session_id,
                            duration_s=trio.current_time() - started_at,
                        )
                    finally:
                        self._session = None
            except HandshakeRejected as exc:
                if _final_refusal(exc):
                    log.error(
                        "token refused by hub (%d): issue a new one with "
                        "`deskbridge-hub token USER_ID`%s",
                        exc.status_code,
                        f" (hub says: {exc.message})" if exc.message else "",
                    )
                    # kept for `deskbridge-sidecar status`: the final status record says why
                    self._last_end = self._failed(
                        REJECTED, f"token refused: hub answered {exc.describe()}", started_at
                    )
                    raise TokenRefused(exc.status_code) from None
                rejected_status = exc.status_code
                retry_after_s = exc.retry_after_s
                why = f"hub refused the upgrade with {exc.describe()}"
                # a wrong path (405: a route the hub serves to POST, pasted from the
                # HTTP API's examples): say which one serves sidecars
                if exc.status_code in (404, 405):
                    why += (
                        f"; no sidecar endpoint at {self.url}: check --hub (the hub's is "
                        "/v1/sidecar, which a URL without a path gets)"
                    )
                end = self._failed(REJECTED, why, started_at)
            except ProxyRefused as exc:
                if exc.status_code == 407:  # credentials read once: retrying cannot help
                    log.error("%s; not retried: fix the proxy URL and start again", exc)
                    self._last_end = self._failed(CONNECT_FAILED, str(exc), started_at)
                    raise ProxyAuthFailed(str(exc)) from None
                end = self._failed(CONNECT_FAILED, str(exc), started_at)
            except ConnectFailed as exc:
                end = self._failed(CONNECT_FAILED, str(exc), started_at)
            except Exception:  # a bug or an unmapped library error: log it, keep going
                # the traceback of an HTTP library may quote the Authorization header
                log.error(
                    "connection to %s failed with an internal error\n%s",
                    self.url,
                    _redacted(traceback.format_exc().rstrip(), self.token),
                )
                end = self._failed(INTERNAL_ERROR, "internal error", started_at)
            self._last_end = end
            slept_s = None if end.welcomed else slept_s
            if end.slept_s is not None:
                slept_s = end.slept_s
            if end.cause == ASLEEP:
                t = self.timings
                slept_s = await wait_for_wake(
                    pause_s=SLEEP_PAUSE_S,
                    interval_s=t.watchdog_interval_s,
                    gap_s=t.wedge_gap_s,
                    wall_clock=self.wall_clock,
                )
            delay = policy.after(end, rejected_status=rejected_status, retry_after_s=retry_after_s)
            self._reconnects += 1
            await trio.sleep(delay)

    @staticmethod
    def _failed(cause: str, reason: str, started_at: float) -> SessionEnd:
        return SessionEnd(
            cause=cause,
            code=CLOSE_ABNORMAL,
            reason=reason,
            by_hub=True,
            session_id=None,
            duration_s=trio.current_time() - started_at,
        )


async def run_daemon(
    hub_url: str,
    token: str,
    *,
    registry: ToolRegistry | None = None,
    timings: Timings | None = None,
    wall_clock: Callable[[], float] = time.time,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a :class:`Daemon` built from these arguments (see :meth:`Daemon.run`).

    Stop it by cancelling the enclosing scope.

    Raises:
        TokenRefused: the hub refused the token (401/403).
        ValueError: bad ``hub_url``.
    """
    daemon = Daemon(
        hub_url,
        token,
        registry=registry,
        timings=timings,
        wall_clock=wall_clock,
        ssl_context=ssl_context,
    )
    await daemon.run(task_status=task_status)


__all__ = [
    "CONNECT_FAILED",
    "HEALTHY_SESSION_S",
    "IMMEDIATE_RECONNECT_CODES",
    "QUICK_RETRIES",
    "QUICK_RETRY_JITTER_S",
    "QUICK_RETRY_STATUSES",
    "REJECTED",
    "Daemon",
    "DaemonStatistics",
    "run_daemon",
]
