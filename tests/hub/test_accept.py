"""Accepting connections in bursts (``_accept``).

Was (``bench/overload.py``): trio's accept loop took one connection per pass of the event
loop (every ``accept`` yields), so a process busy with a thousand calls took 10-20 new
connections a second and callers waited 20-30 s in the listen backlog before the hub saw
their request. Loopback sockets, no sleeping; every wait bounded.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import trio
import trio.testing
from deskbridge_hub import _accept
from hypercorn.trio import run as hypercorn_trio_run


def _listening() -> trio.SocketListener:
    """A listener as Hypercorn's trio worker makes one (a stdlib socket, listening)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


@contextlib.asynccontextmanager
async def _eager_with_waiting(
    burst: int, clients: int
) -> AsyncIterator[tuple[_accept.EagerSocketListener, trio.SocketListener, list[socket.socket]]]:
    """An eager listener of ``burst`` and ``clients`` connections in its backlog; all
    closed at the end."""
    inner = _listening()
    listener = _accept.EagerSocketListener(inner, burst=burst)
    port = inner.socket.getsockname()[1]
    waiting = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(clients)]
    try:
        yield listener, inner, waiting
    finally:
        for client in waiting:
            client.close()
        await listener.aclose()


async def test_connections_waiting_are_taken_without_yielding_up_to_the_burst():
    async with _eager_with_waiting(3, 5) as (listener, inner, clients):
        with trio.fail_after(10):
            # the connections are in the backlog (the handshake is the kernel's)
            await trio.testing.wait_all_tasks_blocked()
            taken = []
            for _ in range(3):
                with trio.testing.assert_no_checkpoints():
                    taken.append(await listener.accept())
            with trio.testing.assert_checkpoints():  # the burst is over: it yields
                taken.append(await listener.accept())
            with trio.testing.assert_no_checkpoints():  # a new burst
                taken.append(await listener.accept())
            for stream, client in zip(taken, clients, strict=True):
                client.sendall(b"x")
                assert await stream.receive_some(1) == b"x"
                assert stream.getsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY)
            with trio.move_on_after(0.2) as nothing:  # none waiting: it waits, as trio's
                await listener.accept()
            assert nothing.cancelled_caught
            for stream in taken:
                await stream.aclose()
    assert inner.socket.fileno() == -1


async def test_a_cancelled_accept_takes_no_connection_as_trio_s():
    """Was: inside a cancelled scope (Hypercorn's shutdown cancels ``serve_listeners``)
    the burst still took the connections waiting, up to ``burst`` of them, and the accept
    loop handed each to a handler during shutdown; trio's ``accept`` raises ``Cancelled``
    first and leaves them in the backlog. Now so does the burst."""
    async with _eager_with_waiting(3, 2) as (listener, _inner, _clients):
        with trio.fail_after(10):
            await trio.testing.wait_all_tasks_blocked()
            with trio.CancelScope() as scope:
                scope.cancel()
                await listener.accept()
            assert scope.cancelled_caught
            taken = [await listener.accept() for _ in range(2)]  # both still waiting
            for stream in taken:
                await stream.aclose()


async def test_trio_s_own_listener_yields_at_every_accept():
    """What the burst is for: trio's ``SocketListener.accept`` checkpoints every time."""
    listener = _listening()
    port = listener.socket.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        with trio.fail_after(10), trio.testing.assert_checkpoints():
            stream = await listener.accept()
        await stream.aclose()
    finally:
        client.close()
        await listener.aclose()


async def test_install_gives_hypercorn_s_worker_listeners_that_accept_in_bursts(monkeypatch):
    monkeypatch.setattr(hypercorn_trio_run, "trio", trio)
    _accept.install()
    _accept.install()  # idempotent
    seen = hypercorn_trio_run.trio  # type: ignore[attr-defined]
    assert seen.serve_listeners is _accept.serve_listeners
    assert seen.SocketListener is trio.SocketListener and seen.socket is trio.socket
    plain = _accept.eager(_listening())
    assert isinstance(plain, _accept.EagerSocketListener)
    await plain.aclose()
