"""The short Redis request path (``_redis_wire``) on real Redis: a write on a quiet
connection goes straight to the socket under trio, and what the kernel does not take at
once (a command far larger than the socket's send buffer) goes on through the stream, whole
and in order; a busy connection's writes and every write under asyncio go through the
stream. Every wait bounded."""

from __future__ import annotations

import secrets

import anyio
import pytest
import trio
from coredis.connection import TCPLocation
from deskbridge_hub._redis_wire import WireConnection

from ..conftest import REDIS_URL

HOST, PORT = REDIS_URL.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)


async def _with_connection(body) -> None:  # type: ignore[no-untyped-def]
    conn = WireConnection(TCPLocation(HOST, int(PORT)), connect_timeout=5.0)
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
