"""A small HTTP ``CONNECT`` proxy for tests: what a corporate laptop's only way out looks like.

:class:`ConnectProxy` answers ``CONNECT host:port HTTP/1.1`` with ``200`` and then relays
bytes both ways; it records every tunnel it opened (``tunnels``: ``"host:port"``), every
status it refused with (``refused``) and every byte the client sent *inside* a tunnel
(``relayed``: what a proxy could read — TLS records for ``wss://``). With ``credentials``
it demands ``Proxy-Authorization: Basic`` and answers ``407`` to anything else; with
``refuse`` it answers that status to every ``CONNECT``; with ``silent`` it reads the
request and never answers.

Two ways to run it: ``await nursery.start(proxy.serve)`` in a trio test (returns the port),
or ``with running_proxy(...) as proxy:`` from a synchronous test (a trio loop in a thread,
stopped on exit, bounded).
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator

import trio

_CHUNK = 65536
_MAX_HEAD = 16384


class ConnectProxy:
    def __init__(
        self,
        *,
        credentials: tuple[str, str] | None = None,
        refuse: int | None = None,
        silent: bool = False,
    ) -> None:
        self.credentials = credentials
        self.refuse = refuse
        self.silent = silent
        self.port = 0
        self.tunnels: list[str] = []
        self.refused: list[int] = []
        self.requests: list[bytes] = []  # each CONNECT request head, as received
        self.relayed = bytearray()  # client -> upstream bytes inside tunnels
        self._refusal: trio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, [listener])

    async def wait_refused(self, count: int) -> None:
        """Until the proxy has refused ``count`` requests (a trio test, the proxy's loop)."""
        while len(self.refused) < count:
            self._refusal = trio.Event()
            await self._refusal.wait()

    async def _answer(self, client: trio.SocketStream, status: int, extra: str = "") -> None:
        self.refused.append(status)
        if self._refusal is not None:
            self._refusal.set()
        head = f"HTTP/1.1 {status} Refused by test proxy\r\n{extra}Content-Length: 0\r\n\r\n"
        await client.send_all(head.encode())

    def _authorized(self, head: bytes) -> bool:
        if self.credentials is None:
            return True
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "proxy-authorization":
                return value.strip() == f"Basic {expected}"
        return False

    async def _handle(self, client: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            async with client:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < _MAX_HEAD:
                    data = await client.receive_some(_CHUNK)
                    if not data:
                        return
                    head += data
                head, _, early = head.partition(b"\r\n\r\n")
                self.requests.append(head)
                if self.silent:
                    await trio.sleep_forever()
                method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
                if method != "CONNECT":
                    await self._answer(client, 405)
                    return
                if not self._authorized(head):
                    await self._answer(client, 407, 'Proxy-Authenticate: Basic realm="test"\r\n')
                    return
                if self.refuse is not None:
                    await self._answer(client, self.refuse)
                    return
                host, _, port = target.rpartition(":")
                try:
                    upstream = await trio.open_tcp_stream(host.strip("[]"), int(port))
                except OSError:
                    await self._answer(client, 502)
                    return
                self.tunnels.append(target)
                async with upstream:
                    await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    if early:
                        self.relayed += early
                        await upstream.send_all(early)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream, True, nursery)
                        nursery.start_soon(self._pump, upstream, client, False, nursery)

    async def _pump(
        self, src: trio.SocketStream, dst: trio.SocketStream, record: bool, nursery: trio.Nursery
    ) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await src.receive_some(_CHUNK):
                if record:
                    self.relayed += data
                await dst.send_all(data)
        nursery.cancel_scope.cancel()  # one side closed: the tunnel is over


@contextlib.contextmanager
def running_proxy(**kwargs: object) -> Iterator[ConnectProxy]:
    """A :class:`ConnectProxy` served by a trio loop in a thread for the block."""
    proxy = ConnectProxy(**kwargs)  # type: ignore[arg-type]
    ready = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            box["token"] = trio.lowlevel.current_trio_token()
            box["scope"] = nursery.cancel_scope
            await nursery.start(proxy.serve)
            ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise TimeoutError("the test proxy did not start within 10 s")
    try:
        yield proxy
    finally:
        scope = box["scope"]
        assert isinstance(scope, trio.CancelScope)
        trio.from_thread.run_sync(scope.cancel, trio_token=box["token"])  # type: ignore[arg-type]
        thread.join(10)
        assert not thread.is_alive(), "the test proxy did not stop within 10 s"
