"""The Redis wire over a Unix socket (``unix://path``) with a real ``redis-server
--unixsocket PATH --port 0``: a dedicated connection reads its own replies straight from
the socket (``_read_until``, no reader task), ``idle_alive`` finds an idle one Redis
closed, a blocking read whose connection Redis closes fails with a connection error,
and the session replaces an idle dedicated connection Redis closed before its next
blocking command. The same paths as TCP's (``test_redis_wire``), which had no Unix
socket test. Every wait bounded."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from coredis.connection import UnixDomainSocketLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from deskbridge_hub._redis_wire import WireConnection

from ..procs import wait_until
from .test_redis_wire import killed_idle_connection_replaced, with_connection


@contextlib.contextmanager
def _unix_redis_server() -> Iterator[str]:
    """A private redis-server listening on a Unix socket only; yields the socket's path."""
    with tempfile.TemporaryDirectory(prefix="db-redis-") as tmp:  # short: sun_path limit
        path = str(Path(tmp) / "r.sock")
        proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", path, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(lambda: Path(path).exists(), timeout_s=10, what="redis-server's socket")
            yield path
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def unix_redis() -> Iterator[str]:
    """One server for the module's tests that leave it running."""
    with _unix_redis_server() as path:
        yield path


@pytest.fixture
def own_unix_redis() -> Iterator[str]:
    """A server of the test's own (it shuts it down)."""
    with _unix_redis_server() as path:
        yield path


def _conn(path: str, **kw) -> WireConnection:  # type: ignore[no-untyped-def]
    return WireConnection(UnixDomainSocketLocation(path), connect_timeout=5.0, **kw)


async def _with_connection(path: str, body, **kw) -> None:  # type: ignore[no-untyped-def]
    await with_connection(UnixDomainSocketLocation(path), body, **kw)


async def _kill(path: str, client_id: int, *, when_blocked: bool = False) -> None:
    """``CLIENT KILL ID client_id`` from another connection; with ``when_blocked``, once
    Redis shows that client blocked (bounded polling of Redis' own view)."""
    other = _conn(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(other.run)
        listing = (b"CLIENT", b"LIST", b"ID", client_id)
        while when_blocked and "cmd=blpop" not in await other.create_request(*listing):  # noqa: ASYNC110 - polling Redis' own view
            await trio.sleep(0.01)
        await other.create_request(b"CLIENT KILL", b"ID", client_id)
        other.invalidate()


async def test_a_self_reading_unix_connection_reads_its_replies_from_the_socket(unix_redis):
    async def body(conn: WireConnection) -> None:
        with trio.fail_after(10):
            assert conn._raw is not None  # the direct path: a plain Unix socket
            for _ in range(5):
                assert await conn.create_request(b"PING") == "PONG"
            key = f"none-{secrets.token_hex(4)}"
            assert await conn.create_request(b"BLPOP", key, 0.01) is None
            assert await conn.create_request(b"RPUSH", key, "v") == 1
            assert await conn.create_request(b"BLPOP", key, 1) == [key, "v"]
            assert conn.idle_alive()

    await _with_connection(unix_redis, body, self_read=True)


async def test_an_idle_unix_connection_redis_closed_is_found_before_its_next_use(unix_redis):
    async def body(conn: WireConnection) -> None:
        with trio.fail_after(10):
            my_id = await conn.create_request(b"CLIENT ID")
            assert conn.idle_alive()
            await _kill(unix_redis, my_id)
            while conn.idle_alive():  # noqa: ASYNC110 - the kill's EOF is on its way
                await trio.sleep(0.01)
            assert not conn.usable
            with pytest.raises(RedisConnectionError):
                await conn.create_request(b"PING")

    await _with_connection(unix_redis, body, self_read=True)


@pytest.mark.parametrize("self_read", [False, True])
async def test_a_blocking_read_on_a_unix_connection_redis_closes_fails_it(unix_redis, self_read):
    async def body(conn: WireConnection) -> None:
        with trio.fail_after(10):
            my_id = await conn.create_request(b"CLIENT ID")
            waiting = conn.create_request(b"BLPOP", f"none-{secrets.token_hex(4)}", 0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _kill(unix_redis, my_id, when_blocked=True))
                with pytest.raises(RedisConnectionError):
                    await waiting
            assert not conn.usable

    await _with_connection(unix_redis, body, self_read=self_read)


async def test_the_session_replaces_an_idle_unix_connection_redis_closed(unix_redis):
    """Through the session a unix:// URL builds (``_redis_session``), as over TCP."""
    await killed_idle_connection_replaced(f"unix://{unix_redis}")


async def test_a_blocking_read_when_redis_shuts_down_fails_with_a_connection_error(
    own_unix_redis,
) -> None:
    """Redis going away entirely (SHUTDOWN: its socket file removed) under a waiting
    blocking read on a self-reading connection, and under an idle one."""
    path = own_unix_redis

    async def body(conn: WireConnection) -> None:
        idle = _conn(path, self_read=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(idle.run)
            with trio.fail_after(10):
                assert await idle.create_request(b"PING") == "PONG"
                my_id = await conn.create_request(b"CLIENT ID")
                waiting = conn.create_request(b"BLPOP", f"n-{secrets.token_hex(4)}", 0)

                async def shut_down() -> None:
                    other = _conn(path)
                    async with trio.open_nursery() as inner:
                        await inner.start(other.run)
                        listing = (b"CLIENT", b"LIST", b"ID", my_id)
                        while "cmd=blpop" not in await other.create_request(*listing):  # noqa: ASYNC110 - polling Redis' own view
                            await trio.sleep(0.01)
                        with pytest.raises(RedisConnectionError):
                            await other.create_request(b"SHUTDOWN", b"NOSAVE")
                        other.invalidate()

                nursery.start_soon(shut_down)
                with pytest.raises(RedisConnectionError):
                    await waiting
                assert not conn.usable
                while idle.idle_alive():  # noqa: ASYNC110 - its EOF is on its way
                    await trio.sleep(0.01)
                with pytest.raises(RedisConnectionError):
                    await idle.create_request(b"PING")
            idle.invalidate()

    await _with_connection(path, body, self_read=True)
