"""The short Redis request path (``_redis_wire``) on real Redis: a write on a quiet
connection goes straight to the socket under trio, and what the kernel does not take at
once (a command far larger than the socket's send buffer) goes on through the stream, whole
and in order; a busy connection's writes and every write under asyncio go through the
stream. Every wait bounded."""

from __future__ import annotations

import os
import secrets
import signal
import socket
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing
from coredis.connection import TCPLocation
from coredis.exceptions import ConnectionError as RedisConnectionError
from deskbridge_hub._redis_wire import WireConnection

from ..conftest import REDIS_URL
from ..procs import RedisServer

HOST, PORT = REDIS_URL.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)


async def _with_connection(body, host=HOST, port=PORT, **kw) -> None:  # type: ignore[no-untyped-def]
    await with_connection(TCPLocation(host, int(port)), body, **kw)


async def with_connection(location, body, **kw) -> None:  # type: ignore[no-untyped-def]
    """``body(conn)`` with a running ``WireConnection`` to ``location`` (``kw``: its
    options), invalidated after. Shared with ``test_redis_wire_unix``."""
    conn = WireConnection(location, connect_timeout=5.0, **kw)
    async with anyio.create_task_group() as tg:
        await tg.start(conn.run)
        try:
            await body(conn)
        finally:
            conn.invalidate()


async def test_a_command_larger_than_the_send_buffer_arrives_whole_after_small_ones() -> None:
    key = f"test-wire-{secrets.token_hex(4)}"
    big = secrets.token_hex(8 * 1024 * 1024)  # 16 MiB: more than loopback takes at once

    async def body(conn: WireConnection) -> None:
        assert conn._raw is not None  # trio, plain TCP: the direct path is in use
        with trio.fail_after(30):
            assert await conn.create_request(b"SET", key + ":a", "small") == "OK"
            # two outstanding: the write goes straight to the socket, which takes part
            large = conn.create_request(b"SET", key, big)
            after = conn.create_request(b"GET", key + ":a")
            assert [await large, await after] == ["OK", "small"]
            assert await conn.create_request(b"STRLEN", key) == len(big)
            assert await conn.create_request(b"GET", key) == big
            await conn.create_request(b"DEL", key, key + ":a")

    await _with_connection(body)


async def test_concurrent_writers_interleave_whole_commands() -> None:
    key = f"test-wire-{secrets.token_hex(4)}"
    big = "x" * (4 * 1024 * 1024)
    got: dict[int, object] = {}

    async def body(conn: WireConnection) -> None:
        async def one(i: int) -> None:
            value = big if i % 5 == 0 else f"v{i}"
            assert await conn.create_request(b"SET", f"{key}:{i}", value) == "OK"
            got[i] = await conn.create_request(b"STRLEN", f"{key}:{i}")

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(one, i)
            await conn.create_request(b"DEL", *[f"{key}:{i}" for i in range(40)])
        assert got == {i: len(big) if i % 5 == 0 else len(f"v{i}") for i in range(40)}

    await _with_connection(body)


@pytest.mark.parametrize("backend", ["asyncio"])
def test_under_asyncio_writes_go_through_the_stream(backend: str) -> None:
    async def main() -> None:
        async def body(conn: WireConnection) -> None:
            assert conn._raw is None
            with anyio.fail_after(10):
                assert await conn.create_request(b"PING") == "PONG"

        await _with_connection(body)

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_timeout_already_over_answers_timeout_error_on_both_backends(backend: str) -> None:
    got: list[object] = []

    async def main() -> None:
        async def body(conn: WireConnection) -> None:
            with anyio.fail_after(10):
                for timeout in (-0.5, 0.0, float("nan")):
                    got.append(
                        await conn.create_request(b"BLPOP", f"none-{secrets.token_hex(4)}", 5,
                                                  raise_exceptions=False, timeout=timeout)
                    )  # fmt: skip

        await _with_connection(body)

    anyio.run(main, backend=backend)
    assert [type(g) for g in got] == [TimeoutError] * 3, got


