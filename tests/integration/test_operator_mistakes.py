"""Issue 11 item 6 (hub side): operator mistakes get one clear line, never silence or a
traceback. Real ``hypercorn`` / ``deskbridge-hub`` processes; every wait is bounded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from tests.procs import (
    BIN,
    REDIS_URL,
    SECRET,
    Hub,
    Proc,
    RedisServer,
    free_port,
    running,
    wait_until,
)

pytestmark = pytest.mark.integration

NO_REDIS_LINE = "DESKBRIDGE_REDIS_URL is not set"


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any DESKBRIDGE_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBRIDGE_")}
    env.update(extra)
    return env


def _run(argv: list[str], env: dict[str, str], timeout_s: float = 30.0):
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )


def test_two_hypercorn_workers_without_redis_url_refuse_to_start() -> None:
    port = free_port()
    done = _run(
        [
            str(BIN / "hypercorn"),
            "-k",
            "trio",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{port}",
            "deskbridge_hub.asgi:app",
        ],
        _env(DESKBRIDGE_SECRET=SECRET),
    )
    out = done.stdout + done.stderr
    assert NO_REDIS_LINE in out
    assert "memory://" in out  # the line says how to ask for it on purpose
    assert "Traceback" not in out
    assert "Running on" not in out  # never served
    # One line per worker (each imports the app), nothing else. Hypercorn's supervisor
    # exits 0 here (it loses the workers' status 2); the hub never ran, which is the point.
    assert [line for line in out.splitlines() if line.strip()] == [
        line for line in out.splitlines() if NO_REDIS_LINE in line
    ]


def test_bare_hypercorn_with_a_malformed_redis_url_prints_one_line() -> None:
    port = free_port()
    done = _run(
        [str(BIN / "hypercorn"), "-k", "trio", "-b", f"127.0.0.1:{port}",
         "deskbridge_hub.asgi:app"],
        _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL="redis://127.0.0.1:notaport/0"),
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert "Running on" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("deskbridge-hub: DESKBRIDGE_REDIS_URL must look like")
    assert "port 'notaport'" in lines[0]


@pytest.mark.parametrize("entry", ["serve", "hypercorn"])
def test_a_database_redis_does_not_have_stops_the_hub_in_one_line(entry: str) -> None:
    # /99 on a Redis with the default 16 databases was a lifespan traceback from both
    # entries; the test Redis has far fewer than 100,000.
    parts = urllib.parse.urlsplit(REDIS_URL)
    url = f"{parts.scheme}://{parts.netloc}/100000"
    port = free_port()
    argv = (
        [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{port}"]
        if entry == "serve"
        else [str(BIN / "hypercorn"), "-k", "trio", "-b", f"127.0.0.1:{port}",
              "deskbridge_hub.asgi:app"]
    )  # fmt: skip
    done = _run(argv, _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=url))
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    refusal = [line for line in out.splitlines() if line.startswith("deskbridge-hub: ")]
    assert refusal == [
        f"deskbridge-hub: Redis at {parts.hostname}:{parts.port} has no database 100000, which "
        "DESKBRIDGE_REDIS_URL names (DB index is out of range): choose a lower /DB or raise "
        "the server's `databases` setting"
    ], out
    # at most the health probe's ERROR with the same cause besides; never "unreachable"
    others = [line for line in out.splitlines() if line.strip() and line not in refusal]
    assert all("has no database 100000" in line for line in others), out
    if entry == "serve":  # Hypercorn's supervisor loses the worker's status (see above)
        assert done.returncode == 2


def _refused_in_one_line(url: str) -> tuple[list[str], str]:
    port = free_port()
    argv = [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{port}"]
    done = _run(argv, _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=url))
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert done.returncode == 2, out
    return [line for line in out.splitlines() if line.startswith("deskbridge-hub: ")], out


def test_a_configuration_error_exits_2_with_two_workers_as_with_one() -> None:
    """A newcomer pass: a wrong Redis password stopped `serve` with exit 2, and `serve
    --workers 2` with exit 1 (its supervisor's "a worker could not start"), so a service
    manager told to leave 2 alone restarted the second one forever."""
    parts = urllib.parse.urlsplit(REDIS_URL)
    url = f"redis://deskbridge-no-such-user:pw@{parts.hostname}:{parts.port}/0"
    argv = [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{free_port()}"]
    done = _run([*argv, "--workers", "2"], _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=url))
    out = done.stdout + done.stderr
    assert "refused the user name or password of DESKBRIDGE_REDIS_URL" in out, out
    assert done.returncode == 2, out


def test_a_cluster_url_for_a_redis_without_cluster_stops_the_hub_in_one_line() -> None:
    """A newcomer pass: redis+cluster:// to a plain Redis was a lifespan traceback (coredis'
    "This instance has cluster support disabled") and exit 1."""
    parts = urllib.parse.urlsplit(REDIS_URL)
    refusal, out = _refused_in_one_line(f"redis+cluster://{parts.hostname}:{parts.port}")
    assert refusal == [
        f"deskbridge-hub: Redis at {parts.hostname}:{parts.port} has cluster support "
        "disabled, which DESKBRIDGE_REDIS_URL's redis+cluster:// asks for: write "
        "redis://HOST:PORT/DB for a single Redis"
    ], out


def test_a_server_that_does_not_answer_as_redis_is_named_with_a_reason() -> None:
    """redis:// at a port that is not Redis (here an HTTP server), or rediss:// at a Redis
    without TLS, logged "unavailable (health probe): ;" with no reason at all."""
    with socket.socket() as http_like:
        http_like.bind(("127.0.0.1", 0))
        http_like.listen()  # accepts and never answers, as a TLS or HTTP peer would here
        port = http_like.getsockname()[1]
        hub_port = free_port()
        argv = [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{hub_port}"]
        env = _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=f"redis://127.0.0.1:{port}/0")
        try:
            _run(argv, env, timeout_s=8.0)
        except subprocess.TimeoutExpired as exc:  # it keeps serving, retrying Redis
            raw = [exc.stderr or b"", exc.stdout or b""]
            out = "".join(r.decode() if isinstance(r, bytes) else r for r in raw)
        else:
            raise AssertionError("the hub stopped")
    lines = [line for line in out.splitlines() if "unreachable (hub starting)" in line]
    assert lines, out
    assert "(health probe): ;" not in lines[0], lines[0]
    assert "no answer" in lines[0] and "is it a Redis server" in lines[0], lines[0]


class _HttpLikePeer:
    """A thread answering every read as an HTTP server does, keeping the connection open
    (DESKBRIDGE_REDIS_URL at the wrong port: a web service, a proxy)."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(4096):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            except OSError:
                return


