"""``deskbridge-sidecar``: run the sidecar daemon on the user's machine.

    deskbridge-sidecar run --hub ws://HOST:PORT --token TOKEN [--tools MODULE]...

Exit status: 0 after SIGTERM, 130 after Ctrl-C, 3 when superseded by a newer sidecar of
the same user (4001), 2 for a usage error, when the hub
refuses the token (401/403: issue a new one with ``deskbridge-hub token USER_ID``), or
when the ledger cannot be used (another sidecar holds it, or its directory is not
writable), 75 (``EX_TEMPFAIL``) when the disk is too full to open the ledger or another
fault of the disk or machine stops it (``EIO``, ``EMFILE``): temporary, so a service
manager restarts it. Under ``--launchd`` (the launchd agent) 2 and 3 exit 0
instead: launchd restarts on any non-zero exit and has no per-status rule (see
``_service``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys
import traceback
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

import trio
from deskbridge_common import Timings
from deskbridge_common._envnames import misspelling_hint, unknown_variable_lines

from . import _config, _service_cli
from ._daemon import Daemon, token_problem
from ._errors import LedgerFull, LedgerTemporary, ProxyAuthFailed, Superseded, TokenRefused
from ._ledger import LEDGER_FILE, LedgerError, final_os_error
from ._logformat import make_formatter
from ._proxy import PROXY_VARIABLES, Proxy, proxy_from_env
from ._tools import ToolRegistry
from ._transport import sidecar_url
from ._version import __version__
from .toolsets import _options as toolset_options

log = logging.getLogger("deskbridge.sidecar.cli")

_EPILOG = """\
environment:
  DESKBRIDGE_HUB_URL   hub URL when --hub is not given
  DESKBRIDGE_TOKEN     token when --token is not given (preferred: arguments show in ps)
  DESKBRIDGE_DATA_DIR  directory of the job ledger when --data-dir is not given
  HTTPS_PROXY, HTTP_PROXY, NO_PROXY (or lower case)
                       reach a wss:// (ws://) hub through this HTTP proxy
                       (http://[user:pass@]host:port, CONNECT), unless NO_PROXY
                       lists the hub's host (docs/operations.md); --no-proxy: never
  DESKBRIDGE_<NAME>    timing overrides in seconds, e.g. DESKBRIDGE_PING_TIMEOUT_S=10,
                       DESKBRIDGE_BACKOFF_MAX_S=30, DESKBRIDGE_DEDUPE_TTL_S=300,
                       DESKBRIDGE_WEDGE_GAP_S=5 (any field of deskbridge_common.Timings)

exit status:
  0    stopped by SIGTERM (a running tool gets DESKBRIDGE_GRACE_S, 20 s, to finish;
       past it, or on a second signal, the hub is told in_doubt for it; a tool that
       ignores cancellation is left behind 5 s later: the process exits anyway)
  2    usage error, the hub refused the token (HTTP 401/403), the HTTP proxy
       refused its credentials (407), or the ledger cannot be used (another
       sidecar holds it; directory not writable)
  75   the disk (or quota) is too full to open the ledger, or another fault of the
       disk or machine (I/O error, too many open files): temporary, so a service
       manager restarts the sidecar (EX_TEMPFAIL; not 2: it is no final stop)
  3    superseded: a newer sidecar for this user connected (the hub closed this one
       with 4001); not restarted, so the two do not take the user from each other
  130  interrupted (Ctrl-C; same grace as SIGTERM, Ctrl-C again stops at once)
  With --launchd (the launchd agent of install-service), 2 and 3 are reported as 0:
  launchd restarts on any non-zero exit, and restarting would not help.
"""

_RUN_DESCRIPTION = """\
Dial out to the hub's /v1/sidecar WebSocket, announce the tools, and run the jobs the
hub relays: one tool at a time, each idempotency key at most once (recorded on disk
until the job's deadline + 300 s, across restarts; a job cut short by a crash is
answered in_doubt, never run again), status answered at once. Reconnects with
full-jitter backoff (at once when the hub restarts); stops when the hub refuses the
token.

Built-in tools: echo (returns its args), sleep (seconds), status.
--tools MODULE imports MODULE (the current directory is on the import path) and adds
every function decorated with deskbridge_sidecar.tool."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    return _build_parsers()[0]


def _build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="deskbridge-sidecar",
        description="deskbridge sidecar: runs tools on this machine for a cloud agent.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="connect to the hub and serve tools until stopped",
        description=_RUN_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--hub",
        metavar="URL",
        help="hub URL, e.g. ws://127.0.0.1:8080 or wss://hub.example "
        "(/v1/sidecar is appended when there is no path; default $DESKBRIDGE_HUB_URL)",
    )
    run.add_argument(
        "--token",
        metavar="TOKEN",
        help="sidecar token from `deskbridge-hub token USER_ID` (default $DESKBRIDGE_TOKEN)",
    )
    run.add_argument(
        "--tools",
        metavar="MODULE",
        action="append",
        default=[],
        help="import MODULE and offer its @tool functions (repeatable)",
    )
    run.add_argument(
        "--isolate-sync-tools",
        action="store_true",
        help="run every sync tool in a separate process, so a long C call holding the "
        "GIL cannot stall the connection (a tool marked @isolated always does)",
    )
    run.add_argument(
        "--no-proxy",
        action="store_true",
        help="connect to the hub directly, whatever HTTPS_PROXY / HTTP_PROXY say",
    )
    run.add_argument(
        "--no-sleep-notifications",
        action="store_true",
        help="do not watch the OS's sleep notifications (Linux logind through gdbus; "
        "by default the hub is told before the machine sleeps, best effort)",
    )
    run.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where the job ledger lives (default $DESKBRIDGE_DATA_DIR, else the "
        f"platform's user data dir: {_default_data_dir()})",
    )
    run.add_argument(
        "--ca-file",
        metavar="PATH",
        help="PEM file of CA certificates to verify a wss:// hub (default: system trust store)",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging: -v debug for deskbridge, -vv also for trio-websocket",
    )
    run.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (default INFO; -v means DEBUG)",
    )
    run.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML config file (default $DESKBRIDGE_CONFIG, else {_config.default_config_path()}"
        " if it exists): hub, tools, ca_file, log_file, data_dir",
    )
    run.add_argument(
        "--log-file",
        metavar="PATH",
        help="also log to PATH, rotated at 5 MiB, 3 old files kept (default: log_file in the "
        "config file)",
    )
    run.add_argument(
        "--launchd",
        action="store_true",
        help="run as the launchd agent (install-service on macOS): exit 0 instead of 2 or 3 "
        "when restarting would not help, since launchd's KeepAlive restarts on any non-zero "
        "exit; a crash still exits non-zero and is restarted",
    )
    toolset_options.add_arguments(run)
    verbs = (("approve", "let it run"), ("decline", "refuse it (its caller is answered declined)"))
    for verb, what in verbs:
        decide_parser = commands.add_parser(
            verb,
            help=f"{what}: a job waiting for your approval (tools marked needs_approval)",
            description=f"{what.capitalize()}: the job JOB_ID (from `deskbridge-sidecar "
            "pending`), which a tool marked needs_approval holds until you decide. Exit 0 "
            "when recorded, 1 when no such job is waiting.",
        )
        decide_parser.add_argument("job_id", metavar="JOB_ID")
        decide_parser.add_argument("--data-dir", metavar="DIR", help="as given to run")
    listing = commands.add_parser(
        "pending",
        help="list the jobs waiting for your approval",
        description="List the jobs waiting for your approval, one a line: JOB_ID, tool, "
        "args (JSON). Nothing waiting: an empty standard output and a note on stderr.",
    )
    listing.add_argument("--data-dir", metavar="DIR", help="as given to run")
    _service_cli.add_commands(commands)
    return parser, run


