"""``examples/mcp_agent.py`` as a newcomer first runs it (README): the hub not running,
a wrong API key, a desktop without the browser toolset. Each was a traceback of the MCP
client's task group ("Server returned an error response" for the key); now one line on
stderr and exit status 1. A loopback HTTP stub stands in for the hub (bounded waits)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

AGENT = Path(__file__).resolve().parents[2] / "examples" / "mcp_agent.py"


@contextmanager
def stub_hub(status: int, body: dict) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def agent(hub: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(AGENT), "--hub", hub, "--user", "alice", "--api-key", "k"]
    argv += ["--url", "http://127.0.0.1:8123/form"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_hub_not_running_is_one_line() -> None:
    hub = f"http://127.0.0.1:{closed_port()}"
    done = agent(hub)
    assert done.returncode == 1
    assert done.stderr.startswith(f"mcp_agent: cannot reach the hub at {hub}: "), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


@pytest.mark.parametrize(
    ("status", "body", "line"),
    [
        (401, {"error": {"code": "unauthorized"}}, "the hub refused the API key (401)"),
        (200, {"online": False, "tools": None}, "alice's desktop is offline"),
        (
            200,
            {"online": True, "tools": [{"name": "echo"}, {"name": "browser_open"}]},
            "alice's desktop offers no browser_fill, browser_click, browser_text: start its "
            "sidecar with --browser-origin http://127.0.0.1:8123",
        ),
    ],
)
def test_a_hub_that_cannot_serve_the_agent_is_one_line(status, body, line) -> None:
    with stub_hub(status, body) as hub:
        done = agent(hub)
    assert done.returncode == 1
    assert done.stderr.startswith(f"mcp_agent: {line}"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