def test_a_server_answering_in_another_protocol_is_one_line_not_a_traceback() -> None:
    """A newcomer pass: DESKBRIDGE_REDIS_URL at a port where an HTTP server answers was
    coredis' InvalidResponse out of the handshake: `serve` logged "ERROR deskbridge_hub:
    Exception" and 160 lines of traceback, then exited 1; `revoke` printed a traceback.
    Now `serve` keeps serving, retrying, with one line naming the cause, and `revoke`
    says one line, exit 1, as for a Redis that is down."""
    peer = _HttpLikePeer()
    url = f"redis://127.0.0.1:{peer.port}/0"
    hub = [str(BIN / "deskbridge-hub")]
    done = _run([*hub, "revoke", "alice"], _env(DESKBRIDGE_REDIS_URL=url))
    out = done.stdout + done.stderr
    assert "Traceback" not in out and done.returncode == 1, out
    assert "not Redis' protocol" in out, out
    argv = [*hub, "serve", "--bind", f"127.0.0.1:{free_port()}"]
    env = _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=url)
    try:
        done = _run(argv, env, timeout_s=8.0)
    except subprocess.TimeoutExpired as exc:  # it keeps serving, retrying Redis
        raw = [exc.stderr or b"", exc.stdout or b""]
        out = "".join(r.decode() if isinstance(r, bytes) else r for r in raw)
    else:
        raise AssertionError(f"the hub stopped: {done.stdout + done.stderr}")
    finally:
        peer.sock.close()
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if "unreachable (hub starting)" in line]
    assert lines and "not Redis' protocol" in lines[0], out


def test_a_wrong_redis_password_stops_the_hub_in_one_line() -> None:
    # was retried forever as an outage ("unreachable", a WARNING then INFO every 2 s):
    # an authentication failure is a configuration mistake that no retry mends
    parts = urllib.parse.urlsplit(REDIS_URL)
    url = f"redis://deskbridge-no-such-user:pw-never-logged@{parts.hostname}:{parts.port}/0"
    refusal, out = _refused_in_one_line(url)
    assert refusal == [
        f"deskbridge-hub: Redis at {parts.hostname}:{parts.port} refused the user name or "
        "password of DESKBRIDGE_REDIS_URL (invalid username-password pair or user is "
        "disabled.): write it as redis://[USER]:PASSWORD@HOST:PORT/DB, reserved characters "
        "percent-encoded"
    ], out
    assert "unreachable" not in out and "pw-never-logged" not in out, out


