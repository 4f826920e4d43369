"""Shared pieces of the chaos suite: timings, HTTP callers in threads, the process
registry. Everything is sync (threads for concurrency) and every wait is bounded."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx

from tests.procs import (
    API_KEY,
    REDIS_URL,
    HAProxy,
    Hub,
    Ledger,
    Proc,
    Sidecar,
    holder,
    issue,
    resp_command,
    wait_until,
)

#: Shortened timings shared by hubs and sidecars (docs/operations.md). Per test, a few
#: are overridden; each test says why.
TIMINGS = {
    "DESKBRIDGE_HEARTBEAT_S": "1",
    "DESKBRIDGE_PRESENCE_TTL_S": "3",
    "DESKBRIDGE_RECLAIM_IDLE_S": "3",
    "DESKBRIDGE_READ_BLOCK_MS": "500",
    "DESKBRIDGE_PING_INTERVAL_S": "1",
    "DESKBRIDGE_PING_TIMEOUT_S": "2",
    "DESKBRIDGE_BACKOFF_INITIAL_S": "0.5",
    "DESKBRIDGE_BACKOFF_MAX_S": "1",
    "DESKBRIDGE_GRACE_S": "1",
}

#: Every HTTP call made by a test waits at most this long beyond the job's own timeout.
HTTP_SLACK_S = 10.0


def new_user() -> str:
    return "chaos-" + secrets.token_hex(4)


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


@attrs.frozen
class Answer:
    """A caller's terminal answer: HTTP status, JSON body, when it arrived (Unix time)."""

    http_status: int
    body: dict[str, Any]
    at: float

    @property
    def status(self) -> str:
        return self.body.get("status", "")


def post_job(
    base: str,
    user: str,
    name: str,
    args: dict[str, Any],
    *,
    key: str | None = None,
    timeout_s: float = 30.0,
) -> Answer:
    body: dict[str, Any] = {"name": name, "args": args, "timeout_s": timeout_s}
    if key is not None:
        body["idempotency_key"] = key
    with httpx.Client(headers=headers(), timeout=timeout_s + HTTP_SLACK_S) as client:
        r = client.post(f"{base}/v1/users/{user}/jobs", json=body)
    return Answer(r.status_code, r.json(), time.time())


def presence(base: str, user: str, timeout_s: float = 5.0) -> tuple[int, dict[str, Any]]:
    with httpx.Client(headers=headers(), timeout=timeout_s) as client:
        r = client.get(f"{base}/v1/users/{user}/presence")
    return r.status_code, r.json()


def wait_online(base: str, user: str, timeout_s: float = 15.0) -> str:
    """Wait until presence reads online; return the holder session id."""

    def ok():
        code, body = presence(base, user)
        return code == 200 and body["online"] and body["session_id"]

    return wait_until(ok, timeout_s=timeout_s, what=f"{user} online via {base}")


