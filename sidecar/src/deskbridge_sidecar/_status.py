"""``deskbridge-sidecar status``: is the daemon running, where is it connected, since when.

The running daemon rewrites a small JSON status file once a second (atomically: a temporary
file renamed over it) in the platform's user state directory; ``status`` reads it locally,
never over the network, and checks that the process that wrote it is still alive. Fields:
``pid``, ``hub``, ``proxy`` (the HTTP proxy's label, password masked; null: direct),
``connected``, ``session_id``, ``since`` (Unix seconds of the current state),
``last_error`` (how the previous session or attempt ended), ``tools``, ``version``,
``updated_at``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import trio

from ._reconnect import CONNECT_FAILED, REJECTED

log = logging.getLogger("deskbridge.sidecar.status")

#: How often the daemon rewrites the status file, seconds.
WRITE_INTERVAL_S = 1.0
#: A status file older than this while its process lives means a wedged daemon, seconds.
STALE_AFTER_S = 30.0


def _describe_end(end: Any) -> str | None:
    """``"<cause>: <close code> <reason>"`` for ``end`` (a ``SessionEnd``); an attempt that
    never had a WebSocket (``connect_failed``, ``rejected``: no close code, its recorded
    1006 is a placeholder) is ``"<cause>: <reason>"``; None for no end."""
    if end is None:
        return None
    if end.cause in (CONNECT_FAILED, REJECTED):
        return f"{end.cause}: {end.reason}".strip()
    return f"{end.cause}: {end.code} {end.reason}".strip()


def snapshot(daemon: Any, hub: str, tools: list[str], since: float) -> dict[str, Any]:
    stats = daemon.statistics()
    proxy = getattr(daemon, "proxy", None)
    from ._version import __version__

    return {
        "pid": os.getpid(),
        "version": __version__,
        "hub": hub,
        "proxy": proxy.label if proxy is not None else None,
        "connected": stats.session_id is not None,
        "session_id": stats.session_id,
        "since": since,
        "last_error": _describe_end(stats.last_end),
        "connect_attempts": stats.connect_attempts,
        "running": stats.running,
        "tools": tools,
        "updated_at": time.time(),
    }


def write(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(body, indent=2))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


async def write_loop(daemon: Any, path: Path, hub: str, tools: list[str]) -> None:
    """Run until cancelled: rewrite the status file every :data:`WRITE_INTERVAL_S`;
    on cancellation (the daemon stopping) write a final ``stopped`` record.

    Only a daemon that holds the data directory's ledger runs this (``Daemon.status_file``):
    the file is shared by every process pointed at that directory. A write that fails
    (a full disk) is one WARNING, then retried every interval; it never stops the daemon.
    """
    since = time.time()
    connected: bool | None = None
    failing = False
    try:
        while True:
            body = snapshot(daemon, hub, tools, since)
            if body["connected"] != connected:
                connected, since = body["connected"], time.time()
                body["since"] = since
            try:
                await trio.to_thread.run_sync(write, path, body)
            except OSError as exc:
                if not failing:
                    log.warning("cannot write the status file %s: %s", path, exc)
                failing = True
            else:
                failing = False
            await trio.sleep(WRITE_INTERVAL_S)
    finally:
        body = snapshot(daemon, hub, tools, time.time())
        body.update(connected=False, session_id=None, stopped=True, pid=None)
        try:
            write(path, body)
        except OSError:
            pass


def read(path: Path) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def report(path: Path, *, as_json: bool = False) -> tuple[int, str]:
    """The ``status`` command's exit status and text: 0 running and connected, 1 running
    but not connected (or stale), 3 not running (the LSB convention for "not running")."""
    body = read(path)
    running = body is not None and pid_alive(body.get("pid"))
    stale = running and body is not None and time.time() - body.get("updated_at", 0) > STALE_AFTER_S
    if as_json:
        out = dict(body or {}, running=running, stale=stale, status_file=str(path))
        code = 3 if not running else (0 if out.get("connected") and not stale else 1)
        return code, json.dumps(out, indent=2)
    if not running:
        last = f"; last error: {body['last_error']}" if body and body.get("last_error") else ""
        return 3, f"deskbridge-sidecar is not running (status file {path}){last}"
    assert body is not None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(body["since"]))
    lines = [f"deskbridge-sidecar {body.get('version', '')} running (pid {body['pid']})"]
    hub = body["hub"] + (f" through proxy {body['proxy']}" if body.get("proxy") else "")
    if body["connected"]:
        lines.append(f"connected to {hub} since {when} (session {body['session_id']})")
    else:
        lines.append(f"NOT connected to {hub} since {when}")
    if body.get("last_error"):
        lines.append(f"last error: {body['last_error']}")
    lines.append(f"tools: {', '.join(body.get('tools') or [])}")
    if body.get("running"):
        lines.append(f"running now: {body['running']}")
    if stale:
        lines.append(f"WARNING: status not updated for {STALE_AFTER_S:.0f} s (daemon wedged?)")
    return (0 if body["connected"] and not stale else 1), "\n".join(lines)