def test_a_missing_redis_password_stops_the_hub_in_one_line(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    with running(redis):
        redis.wait_ready()
        assert redis.command("CONFIG", "SET", "requirepass", "s3cret") == "OK"
        refusal, out = _refused_in_one_line(redis.url)
    assert refusal == [
        f"deskbridge-hub: Redis at 127.0.0.1:{redis.port} requires a password and "
        "DESKBRIDGE_REDIS_URL gives none: write it as redis://[USER]:PASSWORD@HOST:PORT/DB, "
        "reserved characters percent-encoded"
    ], out
    assert "unreachable" not in out, out


def test_explicit_memory_url_without_secret_logs_it_and_refusal_carries_the_reason(
    tmp_path: Path,
) -> None:
    port = free_port()
    hub = Proc(
        [
            str(BIN / "hypercorn"),
            "-k",
            "trio",
            "-b",
            f"127.0.0.1:{port}",
            "deskbridge_hub.asgi:app",
        ],
        {**_env(DESKBRIDGE_REDIS_URL="memory://"), "DESKBRIDGE_SECRET": ""},
        tmp_path / "hub.log",
    )
    try:
        wait_until(lambda: "Running on" in hub.output(), timeout_s=20, what="hub up")
        log = hub.output()
        assert "DESKBRIDGE_SECRET is not set" in log
        assert "ERROR" in log.split("DESKBRIDGE_SECRET is not set")[0].splitlines()[-1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                b"GET /v1/sidecar HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer x\r\n\r\n"
            )
            reply = b""
            while b"}}" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503")
        error = json.loads(body)["error"]
        assert error["code"] == "not_configured"
        assert "DESKBRIDGE_SECRET" in error["message"]
    finally:
        hub.stop()


def test_bind_port_in_use_prints_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(
            [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{port}"],
            _env(DESKBRIDGE_SECRET=SECRET),
        )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert f"deskbridge-hub serve: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        done.stderr
    )


def test_a_second_hub_on_a_port_a_two_worker_hub_serves_is_refused(tmp_path: Path) -> None:
    """A newcomer pass: ``serve --workers 2`` bound its socket with SO_REUSEPORT
    (Hypercorn's ``create_sockets`` does for workers > 1), so a second ``serve --workers
    2`` on the same port started without a word and the kernel shared the connections
    between the two hubs (each with its own secret, Redis, code version)."""
    first = Hub(tmp_path, workers=2)
    with running(first):
        first.wait_healthy()
        done = _run(
            [str(BIN / "deskbridge-hub"), "serve", "--bind", f"127.0.0.1:{first.port}",
             "--workers", "2"],
            _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_URL=REDIS_URL),
        )  # fmt: skip
    out = done.stdout + done.stderr
    assert "Running on" not in out, out
    assert done.returncode == 2, out
    assert (
        f"deskbridge-hub serve: cannot listen on 127.0.0.1:{first.port}: Address already in use"
        in done.stderr
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bind_host_that_does_not_resolve_prints_one_line(workers: str) -> None:
    """A newcomer pass: a typo'd --bind host (with an API key, as a non-loopback bind
    needs) was exit 1 and Hypercorn's socket.gaierror traceback."""
    done = _run(
        [
            str(BIN / "deskbridge-hub"),
            "serve",
            "--bind",
            "nosuchhost.invalid:1",
            "--workers",
            workers,
        ],
        _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_API_KEY="k", DESKBRIDGE_REDIS_URL=REDIS_URL),
    )
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        "deskbridge-hub serve: cannot listen on nosuchhost.invalid:1: --bind host "
        "'nosuchhost.invalid' does not resolve"
    ), done.stderr


def test_misspelt_variable_is_named_with_the_nearest_known_one() -> None:
    done = _run(
        [str(BIN / "deskbridge-hub"), "serve", "--bind", "127.0.0.1:bad"],  # exits at once
        _env(DESKBRIDGE_SECRET=SECRET, DESKBRIDGE_REDIS_ULR="redis://x", DESKBRIDGE_ZZZZ="1"),
    )
    assert done.returncode == 2
    err = done.stderr
    assert (
        "unknown environment variable DESKBRIDGE_REDIS_ULR is ignored; "
        "did you mean DESKBRIDGE_REDIS_URL?" in err
    )
    assert "unknown environment variable DESKBRIDGE_ZZZZ is ignored" in err
    assert "DESKBRIDGE_SECRET" not in err.replace("DESKBRIDGE_SECRET is", "")


def test_version() -> None:
    from importlib.metadata import version

    done = _run([str(BIN / "deskbridge-hub"), "--version"], _env())
    assert done.returncode == 0
    assert done.stdout.strip() == f"deskbridge-hub {version('deskbridge-hub')}"