class Callers:
    """HTTP callers running in threads; ``result(f)`` is bounded."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="caller")

    def post(self, *args: Any, **kwargs: Any) -> Future[Answer]:
        """``post_job(*args, **kwargs)`` in a thread."""
        return self._pool.submit(post_job, *args, **kwargs)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Procs:
    """Processes started by one test; all stopped (by process group) at teardown."""

    def __init__(self) -> None:
        self.all: list[Proc] = []
        self.callers = Callers()

    def add(self, proc: Proc) -> Proc:
        self.all.append(proc)
        return proc

    def hub(self, tmp: Path, env: dict[str, str], **kwargs: Any) -> Hub:
        hub = Hub(tmp, workers=1, env=env, **kwargs)
        self.add(hub)
        hub.wait_healthy()
        return hub

    def stop_all(self) -> None:
        self.callers.close()
        for proc in reversed(self.all):
            try:
                proc.stop(timeout_s=5.0)
            except Exception as exc:  # noqa: BLE001 - stop the rest regardless
                print(f"stopping {proc.argv[0]} failed: {exc!r}")

    def dump_logs(self, lines: int = 60) -> None:
        seen = set()
        for proc in self.all:
            if proc.log_path in seen:
                continue
            seen.add(proc.log_path)
            tail = proc.log_path.read_text(errors="replace").splitlines()[-lines:]
            print(f"\n===== {proc.log_path.name} (last {lines} lines) =====")
            print("\n".join(tail))


def pods_behind_haproxy(
    tmp_path: Path, procs: Procs, env: dict[str, str]
) -> tuple[str, Ledger, Sidecar, Hub, Hub, str]:
    """Two pods behind HAProxy, a sidecar (``counting_tools``, its ledger) through
    HAProxy, for a new user; returns the user, the ledger, the sidecar, the pod holding
    its socket, the other pod and the session id. Bounded waits: 15 s online, 5 s for
    the holder."""
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    pods = [procs.hub(tmp_path, env, name=f"pod{i}") for i in (1, 2)]
    lb = procs.add(HAProxy(tmp_path, [p.port for p in pods]))
    lb.wait_ready()
    sidecar = procs.add(
        Sidecar(tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()})
    )
    sid = wait_online(lb.http, user)
    doomed = wait_until(lambda: holder(pods, user, sid), timeout_s=5, what="socket holder")
    survivor = pods[1] if doomed is pods[0] else pods[0]
    return user, ledger, sidecar, doomed, survivor, sid


def bridge_dispatch(
    redis_url: str,
    user: str,
    name: str,
    args: dict[str, Any],
    *,
    key: str | None = None,
    timeout_s: float = 30.0,
) -> Answer:
    """``Bridge.dispatch`` from the test process, straight over Redis (no hub involved:
    presence check, XADD, BLPOP), in its own trio run. ``http_status`` is what the HTTP
    API would answer for the outcome."""
    import trio
    from deskbridge_hub import Bridge, RedisSubstrate
    from deskbridge_hub._app import HTTP_STATUS

    async def main():
        substrate = RedisSubstrate.from_url(redis_url)
        async with substrate:
            with trio.fail_after(timeout_s + HTTP_SLACK_S):
                return await Bridge(substrate).dispatch(
                    user, name, args, idempotency_key=key, timeout_s=timeout_s
                )

    outcome = trio.run(main)
    body: dict[str, Any] = {"job_id": outcome.job_id, "status": outcome.status}
    if outcome.status == "completed":
        body["result"] = outcome.result
    else:
        body["error"] = outcome.error
    return Answer(HTTP_STATUS[outcome.status], body, time.time())


def worker_pid(hub: Hub) -> int:
    """The pid of the hub's serving worker (Hypercorn forks one even with --workers 1),
    from its "hub serving" log line."""
    import re

    def find():
        m = re.search(r"deskbridge\.hub\[(\d+)\]: hub serving", hub.output())
        return m and int(m.group(1))

    return wait_until(find, timeout_s=5, what="the hub worker's pid")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux ``/proc/<pid>/stat``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in the test process (threads) that can drop its
    connections *on one side only*: ``cut_client_side()`` resets the client's end (the
    sidecar sees a reset at once, as after a Wi-Fi switch) and leaves the upstream
    (hub) end open and silent, so the hub learns of the loss only from its own ping
    deadline. New connections are proxied as before."""

    def __init__(self, upstream_port: int) -> None:
        import socket
        import threading

        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.ws = f"ws://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns: list[dict[str, Any]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                if self._closed:
                    return
                continue
            conn = {"client": client, "upstream": upstream, "cut": False}
            with self._lock:
                if self._closed:  # closed meanwhile: close() did not see these two
                    client.close()
                    upstream.close()
                    return
                self._conns.append(conn)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(conn, src, dst), daemon=True).start()

    @staticmethod
    def _pump(conn: dict[str, Any], src: Any, dst: Any) -> None:
        import socket

        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if conn["cut"]:
                return  # black hole: nothing more is forwarded either way
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def cut_client_side(self) -> int:
        """Reset every live connection's client end; keep the upstream ends open and
        silent. Returns how many connections were cut."""
        import socket
        import struct

        n = 0
        with self._lock:
            for conn in self._conns:
                if conn["cut"]:
                    continue
                conn["cut"] = True
                client = conn["client"]
                try:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    # wake the pump blocked in recv (a close alone would wait for it),
                    # then close: with linger 0 the sidecar gets a reset
                    client.shutdown(socket.SHUT_RD)
                    client.close()
                except OSError:
                    pass
                n += 1
        return n

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._listener.close()
        with self._lock:
            for conn in self._conns:
                for end in ("client", "upstream"):
                    try:
                        conn[end].close()
                    except OSError:
                        pass


def redis_command(*command: Any, url: str = REDIS_URL) -> Any:
    """One command to the Redis at ``url`` (default: the machine's), through the raw
    RESP oracle of ``tests.procs`` (a fresh connection per command; retried twice on a
    connection-level error)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    for attempt in range(3):  # the oracle, not the system under test: ride out a
        try:  # transient connect failure on a loaded machine
            return resp_command(parts.hostname or "127.0.0.1", parts.port or 6379, *command)
        except OSError as exc:
            if attempt == 2:
                raise OSError(f"Redis oracle {command[0]} failed 3 times: {exc!r}") from exc
            time.sleep(0.2)
