"""The real sidecar against the real hub, in one process (issue 9 item 6).

``sidecar_pair()`` runs the real sidecar :class:`~deskbridge_sidecar.Daemon` (its
sessions, runner, dedupe, reconnect loop) against the real hub session
(:func:`~deskbridge_hub._session.serve_sidecar`: handshake, presence, relay, delivery) on
``MemorySubstrate``, joined by ``deskbridge_common.testing``'s memory socket, on trio's
clock (use it under ``autojump_clock``). Callers use the real :class:`~deskbridge_hub.Bridge`.

It lives in the tests, not in either package's ``testing`` module, because it needs both
packages and neither may import the other (the sidecar ships to desktops; the hub must not
pull in the sidecar). The hand-written fakes (``FakeHub``, ``MemoryPeer``) stay for tests
that need a peer to misbehave on purpose.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from deskbridge_common import Timings
from deskbridge_common.testing import MemorySocket, memory_socket_pair
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SocketClosed
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._progress import ProgressRelay
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_sidecar import ConnectFailed, Daemon, ToolRegistry, TransportClosed, tool

EPOCH = 1_700_000_000.0
USER = "u1"
TOKEN = "pair-token"


def wall() -> float:
    """Unix time that follows trio's clock (MockClock moves it; no clock-gap alarms)."""
    return EPOCH + trio.current_time()


def _hub_closed(code: int, reason: str) -> SocketClosed:
    return SocketClosed(f"socket closed ({code}{': ' + reason if reason else ''})")


@attrs.define(eq=False)
class PairConnector:
    """The sidecar's :class:`~deskbridge_sidecar.Connector`: each connect opens a memory
    socket whose far end is served by the real hub session in the pair's nursery.

    Attributes:
        sockets: the sidecar ends, one per connection, in order.
        down: while True, connecting fails (``ConnectFailed``), as with a hub that is down.
    """

    state: HubState
    nursery: trio.Nursery
    user: str = USER
    relay: ProgressRelay | None = None
    sockets: list[MemorySocket] = attrs.field(factory=list)
    down: bool = False

    @asynccontextmanager
    async def connect(
        self, url: str, headers: Sequence[tuple[str, str]]
    ) -> AsyncIterator[MemorySocket]:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise ConnectFailed("connection refused (hub down)")
        assert dict(headers).get("Authorization") == f"Bearer {TOKEN}"
        client, server = memory_socket_pair(
            16, client_error=TransportClosed, server_error=_hub_closed
        )
        self.sockets.append(client)
        on_progress = None if self.relay is None else self.relay.offer
        self.nursery.start_soon(
            functools.partial(serve_sidecar, self.state, server, self.user, on_progress=on_progress)
        )
        try:
            yield client
        finally:
            client.abort()  # a no-op if the sidecar closed it properly


@attrs.define(eq=False)
class Pair:
    """A running hub + sidecar pair (see :func:`sidecar_pair`).

    Attributes:
        bridge: the dispatch API on the pair's substrate.
        daemon: the real sidecar daemon.
        state: the hub process's state (its sessions, substrate, timings).
        connector: how the daemon reaches the hub (its sockets; ``down``).
    """

    bridge: Bridge
    daemon: Daemon
    state: HubState
    connector: PairConnector

    @property
    def substrate(self) -> MemorySubstrate:
        assert isinstance(self.state.substrate, MemorySubstrate)
        return self.state.substrate

    def drop(self) -> None:
        """The network dies under the current socket: no close frame either way (1006)."""
        self.connector.sockets[-1].abort()

    async def wait_session(self, count: int) -> str:
        """Wait until the daemon has been welcomed ``count`` times in all; its session id."""
        while self.daemon.statistics().sessions_started < count:  # noqa: ASYNC110 - test poll
            await trio.sleep(0.01)
        session_id = self.daemon.statistics().session_id
        assert session_id is not None
        return session_id


@asynccontextmanager
async def sidecar_pair(
    *,
    tools: Iterable[Any] = (),
    timings: Timings | None = None,
    user: str = USER,
    approvals: Any = None,
) -> AsyncIterator[Pair]:
    """Run the real sidecar daemon against the real hub session, in-process.

    Args:
        tools: the sidecar's tools (``echo``, ``sleep``, ``status`` are always there).
        timings: the same knobs for hub and sidecar (default ``Timings()``).
        user: the user the socket authenticates as.
        approvals: the daemon's approval desk (``deskbridge_sidecar.testing.MemoryDesk``)
            for ``@needs_approval`` tools; default none (they are declined).

    Yields:
        A :class:`Pair`, once the sidecar is welcomed (presence is set).

    Cancellation: on exit the daemon and every hub session are cancelled.
    """
    timings = timings or Timings()
    substrate = MemorySubstrate(clock=wall)
    state = HubState(substrate=substrate, timings=timings, consumer="hub-1", wall_clock=wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)  # the process reader (the app runs it too)
        relay = ProgressRelay(substrate, timings.result_ttl_s)  # progress, as the app does
        nursery.start_soon(relay.run)
        connector = PairConnector(state, nursery, user, relay)
        daemon = Daemon(
            "ws://hub.pair:8080",
            TOKEN,
            registry=ToolRegistry(tools),
            timings=timings,
            wall_clock=wall,
            connector=connector,
            random=lambda: 0.5,
            approvals=approvals,
        )
        await nursery.start(daemon.run)
        yield Pair(Bridge(substrate, timings, wall_clock=wall), daemon, state, connector)
        nursery.cancel_scope.cancel()


def counting_tool(seconds: float) -> tuple[Any, list[float]]:
    """A side-effecting ``submit(form)`` tool that runs ``seconds`` (MockClock) and the
    list of the (trio) times it started: one entry per execution."""
    calls: list[float] = []

    @tool(side_effects=True)
    async def submit(form: str) -> dict[str, Any]:
        calls.append(trio.current_time())
        await trio.sleep(seconds)
        return {"submitted": form, "n": len(calls)}

    return submit, calls


__all__ = ["EPOCH", "Pair", "PairConnector", "counting_tool", "sidecar_pair", "wall"]
