"""A trio TCP proxy between one hub process and Redis that can stop forwarding without
closing anything (a black hole) and resume.

``serve(upstream_port)`` is an async context manager yielding a :class:`BlackholeProxy`
listening on a loopback port (``proxy.url()`` is what the hub's ``DESKBRIDGE_REDIS_URL``
names). While ``proxy.blackhole()`` lasts, neither direction is read or written, so
bytes stay in the kernel's buffers and nothing is closed (no FIN, no RST): what a network
partition or a dead NAT entry looks like from both ends. New connections are accepted
(the kernel does that) but not connected upstream until ``proxy.heal()``. Everything
runs in the caller's nursery; leaving the block closes every socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

_CHUNK = 65536


class BlackholeProxy:
    def __init__(self, upstream_port: int, listener: trio.SocketListener) -> None:
        self.upstream_port = upstream_port
        self._listener = listener
        self.port: int = listener.socket.getsockname()[1]
        self._open = trio.Event()
        self._open.set()
        self.accepted = 0

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def blackhole(self) -> None:
        """Stop forwarding, both ways, on every connection and new ones; close nothing."""
        if self._open.is_set():
            self._open = trio.Event()

    def heal(self) -> None:
        """Forward again (what was held in the kernel's buffers first)."""
        self._open.set()

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while True:
                await self._open.wait()
                data = await src.receive_some(_CHUNK)
                await self._open.wait()  # read before the hole opened: hold it
                if not data:
                    break
                await dst.send_all(data)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await dst.send_eof()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        async with client:
            await self._open.wait()
            try:
                upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream)
                nursery.start_soon(self._pump, upstream, client)


@contextlib.asynccontextmanager
async def serve(upstream_port: int) -> AsyncIterator[BlackholeProxy]:
    """A proxy to ``127.0.0.1:upstream_port`` on a free loopback port, for the block."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy = BlackholeProxy(upstream_port, listener)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, proxy._handle, [listener])
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
