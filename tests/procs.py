"""Real processes for integration and chaos tests: hub servers, sidecars, redis-server.

Every process starts in its own process group and is stopped by group; every wait is
bounded. Nothing here sleeps as synchronisation except bounded polling of a real
process's observable state (HTTP, Redis), which is how a user would see it too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("DESKBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SECRET = "test-secret-" + secrets.token_hex(16)  # >= 32 bytes (MIN_SECRET_BYTES)
API_KEY = "test-key-" + secrets.token_hex(8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, *, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError after
    ``timeout_s``. Returns that value."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - polled until the deadline
            last_exc = exc
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not reached within {timeout_s} s (last error: {last_exc!r})")


class Proc:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path):
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(5)
        # a SIGKILLed master can leave workers behind: sweep the group
        self.signal_group(signal.SIGKILL)
        self._log.close()
        return self.popen.returncode

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


def hub_env(**extra: str) -> dict[str, str]:
    env = {
        "DESKBRIDGE_REDIS_URL": REDIS_URL,
        "DESKBRIDGE_SECRET": SECRET,
        "DESKBRIDGE_API_KEY": API_KEY,
        "DESKBRIDGE_LOG_LEVEL": "INFO",
    }
    env.update(extra)
    return env


def faketime(offset_s: float) -> tuple[str, ...]:
    """A command prefix running a process with its clocks moved by ``offset_s`` seconds
    (libfaketime's ``faketime -f``; Debian package ``faketime``). Missing -> fails loudly."""
    import shutil

    path = shutil.which("faketime")
    if path is None:
        raise FileNotFoundError("faketime not found: apt-get install faketime")
    return (path, "-f", f"{offset_s:+g}s")


class Hub(Proc):
    """``deskbridge-hub serve`` on 127.0.0.1 (``prefix`` goes before the command, e.g.
    :func:`faketime`). With ``certfile``/``keyfile`` it serves
    https:// and wss:// (``http``/``ws`` say so) and ``verify`` is the CA to trust
    (``ca_file``) for httpx; ``extra_args`` are appended to the command line."""

    def __init__(
        self,
        tmp: Path,
        *,
        workers: int = 2,
        port: int | None = None,
        env=None,
        name="hub",
        extra_args: Sequence[str] = (),
        certfile: Path | None = None,
        keyfile: Path | None = None,
        ca_file: Path | None = None,
        prefix: Sequence[str] = (),
    ):
        self.port = port or free_port()
        tls = certfile is not None
        self.http = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ws = f"{'wss' if tls else 'ws'}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else True
        )
        argv = [
            str(BIN / "deskbridge-hub"),
            "serve",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
        ]
        if tls:
            argv += ["--certfile", str(certfile), "--keyfile", str(keyfile)]
        super().__init__(
            [*prefix, *argv, *extra_args],
            hub_env(**(env or {})),
            tmp / f"{name}-{self.port}.log",
        )

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        # A start-up bound, not a figure under test: on a loaded 2-core CI machine two
        # Hypercorn workers importing quart, mcp and coredis took over 20 s to answer.
        def ok():
            if self.popen.poll() is not None:
                raise RuntimeError(f"hub exited {self.popen.returncode}:\n{self.output()[-3000:]}")
            return (
                httpx.get(self.http + "/healthz", timeout=1.0, verify=self.verify).status_code
                == 200
            )

        wait_until(ok, timeout_s=timeout_s, what=f"hub {self.http} healthy")


def issue(user_id: str, lifetime_s: float = 3600) -> str:
    from deskbridge_hub import issue_token

    return issue_token(SECRET, user_id, lifetime_s=lifetime_s)


