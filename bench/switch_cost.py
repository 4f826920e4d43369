"""What one hand-off between two tasks costs on trio and on asyncio (issue 10: where the
per-call gap to the plain-asyncio peer comes from).

A call through the hub is a chain of hand-offs between tasks: the Redis reply reader
wakes the wake loop, which starts the task serving the entry, which wakes the socket's
writer; Hypercorn's reader wakes the session's reader, which wakes the serving task,
whose finishing script's reply wakes it again. A trio instrument counting
``before_task_step`` in a hub process under sequential calls counted about 12 task
steps per call (``bench/README.md``, "tenth round"). This bench measures the two
primitives such a hand-off is made of, on each event loop, in one process, CPU time:

  channel   a value sent to a task waiting on a channel and answered on another:
            trio ``open_memory_channel(0)`` x 2 vs asyncio ``Queue`` x 2 (two hand-offs
            per round)
  event     a task waiting on an event set by another, then the reverse: trio
            ``Event`` vs asyncio ``Event`` (two hand-offs per round)
  socket    a byte over a socketpair and back, one task waiting for the answer while
            another echoes: trio's ``SocketStream`` (a task per side) vs asyncio's
            transports and Protocols (how ``websockets``' asyncio side reads and writes)

and prints microseconds per hand-off (per round trip for ``socket``) and the trio /
asyncio ratio. Usage: ./dev bench switch_cost [--rounds 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

import trio


async def _trio_channel(rounds: int) -> None:
    to_b, from_a = trio.open_memory_channel[int](0)
    to_a, from_b = trio.open_memory_channel[int](0)

    async def b() -> None:
        async for v in from_a:
            await to_a.send(v)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(b)
        for i in range(rounds):
            await to_b.send(i)
            await from_b.receive()
        nursery.cancel_scope.cancel()


async def _asyncio_channel(rounds: int) -> None:
    to_b: asyncio.Queue[int] = asyncio.Queue(1)
    to_a: asyncio.Queue[int] = asyncio.Queue(1)

    async def b() -> None:
        while True:
            await to_a.put(await to_b.get())

    task = asyncio.create_task(b())
    for i in range(rounds):
        await to_b.put(i)
        await to_a.get()
    task.cancel()


async def _trio_event(rounds: int) -> None:
    state = {"ping": trio.Event(), "pong": trio.Event()}

    async def b() -> None:
        while True:
            await state["ping"].wait()
            state["ping"] = trio.Event()
            state["pong"].set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(b)
        for _ in range(rounds):
            state["ping"].set()
            await state["pong"].wait()
            state["pong"] = trio.Event()
        nursery.cancel_scope.cancel()


async def _asyncio_event(rounds: int) -> None:
    state = {"ping": asyncio.Event(), "pong": asyncio.Event()}

    async def b() -> None:
        while True:
            await state["ping"].wait()
            state["ping"] = asyncio.Event()
            state["pong"].set()

    task = asyncio.create_task(b())
    for _ in range(rounds):
        state["ping"].set()
        await state["pong"].wait()
        state["pong"] = asyncio.Event()
    task.cancel()


async def _trio_socket(rounds: int) -> None:
    a, b = socket.socketpair()
    sa, sb = (
        trio.SocketStream(trio.socket.from_stdlib_socket(a)),
        trio.SocketStream(trio.socket.from_stdlib_socket(b)),
    )

    async def echo() -> None:
        while data := await sb.receive_some(64):
            await sb.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        for _ in range(rounds):
            await sa.send_all(b"x")
            await sa.receive_some(64)
        nursery.cancel_scope.cancel()
    await sa.aclose()
    await sb.aclose()


class _Echo(asyncio.Protocol):
    """The echoing side: writes back what it reads (as ``websockets``' asyncio
    implementation, a Protocol fed by the loop's transport)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


class _Asker(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(data)


async def _asyncio_socket(rounds: int) -> None:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    ta, asker = await loop.create_connection(_Asker, sock=a)
    tb, _ = await loop.create_connection(_Echo, sock=b)
    for _ in range(rounds):
        asker.waiter = loop.create_future()
        ta.write(b"x")
        await asker.waiter
    ta.close()
    tb.close()


def _cpu_us(run: object, rounds: int) -> float:
    t0 = time.process_time()
    run()  # type: ignore[operator]
    return (time.process_time() - t0) / rounds * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=50_000)
    args, _ = p.parse_known_args()  # ./dev bench passes every bench the same options
    n = args.rounds
    print(f"switch_cost: {n} rounds each, CPU microseconds (time.process_time)")
    print(f"{'primitive':<10} {'trio':>10} {'asyncio':>10} {'trio/asyncio':>14}")
    for name, per, t, a in (
        ("channel", 2, _trio_channel, _asyncio_channel),
        ("event", 2, _trio_event, _asyncio_event),
        ("socket", 1, _trio_socket, _asyncio_socket),
    ):
        t_us = _cpu_us(lambda t=t: trio.run(t, n), n * per)
        a_us = _cpu_us(lambda a=a: asyncio.run(a(n)), n * per)
        unit = "per hand-off" if per == 2 else "per round trip"
        print(f"{name:<10} {t_us:>10.2f} {a_us:>10.2f} {t_us / a_us:>13.2f}x  ({unit})")


if __name__ == "__main__":
    main()
