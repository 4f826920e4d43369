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


class Hub(Proc):
    """``deskbridge-hub serve`` on 127.0.0.1. With ``certfile``/``keyfile`` it serves
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
            [*argv, *extra_args], hub_env(**(env or {})), tmp / f"{name}-{self.port}.log"
        )

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
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
    ):
        argv = [str(BIN / "deskbridge-sidecar"), "run", "--hub", hub_ws, "--token", token]
        for module in tools:
            argv += ["--tools", module]
        argv += list(extra_args)
        full_env = {"PYTHONPATH": str(Path(__file__).parent / "tools")}
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