class Sidecar(Proc):
    def __init__(
        self,
        tmp: Path,
        hub_ws: str,
        token: str,
        *,
        tools: list[str] = (),
        env=None,
        name="sidecar",
        extra_args: Sequence[str] = (),
        data_dir: Path | None = None,
        prefix: Sequence[str] = (),
    ):
        argv = [
            *prefix,
            str(BIN / "deskbridge-sidecar"),
            "run",
            "--hub",
            hub_ws,
            "--token",
            token,
        ]
        for module in tools:
            argv += ["--tools", module]
        argv += list(extra_args)
        # Each sidecar its own ledger unless the test shares one on purpose (a restart
        # of "the same desktop" passes the first one's ``data_dir``).
        self.data_dir = data_dir or tmp / f"{name}-{secrets.token_hex(3)}-data"
        full_env = {
            # the test tools, then what the test run was given (a worktree's sources
            # ahead of the installed packages: the sidecar runs the same code as the hub)
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path(__file__).parent / "tools"), os.environ.get("PYTHONPATH")) if p
            ),
            "DESKBRIDGE_DATA_DIR": str(self.data_dir),
            # the test run's own proxy variables must not send a loopback hub through a
            # proxy (an empty value counts as unset); tests/integration/test_proxy.py sets them
            **dict.fromkeys(("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"), ""),
        }
        full_env.update(env or {})
        super().__init__(argv, full_env, tmp / f"{name}-{secrets.token_hex(3)}.log")


def api(client: httpx.Client | None = None) -> httpx.Client:
    return client or httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0)


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.stop()


# -- chaos helpers (issue 3, item 6): additive; nothing above depends on them ------------


def kill_group(proc: Proc, timeout_s: float = 5.0) -> None:
    """SIGKILL ``proc``'s whole process group (a Hypercorn master and its worker) and
    reap the leader. The log stays open: ``output()`` still works, ``stop()`` later is
    harmless."""
    proc.signal_group(signal.SIGKILL)
    proc.popen.wait(timeout_s)


def resp_command(host: str, port: int, *command: object, timeout_s: float = 5.0):
    """One Redis command on a fresh connection (RESP2, no client library), blocking.

    Returns the decoded reply; an error reply raises RuntimeError. A test oracle that
    shares nothing with the code under test."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        out = [b"*%d\r\n" % len(command)]
        for arg in command:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        sock.sendall(b"".join(out))
        reader = sock.makefile("rb")
        try:
            return _resp_read(reader)
        finally:
            reader.close()


def _resp_read(reader):
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(rest)
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else reader.read(size + 2)[:-2].decode()
    if kind == b"*":
        size = int(rest)
        return None if size < 0 else [_resp_read(reader) for _ in range(size)]
    raise AssertionError(f"unexpected RESP line {line!r}")


class RedisServer(Proc):
    """A private ``redis-server`` on a free port that keeps nothing on disk (no RDB, no
    AOF): a restart on the same port comes back empty. A missing ``redis-server`` fails
    loudly (FileNotFoundError), it never skips. ``extra``: more of its arguments."""

    def __init__(
        self,
        tmp: Path,
        *,
        port: int | None = None,
        name: str = "redis",
        extra: tuple[str, ...] = (),
    ):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        workdir = tmp / f"{name}-{self.port}"
        workdir.mkdir(exist_ok=True)
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            *extra,
        ]
        super().__init__(argv, {}, tmp / f"{name}-{self.port}.log")

    def command(self, *command: object, timeout_s: float = 5.0):
        return resp_command("127.0.0.1", self.port, *command, timeout_s=timeout_s)

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        def ok():
            if self.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.popen.returncode}")
            return self.command("PING", timeout_s=1.0) == "PONG"

        wait_until(ok, timeout_s=timeout_s, what=f"redis-server on {self.port} ready")


HAPROXY = os.environ.get("DESKBRIDGE_TEST_HAPROXY", "/usr/sbin/haproxy")


class HAProxy(Proc):
    """A real HAProxy (``haproxy -f cfg -db``) on 127.0.0.1 in front of hub pods.

    ``mode http`` (the WebSocket upgrade is passed through; ``timeout tunnel`` keeps the
    upgraded socket), ``balance`` over ``backends`` (ports on 127.0.0.1), health checked
    with ``GET /healthz`` every ``inter_ms`` (one failure marks a pod down, one success
    up), and ``option redispatch`` so a connection refused by a dead pod is retried on
    another before the health check has noticed. The config is written to ``tmp``.
    """

    def __init__(
        self,
        tmp: Path,
        backends: Sequence[int],
        *,
        port: int | None = None,
        name: str = "haproxy",
        balance: str = "roundrobin",
        inter_ms: int = 200,
    ):
        self.port = port or free_port()
        self.http = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}"
        servers = "\n".join(
            f"    server pod{i} 127.0.0.1:{p} check inter {inter_ms}ms fall 1 rise 1"
            for i, p in enumerate(backends, 1)
        )
        self.cfg_path = tmp / f"{name}-{self.port}.cfg"
        self.cfg_path.write_text(
            f"""global
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    option redispatch
    retries 3
    timeout connect 1s
    timeout client 120s
    timeout server 120s
    timeout tunnel 1h
    timeout http-request 10s

