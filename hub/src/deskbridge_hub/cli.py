"""``deskbridge-hub``: serve the hub, issue and revoke sidecar tokens, call a tool over the
HTTP API, inspect a running hub and cancel a job (``_inspect_cli``, ``_cancel_cli``,
``_revoke_cli``)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from deskbridge_common import _strict_json as strict_json
from deskbridge_common._envnames import misspelling_hint

from . import _cancel_cli, _inspect_cli, _revoke_cli
from ._bridge_jobs import ARGS_ENCODER, MAX_TIMEOUT_S
from ._cli_args import (
    add_hub_option,
    checked,
    hub_url_problem,
    integer,
    key_not_set,
    seconds,
    unreachable_hint,
)
from ._config import DEFAULT_MAX_ARGS_BYTES, MEMORY_URL, max_args_bytes, redis_url_problem
from ._http_body import finite_float, json_problem, no_constant
from ._tokens import DEFAULT_TOKEN_LIFETIME_S, check_secret, issue_token
from ._validate import validate_key, validate_tool_name, validate_user_id

EPILOG = """environment:
  DESKBRIDGE_REDIS_URL   Redis URL (redis://host:port/db); memory:// (or absent, with
                         serve --workers 1) -> in-memory substrate, one worker only
  DESKBRIDGE_SECRET      signs and verifies sidecar tokens (required by serve and token)
  DESKBRIDGE_PREVIOUS_SECRETS  comma-separated older secrets still accepted (rotation)
  DESKBRIDGE_API_KEY     bearer key(s) for the HTTP dispatch API (comma-separated)
  DESKBRIDGE_HUB_HTTP    the hub call, inspect and cancel talk to without --hub
                         (default http://127.0.0.1:8080)
  DESKBRIDGE_<TIMING>    timing overrides, e.g. DESKBRIDGE_RECLAIM_IDLE_S (docs/operations.md)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deskbridge-hub",
        description="deskbridge hub: relays jobs from any backend replica to users' sidecars.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="run the hub under Hypercorn (trio workers)",
        description="Run the hub: WebSocket /v1/sidecar and the HTTP API, under Hypercorn "
        "with trio workers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--bind",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:8080)",
    )
    s.add_argument(
        "--workers",
        type=integer(1, MAX_WORKERS),
        default=1,
        metavar="N",
        help=f"worker processes, 1-{MAX_WORKERS} (default 1; more than 1 needs "
        "DESKBRIDGE_REDIS_URL)",
    )
    s.add_argument("--certfile", help="TLS certificate (PEM) to serve wss:// and https://")
    s.add_argument("--keyfile", help="TLS private key (PEM)")
    s.add_argument(
        "--graceful-timeout-s",
        type=float,
        default=None,
        help="seconds running jobs get to finish on shutdown, at most "
        f"{MAX_GRACE_S:.0f} (default DESKBRIDGE_GRACE_S=20)",
    )
    s.add_argument(
        "--log-level",
        default=os.environ.get("DESKBRIDGE_LOG_LEVEL", "INFO").upper(),
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of every worker (default $DESKBRIDGE_LOG_LEVEL or INFO)",
    )

    t = sub.add_parser(
        "token",
        help="issue a sidecar token for a user (signed with DESKBRIDGE_SECRET)",
        description="Print a sidecar token for USER_ID, signed with DESKBRIDGE_SECRET.",
    )
    t.add_argument("user_id", metavar="USER_ID")
    t.add_argument(
        "--lifetime-s",
        type=float,
        default=DEFAULT_TOKEN_LIFETIME_S,
        help=f"seconds until the token expires, positive and at most "
        f"{MAX_TOKEN_LIFETIME_S:.0f} (10 years) (default {DEFAULT_TOKEN_LIFETIME_S:.0f}, 30 days)",
    )

    c = sub.add_parser(
        "call",
        help="call a tool on a user's desktop through a running hub's HTTP API",
        description="POST /v1/users/USER_ID/jobs on a running hub and print the JSON answer, "
        "authenticated with the first key of $DESKBRIDGE_API_KEY. "
        "Exit 0 when completed, 1 for any other outcome, 2 for usage errors, 130 on Ctrl-C.",
    )
    c.add_argument("user_id", metavar="USER_ID")
    c.add_argument("tool", metavar="TOOL", type=checked(validate_tool_name))
    c.add_argument("--args", default="{}", metavar="JSON", help="tool arguments as a JSON object")
    add_hub_option(c)
    c.add_argument(
        "--idempotency-key",
        default=None,
        type=checked(validate_key),
        help="a retry with the same key gets the first call's job, never a second run "
        "(1-200 printable ASCII characters without spaces)",
    )
    c.add_argument(
        "--timeout-s",
        type=seconds(MAX_TIMEOUT_S),
        default=None,
        help=f"seconds to wait, in (0, {MAX_TIMEOUT_S:.0f}] (default 90)",
    )
    _revoke_cli.add_parser(sub)
    _inspect_cli.add_parser(sub)
    _cancel_cli.add_parser(sub)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deskbridge-hub")
    except PackageNotFoundError:  # running from a source tree without installing
        from . import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deskbridge-hub``; returns the exit status (2: a usage error, one
    line naming the option, as argparse says it)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "serve":
        return _serve(args)
    try:
        if args.command == "token":
            return _token(args)
        if args.command == "call":
            return _call(args)
        if args.command == "cancel":
            return _cancel_cli.run(args)
        if args.command == "revoke":
            return _revoke_cli.run(args)
        return _inspect_cli.run(args)
    except BrokenPipeError:
        # `deskbridge-hub inspect desktops | head`: the reader left (was a traceback).
        # The Python docs' recipe: stdout to devnull, so the flush at exit is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, not urllib's traceback; 130 as a shell
        print(f"deskbridge-hub {args.command}: interrupted{_left_behind(args)}", file=sys.stderr)
        return 130
    except BaseExceptionGroup as group:  # Ctrl-C inside trio's nurseries (revoke)
        if group.split(KeyboardInterrupt)[1] is not None:
            raise
        print(f"deskbridge-hub {args.command}: interrupted{_left_behind(args)}", file=sys.stderr)
        return 130


