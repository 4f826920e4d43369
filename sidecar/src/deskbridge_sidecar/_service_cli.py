"""The desktop-service commands of ``deskbridge-sidecar``: ``status``, ``set-token``,
``install-service``, ``uninstall-service``; the rotating log file and the status file of a
running daemon (see ``_config``, ``_status``, ``_service``)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import _config, _service, _status
from ._logformat import make_formatter
from ._transport import sidecar_url

COMMANDS = frozenset({"status", "set-token", "install-service", "uninstall-service"})
STATUS_FILE = "status.json"
#: Rotating log file: rotated at this size, this many old files kept.
LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3


def default_data_dir() -> str:
    import platformdirs

    return platformdirs.user_data_dir("deskbridge", appauthor=False)


def add_commands(commands: Any) -> None:
    """Add the service commands to the ``deskbridge-sidecar`` sub-parsers."""
    s = commands.add_parser(
        "status",
        help="is the daemon running, connected to which hub, since when, last error, tools",
        description="Read the running daemon's local status file (never the network). "
        "Exit 0 running and connected, 1 running but not connected, 3 not running.",
    )
    s.add_argument("--config", metavar="PATH", help="config file (to find data_dir)")
    s.add_argument("--data-dir", metavar="DIR", help="the daemon's data directory")
    s.add_argument("--json", action="store_true", help="print the status file as JSON")

    t = commands.add_parser(
        "set-token",
        help="store the token in the OS keyring (else a 0600 file), not in the config",
        description="Store the sidecar token (from `deskbridge-hub token USER_ID`). Reads it "
        "from standard input when TOKEN is not given (arguments show in ps). A string that is "
        "not such a token (a JWT with a user id and an expiry not past) is refused with exit "
        "status 2 and nothing is stored; its signature is checked by the hub, not here.",
    )
    t.add_argument("token", nargs="?", metavar="TOKEN")

    i = commands.add_parser(
        "install-service",
        help="start the sidecar at login (systemd user unit / launchd agent)",
        description="Write a systemd user unit (Linux) or a launchd agent (macOS) that runs "
        "`deskbridge-sidecar run --config CONFIG --log-file LOG`, print it and the commands "
        "that enable it (--now runs them).",
    )
    i.add_argument("--config", metavar="PATH", help="config file (default: the usual place)")
    i.add_argument("--hub", metavar="URL", help="write this hub URL into a new config file")
    i.add_argument("--now", action="store_true", help="also enable and start it")
    commands.add_parser(
        "uninstall-service",
        help="remove the unit / agent written by install-service",
        description="Remove the systemd user unit or launchd agent, and print the commands "
        "that stop a running one.",
    )


def run(args: argparse.Namespace) -> int:
    """Run one of :data:`COMMANDS`; returns the exit status."""
    try:
        if args.command == "status":
            return _status_cmd(args)
        if args.command == "set-token":
            return _set_token(args)
        if args.command == "install-service":
            return _install(args)
        return _uninstall()
    except _config.ConfigError as exc:
        print(f"deskbridge-sidecar {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"deskbridge-sidecar {args.command}: {exc}", file=sys.stderr)
        return 1


def _data_dir(args: argparse.Namespace) -> Path:
    cfg = _config.load_config(
        Path(args.config) if getattr(args, "config", None) else None,
        required=bool(getattr(args, "config", None)),
    )
    chosen = (
        getattr(args, "data_dir", None)
        or os.environ.get("DESKBRIDGE_DATA_DIR")
        or cfg.data_dir
        or default_data_dir()
    )
    return Path(chosen)


def data_dir_problem(data_dir: Path) -> str | None:
    """Why ``data_dir`` (``--data-dir``, ``$DESKBRIDGE_DATA_DIR`` or the config's) cannot be
    a data directory: it exists and is not a directory. None otherwise (a missing one is
    a sidecar that never ran there)."""
    if data_dir.exists() and not data_dir.is_dir():
        return f"--data-dir {data_dir}: not a directory"
    return None


def _status_cmd(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    problem = data_dir_problem(data_dir)
    if problem:  # exit 1 would read "running but not connected"
        print(f"deskbridge-sidecar status: {problem}", file=sys.stderr)
        return 2
    code, text = _status.report(data_dir / STATUS_FILE, as_json=args.json)
    print(text)
    return code


def _set_token(args: argparse.Namespace) -> int:
    token = args.token
    if not token:
        token = (getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
    if not token:
        print("deskbridge-sidecar set-token: no token given", file=sys.stderr)
        return 2
    try:
        claims = _config.check_token(token)
    except ValueError as exc:
        print(f"deskbridge-sidecar set-token: {exc}; nothing stored", file=sys.stderr)
        return 2
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(claims.expires_at))
    print(
        f"token for user {claims.user_id!r} (valid until {until}) stored in "
        f"{_config.store_token(token)}"
    )
    return 0


def _install(args: argparse.Namespace) -> int:
    config = Path(args.config).expanduser() if args.config else _config.default_config_path()
    config = config.absolute()
    if args.hub:
        try:  # the daemon's own check: a bad URL made a unit that could never connect
            sidecar_url(args.hub)
        except ValueError as exc:
            print(f"deskbridge-sidecar install-service: --hub: {exc}", file=sys.stderr)
            return 2
        if config.exists():
            print(
                f"deskbridge-sidecar install-service: {config} exists; edit its hub",
                file=sys.stderr,
            )
            return 2
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f"hub = {json.dumps(args.hub)}\n")
    cfg = _config.load_config(config, required=True)
    if not cfg.hub:
        print(f"deskbridge-sidecar install-service: {config} has no hub", file=sys.stderr)
        return 2
    log_file = Path(cfg.log_file) if cfg.log_file else _config.default_log_file()
    path, text, commands = _service.install(config, log_file, now=args.now)
    print(f"wrote {path}:\n\n{text}")
    if _config.load_token() is None:
        print("no token stored yet: run `deskbridge-sidecar set-token` first")
    verb = "ran" if args.now else "enable and start it with"
    print(f"{verb}:\n" + "\n".join("  " + " ".join(c) for c in commands))
    return 0


def _uninstall() -> int:
    path, existed, commands = _service.uninstall()
    if not existed:
        print(f"nothing to remove: {path} does not exist")
        return 0
    print(f"removed {path}; if it is running, stop it with:")
    print("\n".join("  " + " ".join(c) for c in commands))
    return 0


def log_to_file(path: str) -> None:
    """Also log to ``path``, rotated at :data:`LOG_MAX_BYTES` (``logging.handlers``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(make_formatter())
    logging.getLogger().addHandler(handler)