def _consent_command(args: argparse.Namespace) -> int:
    from ._consent import check_job_id, command_for, decide, pending

    data_dir = Path(args.data_dir or os.environ.get("DESKBRIDGE_DATA_DIR") or _default_data_dir())
    problem = _service_cli.data_dir_problem(data_dir)
    if problem is None and args.command != "pending":
        try:
            check_job_id(args.job_id)
        except ValueError as exc:
            problem = f"JOB_ID: {exc}"
    if problem:
        print(f"deskbridge-sidecar {args.command}: {problem}", file=sys.stderr)
        return 2
    if args.command == "pending":
        requests = pending(data_dir)
        for request in requests:
            # the id as a shell word (quoted unless plain): it is the caller's choice
            word = command_for("approve", request["job_id"]).split(" ", 2)[2]
            print(f"{word}  {request['tool']}  {json.dumps(request['args'])}")
        if not requests:  # stderr: stdout stays empty for scripts
            print(f"no job is waiting for approval (in {data_dir})", file=sys.stderr)
        return 0
    try:
        decide(data_dir, args.job_id, approve=args.command == "approve")
    except (LookupError, ValueError) as exc:
        print(f"deskbridge-sidecar {args.command}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.job_id}: {args.command}d")
    return 0


def _default_data_dir() -> str:
    import platformdirs

    return platformdirs.user_data_dir("deskbridge", appauthor=False)