def _left_behind(args: argparse.Namespace) -> str:
    """What a Ctrl-C leaves behind, said after "interrupted": a job the hub took runs to
    its outcome when its HTTP caller goes away (docs/architecture.md)."""
    if args.command == "revoke":
        return (
            "; the revocation may or may not be recorded: run deskbridge-hub revoke "
            f"{args.user_id} again (repeating it is safe)"
        )
    if args.command == "cancel":
        return (
            "; the cancel may or may not have reached the hub: run it again (repeating "
            "it is safe)"
        )
    if args.command != "call":
        return ""
    if args.idempotency_key is not None:
        return (
            "; if the hub had the call, its job may still run: retry with the same "
            "--idempotency-key to get its outcome without a second run"
        )
    return (
        "; if the hub had the call, its job may still run (`deskbridge-hub inspect user "
        f"{args.user_id}` lists pending jobs); --idempotency-key makes a retry safe"
    )


#: Most ``serve --workers``: each worker is a process with its own Redis connections
#: (up to ``DESKBRIDGE_REDIS_MAX_CONNECTIONS``) and reader; more hub capacity than this
#: on one machine is more pods, not more workers (``100000`` forked until the host died).
MAX_WORKERS = 64

#: The longest ``serve --graceful-timeout-s`` (seconds): one day, the longest a call waits.
#: ``inf`` was accepted: a drain that never gave up.
MAX_GRACE_S = MAX_TIMEOUT_S

#: The longest ``token --lifetime-s`` (seconds): 10 years. Beyond it a number is a typo
#: (``1e300`` was accepted, and so was the token it made).
MAX_TOKEN_LIFETIME_S = 10 * 365 * 86_400.0