@pytest.mark.parametrize("self_read", [False, True])
async def test_a_connection_killed_under_a_waiting_request_fails_it(self_read: bool) -> None:
    """With or without a reader task (``self_read``: the waiting task reads)."""

    async def body(conn: WireConnection) -> None:
        with trio.fail_after(10):
            my_id = await conn.create_request(b"CLIENT ID")
            waiting = conn.create_request(b"BLPOP", f"none-{secrets.token_hex(4)}", 0)

            async def kill() -> None:
                other = WireConnection(TCPLocation(HOST, int(PORT)), connect_timeout=5.0)
                async with trio.open_nursery() as nursery:
                    await nursery.start(other.run)
                    # once Redis has the BLPOP blocked (bounded polling, not a guess)
                    listing = (b"CLIENT", b"LIST", b"ID", my_id)
                    while "cmd=blpop" not in await other.create_request(*listing):  # noqa: ASYNC110 - polling Redis' own view
                        await trio.sleep(0.01)
                    await other.create_request(b"CLIENT KILL", b"ID", my_id)
                    other.invalidate()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill)
                with pytest.raises(RedisConnectionError):
                    await waiting
            assert not conn.usable

    await _with_connection(body, self_read=self_read)


async def test_a_cancelled_large_write_still_arrives_whole_and_in_order() -> None:
    key = f"test-wire-{secrets.token_hex(4)}"
    big = secrets.token_hex(8 * 1024 * 1024)

    async def body(conn: WireConnection) -> None:
        with trio.fail_after(30):
            with trio.CancelScope() as scope:
                large = conn.create_request(b"SET", key, big)
                scope.cancel()  # the awaiting task is cancelled as it writes
                await large
            assert await conn.create_request(b"SET", key + ":b", "small") == "OK"
            assert await conn.create_request(b"GET", key + ":b") == "small"
            assert await conn.create_request(b"STRLEN", key) == len(big)
            await conn.create_request(b"DEL", key, key + ":b")

    await _with_connection(body)


async def test_the_reader_lets_other_tasks_run_during_a_large_reply() -> None:
    key = f"test-wire-{secrets.token_hex(4)}"
    big = "y" * (32 * 1024 * 1024)
    ticks = 0

    async def body(conn: WireConnection) -> None:
        nonlocal ticks
        with trio.fail_after(30):
            await conn.create_request(b"SET", key, big)

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                assert len(await conn.create_request(b"GET", key)) == len(big)
                nursery.cancel_scope.cancel()
            await conn.create_request(b"DEL", key)
        assert ticks > 10, ticks

    await _with_connection(body)


async def test_a_write_to_a_stalled_redis_is_bounded_and_closes_the_connection(
    tmp_path: Path,
) -> None:
    redis = RedisServer(tmp_path)
    redis.wait_ready()
    big = secrets.token_hex(16 * 1024 * 1024)  # more than the kernel takes at once

    async def body(conn: WireConnection) -> None:
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            with trio.fail_after(15):
                got = await conn.create_request(b"SET", "k", big, raise_exceptions=False)
            assert isinstance(got, RedisConnectionError), got
            assert not conn.usable
        finally:
            os.kill(redis.pid, signal.SIGCONT)

    try:
        await _with_connection(body, host="127.0.0.1", port=redis.port, write_timeout_s=1.0)
    finally:
        redis.stop()


async def _http_like_peer(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
    """A server that answers every read as an HTTP server does and keeps the connection
    open (a wrong port: another web service, a proxy)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            while await stream.receive_some(4096):
                await stream.send_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

    await trio.serve_listeners(answer, listeners)


async def test_a_peer_answering_in_another_protocol_is_a_connection_error_naming_it() -> None:
    """A newcomer pass: DESKBRIDGE_REDIS_URL at a port where an HTTP server answers raised
    coredis' InvalidResponse ("Unknown RESP data type: 'H'") out of the handshake: a
    160-line lifespan traceback and exit 1 from `serve`, a traceback from `revoke`. It is a
    connection error (the hub retries, the CLI says one line) that says what is wrong."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_http_like_peer)
        conn = WireConnection(TCPLocation("127.0.0.1", port), connect_timeout=5.0)
        with trio.fail_after(10), pytest.raises(RedisConnectionError) as refused:
            await conn.run()
        assert "not Redis' protocol" in str(refused.value), refused.value
        assert "is it a Redis server" in str(refused.value), refused.value
        assert not conn.usable
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("self_read", [False, True])
async def test_a_reply_in_another_protocol_after_the_handshake_fails_the_request_only(
    self_read: bool,
) -> None:
    """The same fault met after the handshake (a proxy in front of Redis that starts
    answering otherwise): coredis' InvalidResponse left the reader and broke the task
    group that runs the connection. The connection is dropped and the waiting request
    fails with a connection error naming the cause; also on a dedicated connection whose
    requesters read their own replies (``self_read``: no reader task)."""

    async def peer(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])

        async def answer(stream: trio.SocketStream) -> None:
            async with stream:
                await stream.receive_some(4096)  # HELLO 3
                await stream.send_all(b"%1\r\n+proto\r\n:3\r\n")
                while await stream.receive_some(4096):
                    await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        await trio.serve_listeners(answer, listeners)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(peer)
        conn = WireConnection(
            TCPLocation("127.0.0.1", port), connect_timeout=5.0, self_read=self_read
        )
        with trio.fail_after(10):
            await nursery.start(conn.run)
            with pytest.raises(RedisConnectionError) as failed:
                await conn.create_request(b"PING")
        assert "not Redis' protocol" in str(failed.value), failed.value
        assert not conn.usable
        nursery.cancel_scope.cancel()