def load_registry(modules: Sequence[str]) -> ToolRegistry:
    """A registry with the built-ins plus the ``@tool`` functions of ``modules``.

    Raises:
        ImportError: a module cannot be imported.
        ValueError: a module has no ``@tool`` functions, or two tools share a name.
    """
    registry = ToolRegistry()
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        registry.add_module(name)
    return registry


def _missing(module: str, exc: ImportError) -> str:
    """The ImportError of ``--tools module`` in one line. When what is missing is not the
    module itself but one of its imports (``import requests`` in it), say where and in
    which Python to install it: "No module named 'requests'" alone read as "my module
    was not found", and the package was usually installed in another Python."""
    missing = exc.name or ""
    if not missing or module == missing or module.startswith(missing + "."):
        return str(exc)
    return (
        f"{_import_failure(exc)}: install it in the Python that runs the sidecar "
        f"({sys.executable} -m pip install ...)"
    )


def _import_failure(exc: BaseException) -> str:
    """``SyntaxError: invalid syntax (tools.py, line 3)`` or ``NameError: ... (path, line 7)``:
    the error and where it happened in the user's module, for a one-line usage error."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def make_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """Client TLS context verifying the hub: ``ca_file`` if given, else the system store.

    Raises:
        OSError: ``ca_file`` cannot be read.
        ssl.SSLError: ``ca_file`` holds no usable certificate.
    """
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)


def _configure_logging(verbose: int, level_name: str | None) -> None:
    level = (
        getattr(logging, level_name) if level_name else (logging.DEBUG if verbose else logging.INFO)
    )
    handler = logging.StreamHandler()
    handler.setFormatter(make_formatter())  # DESKBRIDGE_LOG_FORMAT: text or json
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("deskbridge").setLevel(level)
    logging.getLogger("trio-websocket").setLevel(logging.DEBUG if verbose > 1 else logging.WARNING)


#: Exit status after the hub closed this sidecar with 4001 (a newer one connected).
EXIT_SUPERSEDED = 3
#: Exit status after Ctrl-C (SIGINT), as shells report a process ended by it.
EXIT_INTERRUPTED = 130
#: Exit status when the ledger cannot be opened for a full disk or quota
#: (``LedgerFull``) or another disk or machine fault (``LedgerTemporary``):
#: ``EX_TEMPFAIL`` of sysexits.h, "try again later". Not final:
#: systemd (``Restart=on-failure``) and launchd restart it, as after a crash.
EXIT_TEMPORARY = 75


async def _serve(daemon: Daemon) -> int:
    status = 0
    stopped_by: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signals, daemon, stopped_by)
        try:
            await daemon.run()
        except (TokenRefused, ProxyAuthFailed):  # logged by the daemon
            status = 2
        except Superseded:
            status = EXIT_SUPERSEDED
        except LedgerFull as exc:
            log.error("%s; exiting %d to be restarted once there is room", exc, EXIT_TEMPORARY)
            status = EXIT_TEMPORARY
        except LedgerTemporary as exc:  # a disk or machine fault: was exit 2, final
            log.error("%s; exiting %d to be restarted", exc, EXIT_TEMPORARY)
            status = EXIT_TEMPORARY
        except LedgerError as exc:
            log.error("%s", exc)
            status = 2
        nursery.cancel_scope.cancel()
    if stopped_by:
        return EXIT_INTERRUPTED if stopped_by[0] == signal.SIGINT else 0
    return status


async def _stop_on_signals(daemon: Daemon, stopped_by: list[int]) -> None:
    """SIGTERM or Ctrl-C: one line, then a graceful stop (a running tool may finish
    within ``grace_s``; past it, or on a second signal, it is answered in_doubt)."""
    grace_s = daemon.timings.grace_s
    now = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
                if stopped_by:
                    log.warning("%s again: stopping now", name)
                    now.set()
                    continue
                stopped_by.append(signum)
                running = daemon.statistics().running
                if running:
                    log.warning(
                        "%s: stopping; waiting up to %g s for %s to finish (%s again to stop "
                        "now: it is then reported in_doubt)",
                        name,
                        grace_s,
                        running,
                        name,
                    )
                else:
                    log.info("%s: stopping", name)
                why = f"the sidecar was stopped ({name})"
                status = EXIT_INTERRUPTED if signum == signal.SIGINT else 0
                nursery.start_soon(_shutdown_bounded, daemon, grace_s, why, now, status)


#: After a graceful stop has answered every running tool (in_doubt past the grace), how
#: long the process may still wait for a tool that ignores cancellation, seconds.
STOP_BOUND_S = 5.0


async def _shutdown_bounded(
    daemon: Daemon, grace_s: float, why: str, now: trio.Event, status: int
) -> None:
    """``daemon.shutdown``, then exit the process with ``status`` if the daemon has not
    returned within :data:`STOP_BOUND_S` (a tool that ignores cancellation keeps its
    task, hence the daemon, alive: its caller was answered in_doubt and the ledger
    records so). Cancelled (the normal case) when the daemon returns first."""
    await daemon.shutdown(grace_s, why=why, now=now)
    await trio.sleep(STOP_BOUND_S)
    running = daemon.statistics().running
    log.error(
        "%s still running %g s after it was given up (it ignores cancellation); exiting "
        "without it (it was answered in_doubt)",
        running or "a tool",
        STOP_BOUND_S,
    )
    logging.shutdown()
    os._exit(status)


#: Exit statuses meaning "stopped for good: restarting would not help" (usage error, token
#: refused, ledger unusable; superseded), reported as 0 under ``--launchd``.
FINAL_EXIT_STATUSES = frozenset({2, EXIT_SUPERSEDED})


def _for_launchd(status: int) -> int:
    """0 for a final ``status`` (:data:`FINAL_EXIT_STATUSES`), with one line on stderr; else
    ``status``. launchd's ``KeepAlive`` has no per-status rule: ``SuccessfulExit: false``
    restarts on any non-zero exit, so "stopped for good" must exit 0 under it."""
    if status not in FINAL_EXIT_STATUSES:
        return status
    print(
        f"deskbridge-sidecar: stopped for good (exit status {status}); exiting 0 instead "
        "(--launchd), so that launchd does not restart it",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deskbridge-sidecar``; returns the exit status."""
    parser, run_parser = _build_parsers()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        if args.command in ("approve", "decline", "pending") or (
            args.command in _service_cli.COMMANDS
        ):
            return _one_shot(args)
        if args.command != "run":
            parser.print_help(sys.stderr)
            return 2
        daemon = _daemon_from_args(run_parser, args)
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        status = exc.code if isinstance(exc.code, int) else 2
        return _for_launchd(status) if getattr(args, "launchd", False) else status
    try:
        status = trio.run(_serve, daemon)
    except KeyboardInterrupt:  # Ctrl-C before the signal receiver was installed
        return EXIT_INTERRUPTED
    finally:
        for close in _CLOSERS:
            close()
    return _for_launchd(status) if getattr(args, "launchd", False) else status


