"""The main job on the embedded default: ``./dev demo`` (``python examples/demo.py``).

Starts a hub on the in-memory substrate under Hypercorn (trio) on a free loopback port,
a sidecar daemon dialling it over a real WebSocket, then dispatches ``echo``, then a
3 s ``sleep`` with a ``status`` call made while it runs, and prints each outcome with its
round-trip time. Exits 0 when every outcome is what it should be, 1 otherwise.

Needs deskbridge-hub and deskbridge-sidecar installed (the workspace installs both). It lives
outside both packages because it uses both: the hub package must not import the sidecar.
"""

from __future__ import annotations

import logging
import secrets
import sys
import time

import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge, HubConfig, MemorySubstrate, Outcome, create_app, issue_token
from deskbridge_sidecar import Daemon
from hypercorn.config import Config
from hypercorn.trio import serve

USER = "demo-user"


def _line(label: str, outcome: Outcome) -> str:
    shown = outcome.result if outcome.status == "completed" else outcome.error
    return f"{label:<28} {outcome.status:<10} {outcome.elapsed_s * 1000:8.1f} ms  {shown}"


async def _main() -> int:
    secret = secrets.token_hex(16)
    timings = Timings.from_env()
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(secret,), timings=timings), substrate=substrate)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5  # seconds; the demo has no jobs left to finish at exit
    ok = True
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        binds = await nursery.start(
            lambda task_status: serve(
                app, config, shutdown_trigger=shutdown.wait, task_status=task_status
            )
        )
        http_url = binds[0]
        ws_url = http_url.replace("http://", "ws://")
        print(f"hub      listening on {http_url} (in-memory substrate)")
        token = issue_token(secret, USER, lifetime_s=600)
        daemon = Daemon(ws_url, token, timings=timings)
        with trio.fail_after(10):
            session_id = await nursery.start(daemon.run)
        print(f"sidecar  connected as {USER}, session {session_id}")
        bridge = Bridge(substrate, timings)
        presence = await bridge.presence(USER)
        ok = presence.online
        print(f"presence {USER} online\n")

        echo = await bridge.dispatch(USER, "echo", {"hello": "world", "n": 1}, timeout_s=10)
        print(_line("echo {hello: world, n: 1}", echo))
        ok &= echo.status == "completed" and echo.result == {"hello": "world", "n": 1}

        results: dict[str, Outcome] = {}

        async def sleeper() -> None:
            results["sleep"] = await bridge.dispatch(USER, "sleep", {"seconds": 3}, timeout_s=15)

        async with trio.open_nursery() as inner:
            inner.start_soon(sleeper)
            await trio.sleep(0.5)  # let the sleep start on the desktop
            status = await bridge.status(USER)
            print(_line("status (while sleep runs)", status))
            ok &= status.status == "completed" and status.elapsed_s < 1.0
        print(_line("sleep {seconds: 3}", results["sleep"]))
        ok &= results["sleep"].status == "completed" and results["sleep"].elapsed_s >= 3.0

        shutdown.set()
        nursery.cancel_scope.cancel()
    print("\ndemo " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    interrupted = False
    try:
        code = trio.run(_main)
    except* KeyboardInterrupt:  # Ctrl-C (trio wraps it in groups): one line, exit 130
        interrupted = True
    if interrupted:
        print("interrupted", file=sys.stderr)
        return 130
    print(f"total {time.monotonic() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