class _Steps(trio.abc.Instrument):
    """Counts scheduler steps of the connection's own tasks (``run``, the writer)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if "_redis_wire" in task.name:
            self.steps += 1


async def test_a_self_reading_connection_reads_its_replies_in_the_requesting_task() -> None:
    """A dedicated connection (``self_read``: one request at a time, no push frames) has
    no reader task: the task awaiting a reply reads it (issue 10: one scheduler pass and
    one wake-up fewer per blocking command)."""

    async def body(conn: WireConnection) -> None:
        await trio.testing.wait_all_tasks_blocked()  # the connection's tasks have started
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            with trio.fail_after(10):
                for _ in range(20):
                    assert await conn.create_request(b"PING") == "PONG"
                key = f"none-{secrets.token_hex(4)}"
                assert await conn.create_request(b"BLPOP", key, 0.01) is None
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 0

    await _with_connection(body, self_read=True)


async def test_an_idle_self_reading_connection_closed_by_redis_is_found_before_its_next_use() -> (
    None
):
    """No reader task sees the EOF of an idle dedicated connection: ``idle_alive`` looks
    (a peek) before the connection is used again, so the next blocking command goes out
    on a new one instead of failing on the dead one (a pop is never sent twice)."""

    async def body(conn: WireConnection) -> None:
        with trio.fail_after(10):
            my_id = await conn.create_request(b"CLIENT ID")
            assert conn.idle_alive()
            other = WireConnection(TCPLocation(HOST, int(PORT)), connect_timeout=5.0)
            async with trio.open_nursery() as nursery:
                await nursery.start(other.run)
                await other.create_request(b"CLIENT KILL", b"ID", my_id)
                other.invalidate()
            while conn.idle_alive():  # noqa: ASYNC110 - the kill's FIN is on its way
                await trio.sleep(0.01)
            assert not conn.usable

    await _with_connection(body, self_read=True)


async def test_a_blocking_command_after_its_idle_connection_was_killed_is_answered() -> None:
    """The session's dedicated connections read their own replies: one killed while idle
    is replaced before the next blocking command, which is answered (not failed)."""
    await killed_idle_connection_replaced(REDIS_URL)


async def killed_idle_connection_replaced(url: str) -> None:
    """Through a session on ``url``: its dedicated connection for blocking commands,
    killed while idle, is replaced and the next blocking command answered (not failed,
    not sent twice). Shared with the Unix socket's test (``test_redis_wire_unix``)."""
    from deskbridge_hub._redis_session import _Session

    s = _Session(
        url, connect_timeout_s=5.0, command_timeout_s=5.0, max_connections=16,
        client_name="test-self-read",
    )  # fmt: skip
    await s.open()
    try:
        with trio.fail_after(10):
            key = f"none-{secrets.token_hex(4)}"
            assert await s.execute((b"BLPOP", key, 0.01), timeout_s=5.0) == [None]
            (c,) = s._blocking_idle
            assert c.conn is not None
            (my_id,) = await s.execute((b"CLIENT", b"ID"), timeout_s=5.0)
            listing = await s.execute((b"CLIENT", b"LIST"), timeout_s=5.0)
            ids = [
                line.split(" ", 1)[0].removeprefix("id=")
                for line in listing[0].splitlines()
                if "name=test-self-read" in line and "cmd=blpop" in line
            ]
            assert len(ids) == 1 and ids[0] != str(my_id)
            assert await s.execute((b"CLIENT KILL", b"ID", ids[0]), timeout_s=5.0) == [1]
            raw = c.conn._raw
            assert raw is not None
            while True:  # until the kill's FIN is there (nobody reads the idle connection)
                try:
                    if raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        break
                except BlockingIOError:
                    pass
                await trio.sleep(0.01)
            assert await s.execute((b"RPUSH", key, "v"), timeout_s=5.0) == [1]
            assert await s.execute((b"BLPOP", key, 1), timeout_s=5.0) == [[key, "v"]]
            assert s.statistics().opened_total == 3  # shared, dedicated, its replacement
    finally:
        await s.close()