def _token(args: argparse.Namespace) -> int:
    secret = os.environ.get("DESKBRIDGE_SECRET", "")
    if not secret:
        hint = misspelling_hint("DESKBRIDGE_SECRET")
        print(f"deskbridge-hub token: DESKBRIDGE_SECRET is not set{hint}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.lifetime_s) and 0 < args.lifetime_s <= MAX_TOKEN_LIFETIME_S):
        print(
            "deskbridge-hub token: --lifetime-s must be a positive number of seconds, at "
            f"most {MAX_TOKEN_LIFETIME_S:.0f} (10 years; the hub tolerates "
            "DESKBRIDGE_TOKEN_LEEWAY_S, 300 s, past it)",
            file=sys.stderr,
        )
        return 2
    try:
        print(issue_token(secret, args.user_id, lifetime_s=args.lifetime_s))
    except ValueError as exc:
        print(f"deskbridge-hub token: {exc}", file=sys.stderr)
        return 2
    return 0


def _call(args: argparse.Namespace) -> int:
    try:
        # the hub's own parser (no NaN, no overflowing number): what it would refuse
        tool_args = strict_json.loads(
            args.args, parse_float=finite_float, parse_constant=no_constant
        )
    except strict_json.DuplicateKey as exc:  # the hub would refuse it: say so here
        print(f"deskbridge-hub call: --args has a {exc}", file=sys.stderr)
        return 2
    except (ValueError, RecursionError) as exc:  # say where, as the HTTP API does
        print(f"deskbridge-hub call: {json_problem('--args', exc)}", file=sys.stderr)
        return 2
    if not isinstance(tool_args, dict):
        print("deskbridge-hub call: --args must be a JSON object, e.g. '{}'", file=sys.stderr)
        return 2
    problem = _args_size_problem(tool_args)
    if problem:
        print(f"deskbridge-hub call: {problem}", file=sys.stderr)
        return 2
    problem = hub_url_problem(args.hub)
    if problem:
        print(f"deskbridge-hub call: {problem}", file=sys.stderr)
        return 2
    try:  # the hub's rule, said here (a space or an é was a urllib traceback)
        validate_user_id(args.user_id, "USER_ID")
    except ValueError as exc:
        print(f"deskbridge-hub call: {exc}", file=sys.stderr)
        return 2
    body: dict[str, object] = {"name": args.tool, "args": tool_args}
    if args.idempotency_key is not None:
        body["idempotency_key"] = args.idempotency_key
    if args.timeout_s is not None:
        body["timeout_s"] = args.timeout_s
    url = f"{args.hub.rstrip('/')}/v1/users/{urllib.parse.quote(args.user_id, safe='')}/jobs"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    key = _inspect_cli.first_api_key()
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    wait_s = (args.timeout_s or 90.0) + 10.0
    try:
        status, raw = _inspect_cli.read_answer(req, wait_s)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = _inspect_cli.unreachable_reason(exc)
        reason += unreachable_hint(args.hub)
        print(f"deskbridge-hub call: cannot reach hub at {args.hub}: {reason}", file=sys.stderr)
        return 1
    answered = _inspect_cli.hub_answer(status, args.hub, raw)
    if isinstance(answered, _inspect_cli.NotTheHub):
        print(
            f"deskbridge-hub call: {answered}; if a proxy in front of the hub answered, "
            "the job may still run",
            file=sys.stderr,
        )
        return 1
    answer = raw.decode()
    if status < 400:
        print(answer)
        return 0
    refused = _refused_option(status, answer)
    if refused:  # the hub's 400 for one of our values: a usage error, as ours are
        print(f"deskbridge-hub call: {refused}", file=sys.stderr)
        return 2
    print(answer)
    if status == 401 and not key:
        print(key_not_set("call"), file=sys.stderr)
    return 1


#: The ``call`` option (or argument) that sets each field of the job request.
_OPTION_OF_FIELD = {
    "args": "--args",
    "name": "TOOL",
    "idempotency_key": "--idempotency-key",
    "timeout_s": "--timeout-s",
    "user_id": "USER_ID",
}


def _args_size_problem(tool_args: dict[str, object]) -> str | None:
    """Why the hub would refuse ``--args`` for its size (measured as the hub measures
    it, against ``DESKBRIDGE_MAX_ARGS_BYTES`` of this environment, default 256 KiB), or
    None."""
    try:
        limit = max_args_bytes(os.environ)
    except ValueError:  # this environment's value is not the hub's business here
        limit = DEFAULT_MAX_ARGS_BYTES
    size = len(ARGS_ENCODER.encode(tool_args))
    if size > limit:
        return f"--args is {size} bytes of JSON, over the hub's limit of {limit} bytes"
    return None


def _refused_option(status: int, answer: str) -> str | None:
    """One line naming the option when the hub answered 400 ``bad_request`` for a field
    one of ``call``'s options sets (``--args`` over the hub's own limit, args that fail
    the tool's schema, an unknown TOOL), else None."""
    if status != 400:
        return None
    try:
        error = json.loads(answer)["error"]
        option = _OPTION_OF_FIELD[error["field"]]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return None
    return f"{option}: {' '.join(message.split())}"


def _check_serve_args(args: argparse.Namespace) -> str | None:
    """Usage errors that Hypercorn would otherwise turn into tracebacks or silent surprises."""
    if "://" in args.bind:  # was "--bind host 'http://127.0.0.1' does not resolve"
        return (
            f"--bind {args.bind!r}: expected HOST:PORT, not a URL (e.g. --bind "
            "127.0.0.1:8080; clients then use http://127.0.0.1:8080, sidecars ws://...)"
        )
    host, sep, port = args.bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        return f"--bind {args.bind!r}: expected HOST:PORT with a port in 0-65535"
    if bool(args.certfile) != bool(args.keyfile):
        return "--certfile and --keyfile go together (TLS needs both; refusing to serve plain HTTP)"
    for path in filter(None, (args.certfile, args.keyfile)):
        if not os.path.isfile(path):
            return f"{path}: no such file"
    grace = args.graceful_timeout_s
    if grace is not None and not (math.isfinite(grace) and 0 < grace <= MAX_GRACE_S):
        return f"--graceful-timeout-s must be a positive number of seconds, at most {MAX_GRACE_S:g}"
    if args.certfile and args.keyfile:
        problem = _tls_problem(args.certfile, args.keyfile)
        if problem:
            return problem
    url = os.environ.get("DESKBRIDGE_REDIS_URL")
    if url and url != MEMORY_URL:
        return redis_url_problem(url)
    return None


def _tls_problem(certfile: str, keyfile: str) -> str | None:
    """Why ``--certfile``/``--keyfile`` cannot serve TLS (Hypercorn's worker failed with a
    traceback and exit 1), or None."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        return f"--certfile {certfile} / --keyfile {keyfile}: cannot load them for TLS: {exc}"
    return None


#: Pending connections the listening socket queues (``listen(2)``'s backlog) before the
#: kernel refuses more: room for a reconnect storm of a few thousand desktops.
LISTEN_BACKLOG = 2048


def _serve(args: argparse.Namespace) -> int:
    from hypercorn.config import Config
    from hypercorn.run import run

    from . import _supervisor
    from ._config import HubConfig
    from ._envcheck import warn_unknown_variables
    from ._logging import setup_logging
    from ._ws_limits import MAX_MESSAGE_SIZE

    setup_logging(args.log_level)
    # workers (--workers N > 1 spawns them) configure their logging from the environment
    os.environ["DESKBRIDGE_LOG_LEVEL"] = args.log_level
    warn_unknown_variables()
    problem = _check_serve_args(args)
    if problem:
        print(f"deskbridge-hub serve: {problem}", file=sys.stderr)
        return 2
    try:
        hub = HubConfig.from_env()
    except ValueError as exc:
        print(f"deskbridge-hub serve: {exc}", file=sys.stderr)
        return 2
    if hub.redis_url in (None, MEMORY_URL) and args.workers > 1:
        print(
            "deskbridge-hub serve: the in-memory substrate serves one process only; "
            "set DESKBRIDGE_REDIS_URL to a redis:// URL to run more than one worker"
            f"{misspelling_hint('DESKBRIDGE_REDIS_URL')}",
            file=sys.stderr,
        )
        return 2
    if not hub.secrets:
        print(
            "deskbridge-hub serve: DESKBRIDGE_SECRET is not set; sidecars could not "
            f"authenticate{misspelling_hint('DESKBRIDGE_SECRET')}",
            file=sys.stderr,
        )
        return 2
    try:
        check_secret(hub.secrets[0])
        for old in hub.secrets[1:]:
            check_secret(old, "a secret in DESKBRIDGE_PREVIOUS_SECRETS")
    except ValueError as exc:
        print(f"deskbridge-hub serve: {exc}", file=sys.stderr)
        return 2
    host = args.bind.rsplit(":", 1)[0].strip("[]")
    if not hub.api_keys and host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"deskbridge-hub serve: binding {args.bind} (not loopback) requires "
            f"DESKBRIDGE_API_KEY for the dispatch API{misspelling_hint('DESKBRIDGE_API_KEY')}",
            file=sys.stderr,
        )
        return 2
    if hub.redis_url is None:
        # One process, known here: the in-memory default is safe, so ask for it
        # explicitly for the ASGI entry (which refuses an absent URL).
        os.environ["DESKBRIDGE_REDIS_URL"] = MEMORY_URL
        logging.getLogger("deskbridge.hub").info(
            "DESKBRIDGE_REDIS_URL is not set: in-memory substrate for this one process%s",
            misspelling_hint("DESKBRIDGE_REDIS_URL"),
        )
    config = Config()
    config.application_path = "deskbridge_hub.asgi:app"
    config.worker_class = "trio"
    # One worker runs in this process (Hypercorn's workers=0 mode), so SIGTERM to it (a
    # pod's PID 1) drains gracefully: finish jobs, close sockets 1012, exit. With N > 1
    # our supervisor (``_supervisor``, not Hypercorn's) starts N workers, drains each once
    # on SIGTERM/Ctrl-C and waits for them; SIGTERM one worker to restart it gracefully.
    config.workers = 0 if args.workers == 1 else args.workers
    config.bind = [args.bind]
    grace_s = hub.timings.grace_s
    if args.graceful_timeout_s is not None:
        # the drain's grace is the workers' DESKBRIDGE_GRACE_S (``_shutdown``): the option
        # sets it for them (it used to set only Hypercorn's timeout, which the drain
        # does not use)
        grace_s = args.graceful_timeout_s
        os.environ["DESKBRIDGE_GRACE_S"] = repr(grace_s)
    config.graceful_timeout = grace_s
    # Liveness is ours (application-level ping both ways); Hypercorn's own keep-alive
    # settings are spelled out so nothing is inherited silently.
    config.websocket_max_message_size = MAX_MESSAGE_SIZE  # 2 MiB; frames are capped at 1 MiB
    config.websocket_ping_interval = None  # app-level ping runs instead (docs/operations.md)
    config.keep_alive_timeout = 75.0  # seconds, HTTP keep-alive between dispatch calls
    # A pod's rolling restart moves all its desktops at once: Hypercorn's default listen
    # backlog (100) overflowed at ~500 simultaneous connects (resets, then the sidecars'
    # backoff); the kernel caps it at net.core.somaxconn (4096 on current Linux).
    config.backlog = LISTEN_BACKLOG
    if args.certfile:
        config.certfile = args.certfile
        config.keyfile = args.keyfile
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # our handler, printed once
    try:
        if args.workers == 1:
            return run(config)
        return _supervisor.run(config, args.workers, grace_s)
    except OSError as exc:
        if isinstance(exc, socket.gaierror):
            # a typo'd host: Hypercorn's bind raised it as a traceback, exit 1
            print(
                f"deskbridge-hub serve: cannot listen on {args.bind}: --bind host {host!r} "
                f"does not resolve ({exc.strerror}); give an IP address or a known name",
                file=sys.stderr,
            )
            return 2
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            print(
                f"deskbridge-hub serve: cannot listen on {args.bind}: {exc.strerror}",
                file=sys.stderr,
            )
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
