"""The hub app served by real Hypercorn in the test's process (trio worker) on an
ephemeral loopback port, and raw-socket helpers for what an HTTP client library would
hide (how a connection ends, malformed requests)."""

from __future__ import annotations

import trio
from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate
from hypercorn.config import Config
from hypercorn.trio import serve

#: The API key of the served app.
API_KEY = "k"


async def serve_hub(nursery: trio.Nursery, *, keep_alive_timeout_s: float = 5.0) -> int:
    """Start the hub app (in-memory substrate, API key :data:`API_KEY`) under Hypercorn
    in ``nursery``; returns its port."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = keep_alive_timeout_s
    config.accesslog = None
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(API_KEY,)), MemorySubstrate())
    binds = await nursery.start(serve, app, config)
    return int(binds[0].rsplit(":", 1)[1])


async def until_eof(stream: trio.SocketStream, within_s: float) -> bytes:
    """What the hub sends until it closes the connection.

    Raises:
        trio.TooSlowError: the connection is still open after ``within_s`` seconds.
    """
    data = b""
    with trio.fail_after(within_s):
        while chunk := await stream.receive_some():
            data += chunk
    return data


async def exchange(port: int, request: bytes, within_s: float = 5.0) -> bytes:
    """Send ``request`` on a new connection; everything the hub sends until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        return await until_eof(stream, within_s)
