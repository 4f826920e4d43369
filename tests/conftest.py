"""Shared fixtures. Real Redis is the machine's (``DESKBRIDGE_TEST_REDIS_URL``, default
127.0.0.1:6379); a missing Redis fails loudly, it never skips."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

REDIS_URL = os.environ.get("DESKBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# A suite started in the background by a shell without job control (`.ci/run &`, nohup)
# inherits SIGINT ignored, and so would every process it starts: the Ctrl-C tests' SIGINT
# would then do nothing. A handler here (not an ignore) is reset to the default in each
# child, which then gets Python's KeyboardInterrupt as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def redis_problem(url: str, timeout_s: float = 1.0) -> str | None:
    """Why the suite's Redis at ``url`` does not answer a PING, or None when it answers
    (any reply: a password it wants is the tests' business). Only ``redis://`` URLs are
    checked."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        return None
    address = (parts.hostname or "127.0.0.1", parts.port or 6379)
    try:
        with socket.create_connection(address, timeout=timeout_s) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            if s.recv(64):
                return None
            problem = "it closed the connection"
    except OSError as exc:
        problem = exc.strerror or str(exc) or type(exc).__name__
    return (
        f"the suite's Redis at {address[0]}:{address[1]} does not answer ({problem}): the "
        "tests that use it will fail. Start one (redis-server --port 6390 --save '' "
        "--daemonize yes) and set DESKBRIDGE_TEST_REDIS_URL=redis://127.0.0.1:6390/0"
    )


def pytest_report_header(config: pytest.Config) -> str:
    problem = redis_problem(REDIS_URL)
    config.stash[_REDIS_PROBLEM] = problem
    return f"redis: {problem or REDIS_URL + ' answers'}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    problem = config.stash.get(_REDIS_PROBLEM, None)
    if problem and exitstatus:  # say it again where a newcomer looks: after the failures
        terminalreporter.write_line(problem, red=True, bold=True)


_REDIS_PROBLEM = pytest.StashKey[str | None]()


class RawRedis:
    """A test oracle independent of the code under test: one connection per command,
    RESP2, no client library. ``await raw("GET", key)``; error replies raise RuntimeError."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self._setup: list[tuple[str, ...]] = []
        if parts.password:
            auth = (parts.username, parts.password) if parts.username else (parts.password,)
            self._setup.append(("AUTH", *auth))
        if parts.path.strip("/"):
            self._setup.append(("SELECT", parts.path.strip("/")))

    async def __call__(self, *command: Any) -> Any:
        with anyio.fail_after(5):
            async with await anyio.connect_tcp(self.host, self.port) as stream:
                reader = BufferedByteReceiveStream(stream)
                for cmd in (*self._setup, command):
                    await stream.send(_pack(cmd))
                    reply = await _read(reader)
                return reply


def _pack(command: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _read(reader: BufferedByteReceiveStream) -> Any:
    line = (await reader.receive_until(b"\r\n", 1 << 20)).decode()
    kind, rest = line[:1], line[1:]
    if kind == "+":
        return rest
    if kind == "-":
        raise RuntimeError(rest)
    if kind == ":":
        return int(rest)
    if kind == "$":
        size = int(rest)
        return None if size < 0 else (await reader.receive_exactly(size + 2))[:-2].decode()
    if kind == "*":
        size = int(rest)
        return None if size < 0 else [await _read(reader) for _ in range(size)]
    raise AssertionError(f"unexpected RESP line {line!r}")


@pytest.fixture(autouse=True)
def _sidecar_data_dir(tmp_path_factory, monkeypatch) -> None:
    """A sidecar started in a test (in-process ``main`` or a child process without its
    own) never touches the user's real ledger, nor one another test holds."""
    monkeypatch.setenv("DESKBRIDGE_DATA_DIR", str(tmp_path_factory.mktemp("sidecar-data")))


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def raw_redis() -> RawRedis:
    return RawRedis(REDIS_URL)