frontend hubs
    bind 127.0.0.1:{self.port}
    default_backend pods

backend pods
    balance {balance}
    option httpchk GET /healthz
{servers}
"""
        )
        super().__init__(
            [HAPROXY, "-f", str(self.cfg_path), "-db"], {}, tmp / f"{name}-{self.port}.log"
        )

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        def ok():
            if self.popen.poll() is not None:
                raise RuntimeError(f"haproxy exited {self.popen.returncode}:\n{self.output()}")
            return httpx.get(self.http + "/healthz", timeout=1.0).status_code == 200

        wait_until(ok, timeout_s=timeout_s, what=f"haproxy {self.http} ready")


def holder(
    hubs: Sequence[Hub], user_id: str, session_id: str, *, within_s: float = 10.0
) -> Hub | None:
    """The hub process whose log says it welcomed ``session_id`` of ``user_id``, looked
    for until ``within_s`` seconds have passed (None then). The hub writes the session's
    presence before its "online" line, so a caller that saw the presence can look before
    the line is written (a loaded CI machine: the check failed in a full run)."""
    needle = f"session {session_id}: {user_id} online"
    give_up = time.monotonic() + within_s
    while True:
        for hub in hubs:
            if needle in hub.output():
                return hub
        if time.monotonic() >= give_up:
            return None
        time.sleep(0.02)


class Ledger:
    """The counting tool's ledger (``tests/tools/counting_tools.py``): one JSON line per
    tool start and end, appended by the sidecar process."""

    def __init__(self, path: Path):
        self.path = path

    def env(self) -> dict[str, str]:
        return {"DESKBRIDGE_TEST_LEDGER": str(self.path)}

    def events(self) -> list[dict]:
        import json

        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def starts(self, key: str) -> list[dict]:
        return [e for e in self.events() if e["event"] == "start" and e["key"] == key]

    def ends(self, key: str) -> list[dict]:
        return [e for e in self.events() if e["event"] == "end" and e["key"] == key]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events():
            if e["event"] == "start":
                out[e["key"]] = out.get(e["key"], 0) + 1
        return out


def log_times(text: str, needle: str) -> list[float]:
    """Unix times of the log lines containing ``needle`` (lines start with Python's
    ``asctime``, local time with milliseconds: ``2025-01-31 12:00:00,123``)."""
    from datetime import datetime

    out = []
    for line in text.splitlines():
        if needle in line:
            try:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            except ValueError:
                continue
            out.append(stamp.timestamp())
    return out


# -- liveness helpers (issue 4): additive; nothing above depends on them ----------------


def presence_key(user_id: str) -> str:
    """The presence key of ``user_id`` (``bridge:presence:{<user_id>}``)."""
    return f"bridge:presence:{{{user_id}}}"


class RedisPoller:
    """One persistent blocking Redis connection (RESP2, no client library) for tight
    polling from a test or a bench: ``poller.get(key)``, ``poller.presence(user)``.
    Shares nothing with the code under test. Use as a context manager."""

    def __init__(self, url: str = REDIS_URL, timeout_s: float = 5.0):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self._sock = socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), timeout=timeout_s
        )
        self._reader = self._sock.makefile("rb")
        if parts.password:
            self.command("AUTH", *([parts.username] if parts.username else []), parts.password)
        if parts.path.strip("/"):
            self.command("SELECT", parts.path.strip("/"))

    def command(self, *command: object):
        out = [b"*%d\r\n" % len(command)]
        for arg in command:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self._reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("Redis closed the connection mid-reply")
        kind, rest = line[:1], line[1:-2].decode()
        if kind == b"-":
            raise RuntimeError(rest)
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._reader.read(size + 2)[:-2].decode()
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._read() for _ in range(size)]
        raise AssertionError(f"unexpected RESP line {line!r}")

    def get(self, key: str) -> str | None:
        return self.command("GET", key)

    def presence(self, user_id: str) -> str | None:
        """The session id holding ``user_id``'s presence, or None (offline)."""
        return self.get(presence_key(user_id))

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> RedisPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def log_text(proc: Proc) -> str:
    """Everything ``proc`` logged so far (works before and after ``stop()``)."""
    with contextlib.suppress(ValueError):
        proc._log.flush()
    return proc.log_path.read_text(errors="replace")