def _one_shot(args: argparse.Namespace) -> int:
    """Run a command other than ``run``. Ctrl-C (``set-token`` waiting for the token on
    standard input, ``install-service --now`` waiting for systemctl) is one line and 130,
    as ``deskbridge-hub``'s commands say it (was a KeyboardInterrupt traceback)."""
    try:
        if args.command in _service_cli.COMMANDS:
            return _service_cli.run(args)
        return _consent_command(args)
    except KeyboardInterrupt:
        print(f"deskbridge-sidecar {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


#: Toolset clean-ups to run once the daemon has stopped (the browser).
_CLOSERS: list[Callable[[], None]] = []


def _route_line(url: str, proxy: Proxy | None, no_proxy_flag: bool) -> str | None:
    """How the hub is reached, for the start line: through which proxy, or direct and
    why; None when no proxy variable is set (nothing to say)."""
    if proxy is not None:
        return f"through proxy {proxy.label} ({proxy.variable})"
    scheme = url.partition(":")[0]
    named = [name for name in PROXY_VARIABLES.get(scheme, ()) if os.environ.get(name, "").strip()]
    if not named:
        return None
    if no_proxy_flag:
        return f"direct (--no-proxy; {named[0]} is ignored)"
    host = urllib.parse.urlsplit(url).hostname
    return f"direct (NO_PROXY matches {host})"


def _daemon_from_args(run_parser: argparse.ArgumentParser, args: argparse.Namespace) -> Daemon:
    try:  # the config file and the stored token fill in what flags and variables do not
        cfg = _config.load_config(
            Path(args.config) if args.config else None, required=bool(args.config)
        )
        stored_token = _config.load_token()
    except _config.ConfigError as exc:
        run_parser.error(str(exc))
    hub = args.hub or os.environ.get("DESKBRIDGE_HUB_URL") or cfg.hub
    token = args.token or os.environ.get("DESKBRIDGE_TOKEN") or stored_token
    args.tools = [*cfg.tools, *args.tools]
    args.ca_file = args.ca_file or cfg.ca_file
    args.log_file = args.log_file or cfg.log_file
    args.data_dir = args.data_dir or os.environ.get("DESKBRIDGE_DATA_DIR") or cfg.data_dir
    if not hub:
        run_parser.error(
            "the hub URL is required: --hub URL or DESKBRIDGE_HUB_URL"
            + misspelling_hint("DESKBRIDGE_HUB_URL")
        )
    token = (token or "").strip()  # a pasted token's newline or a stray space
    if not token:
        run_parser.error(
            "a token is required: --token TOKEN, DESKBRIDGE_TOKEN or `deskbridge-sidecar set-token`"
            + misspelling_hint("DESKBRIDGE_TOKEN")
        )
    if (problem := token_problem(token)) is not None:
        run_parser.error(f"--token / DESKBRIDGE_TOKEN: {problem}")
    try:
        url = sidecar_url(hub)
    except ValueError as exc:
        run_parser.error(f"--hub: {exc}")
    try:
        timings = Timings.from_env()
    except ValueError as exc:
        run_parser.error(f"bad timing in the environment: {exc}")
    try:
        proxy = None if args.no_proxy else proxy_from_env(url, os.environ)
    except ValueError as exc:  # names the variable, never the password
        run_parser.error(str(exc))
    ssl_context = None
    if args.ca_file:
        if not url.startswith("wss://"):
            run_parser.error("--ca-file needs a wss:// hub URL")
        try:
            ssl_context = make_ssl_context(args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            run_parser.error(f"--ca-file {args.ca_file}: {exc}")
    for name in args.tools:
        if "/" in name or os.sep in name or name.endswith(".py"):
            # importlib's own words for a path were a TypeError about relative imports
            stem = os.path.splitext(os.path.basename(name))[0] or "my_tools"
            run_parser.error(
                f"--tools {name!r}: expected a module name, not a file path (e.g. --tools "
                f"{stem}, run from the file's folder or with it on PYTHONPATH)"
            )
    registry = load_registry([])
    if args.tools and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as load_registry does
    for module in args.tools:  # one at a time, so an import failure names its module
        try:
            registry.add_module(module)
        except ImportError as exc:
            run_parser.error(f"--tools {module}: cannot import: {_missing(module, exc)}")
        except ValueError as exc:
            run_parser.error(f"--tools: {exc}")
        except (Exception, SystemExit) as exc:  # the tool module's own bug at import
            # (SystemExit too: sys.exit(3) at import exited 3, a superseded sidecar's status)
            run_parser.error(f"--tools: cannot import: {_import_failure(exc)}")
    try:
        _CLOSERS.extend(toolset_options.add_toolsets(args, registry))
    except ValueError as exc:
        run_parser.error(str(exc))
    _configure_logging(args.verbose, args.log_level)
    for line in unknown_variable_lines():  # as the hub does: a typo'd knob is not silent
        log.warning(line)
    if args.log_file:
        try:
            _service_cli.log_to_file(args.log_file)
        except OSError as exc:
            if final_os_error(exc) or exc.errno in (None, 0):
                run_parser.error(f"--log-file {args.log_file}: {exc}")
            # a disk or machine fault (EIO, EMFILE, ENOSPC): temporary, as for the ledger;
            # it exited 2, "stopped for good", whatever it was
            print(
                f"deskbridge-sidecar run: --log-file {args.log_file}: {exc}; exiting "
                f"{EXIT_TEMPORARY} to be restarted",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_TEMPORARY) from None
    data_dir = args.data_dir or os.environ.get("DESKBRIDGE_DATA_DIR") or _default_data_dir()
    log.info("deskbridge-sidecar %s: tools %s", __version__, ["status", *registry.names()])
    log.debug("ledger file: %s", os.path.join(data_dir, LEDGER_FILE))
    if (route := _route_line(url, proxy, args.no_proxy)) is not None:
        log.info("hub connection: %s", route)
    return Daemon(
        hub,
        token,
        registry=registry,
        timings=timings,
        ssl_context=ssl_context,
        proxy=proxy,
        data_dir=Path(data_dir),
        isolate_sync_tools=args.isolate_sync_tools,
        sleep_notifications=not args.no_sleep_notifications,
        # for `deskbridge-sidecar status`; written only while this daemon holds the ledger
        status_file=Path(data_dir) / _service_cli.STATUS_FILE,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