def wait_log(proc: Proc, pattern: str, *, timeout_s: float, since: int = 0):
    """Wait until ``proc``'s log (from character ``since`` on) matches the regular
    expression ``pattern``; return the ``re.Match``. Raises TimeoutError."""
    import re

    regex = re.compile(pattern)
    return wait_until(
        lambda: regex.search(log_text(proc), since),
        timeout_s=timeout_s,
        interval_s=0.02,
        what=f"log line /{pattern}/ from {proc.log_path.name}",
    )


def session_pid(hub: Hub, session_id: str, *, timeout_s: float = 10.0) -> int:
    """The pid of the hub worker that welcomed ``session_id``: its log line
    ``deskbridge.hub.session[<pid>]: session <sid>: <user> online``."""
    import re

    match = wait_log(hub, rf"\[(\d+)\]: session {re.escape(session_id)}: ", timeout_s=timeout_s)
    return int(match.group(1))


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def worker_pids(hub: Hub) -> set[int]:
    """Pids of the hub's live workers (each logs ``hub serving`` once it is up)."""
    import re

    pids = {int(p) for p in re.findall(r"deskbridge\.hub\[(\d+)\]: hub serving", log_text(hub))}
    return {p for p in pids if pid_alive(p)}


def client_on_worker(hub: Hub, *, not_pid: int, attempts: int = 50) -> tuple[httpx.Client, int]:
    """An API client whose one keep-alive connection is served by a worker other than
    ``not_pid`` (learnt from ``/healthz``'s consumer name, ``<host>-<pid>-<rand>``).
    Returns ``(client, pid)``; the caller closes the client."""
    for _ in range(attempts):
        client = httpx.Client(
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60.0,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        pid = int(client.get(hub.http + "/healthz").json()["consumer"].rsplit("-", 2)[1])
        if pid != not_pid:
            return client, pid
        client.close()
    raise RuntimeError(f"no connection landed on a worker other than {not_pid}")


def upgrade_request(port: int, token: str) -> bytes:
    """The bytes of a WebSocket upgrade request to ``/v1/sidecar`` on 127.0.0.1:``port``
    with ``Authorization: Bearer token`` (a fresh ``Sec-WebSocket-Key``)."""
    import base64

    key = base64.b64encode(secrets.token_bytes(16)).decode()
    return (
        f"GET /v1/sidecar HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    ).encode()


def raw_upgrade(hub: Hub, token: str, *, timeout_s: float = 5.0) -> tuple[int, str]:
    """One WebSocket upgrade request to ``/v1/sidecar`` on a fresh TCP connection,
    closed as soon as the answer's head (and a short body) is read. Returns
    ``(HTTP status, body text)``; 101 means the upgrade was accepted."""
    with socket.create_connection(("127.0.0.1", hub.port), timeout=timeout_s) as sock:
        sock.sendall(upgrade_request(hub.port, token))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        if status != 101:
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
        return status, body.decode(errors="replace")


class RedisMonitor:
    """``MONITOR`` on its own connection, read by a background thread: every command
    the server runs (Lua-internal ones too, as ``[0 lua]``), one line each. An oracle of
    what the hub processes did to a key. Use as a context manager; ``lines(since)``,
    ``wait_for(predicate, timeout_s)``."""

    def __init__(self, url: str = REDIS_URL):
        import threading

        self._poller = RedisPoller(url, timeout_s=None)
        assert self._poller.command("MONITOR") == "OK"
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                line = self._poller._reader.readline()
                if not line:
                    return
                with self._lock:
                    self._lines.append(line.decode(errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            return

    def lines(self, since: int = 0) -> list[str]:
        with self._lock:
            return self._lines[since:]

    def mark(self) -> int:
        with self._lock:
            return len(self._lines)

    def wait_for(self, predicate, *, timeout_s: float, since: int = 0, what: str = "line") -> str:
        return wait_until(
            lambda: next((line for line in self.lines(since) if predicate(line)), None),
            timeout_s=timeout_s,
            interval_s=0.01,
            what=f"MONITOR {what}",
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._poller._sock.shutdown(socket.SHUT_RDWR)
        self._poller.close()
        self._thread.join(5)

    def __enter__(self) -> RedisMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
