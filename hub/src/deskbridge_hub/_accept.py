"""Accepting connections under load: up to :data:`ACCEPT_BURST` per pass of the loop.

Measured (``bench/overload.py``, 1,000 HTTP callers opening their connections at once on
one process, Hypercorn 0.18 under trio): the callers whose answers came 20-30 s after
their request (``timeout_s`` 10), and those with no answer within 30 s, were all the
first call of a new connection, and their time was spent before the hub saw the request
(the hub's own ``elapsed_ms`` was under 1.7 s for every one): the connection waited in
the kernel's listen backlog. trio's ``serve_listeners`` takes one connection per
``accept`` and every ``accept`` yields to the scheduler, so the accept loop takes one
connection per pass of the event loop; a pass of a loop busy with a thousand calls takes
its lag (0.05-0.1 s), so connections were taken at 10-20 a second.

Neither Hypercorn nor trio has a setting for it, so :func:`install` gives Hypercorn's
trio worker (``hypercorn.trio.run``, which calls ``trio.serve_listeners`` on listeners it
builds itself) listeners that, once woken, take the connections already waiting without
yielding in between, at most ``ACCEPT_BURST`` in a row, then yield as before (the accept
loop never monopolises the loop). A connection taken this way is what trio's own accept
makes (a ``SocketStream`` of the accepted socket, non-blocking, ``TCP_NODELAY``); any
error other than "none waiting" is left to trio's ``accept`` (it retries, skips or
raises as it always did, ``_fd_limits.AcceptErrorFilter`` included). Idempotent.
"""

from __future__ import annotations

import os
import socket
import types
from typing import Any

import trio
from hypercorn.trio import run as hypercorn_trio_run

#: Most connections taken in a row before the accept loop yields: 64 a pass is over
#: 600 a second at the 0.1 s lag of the overload bench, where one a pass was 10.
ACCEPT_BURST = 64


class EagerSocketListener(trio.abc.Listener[trio.SocketStream]):
    """A ``trio.SocketListener`` whose :meth:`accept` takes a connection already waiting
    in the backlog without yielding, up to ``burst`` in a row (module docstring).

    Args:
        inner: the listener it wraps (it keeps the listening socket; closed with it).
        burst: most connections taken in a row without yielding.
    """

    def __init__(self, inner: trio.SocketListener, burst: int = ACCEPT_BURST) -> None:
        self.inner = inner
        self.burst = burst
        # the same listening socket, non-blocking as trio set it (a dup shares the flag)
        self._raw: socket.socket | None = socket.socket(fileno=os.dup(inner.socket.fileno()))
        self._in_a_row = 0

    async def accept(self) -> trio.SocketStream:
        """A connection: one already waiting at once (no checkpoint) while the burst
        lasts, else trio's ``accept`` (a checkpoint, waiting if none is there).

        Cancellation: as trio's: inside a cancelled scope (or past its deadline) it takes
        no connection and raises ``Cancelled``.

        Raises:
            What ``trio.SocketListener.accept`` raises.
        """
        if (
            self._raw is not None
            and self._in_a_row < self.burst
            # cancelled (a shutdown): trio's accept raises Cancelled before it takes one
            and trio.current_effective_deadline() > trio.current_time()
        ):
            try:
                sock, _ = self._raw.accept()
            except OSError:  # none waiting (BlockingIOError), or an error trio handles
                pass
            else:
                self._in_a_row += 1
                return trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self._in_a_row = 0
        return await self.inner.accept()

    async def aclose(self) -> None:
        """Close the listener (both descriptors of its socket)."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        await self.inner.aclose()


def eager(listener: Any) -> Any:
    """``listener`` taking connections in bursts: a ``trio.SocketListener`` wrapped, the
    transport of a ``trio.SSLListener`` wrapped in place; anything else unchanged."""
    if isinstance(listener, trio.SocketListener):
        return EagerSocketListener(listener)
    if isinstance(listener, trio.SSLListener) and isinstance(
        listener.transport_listener, trio.SocketListener
    ):
        listener.transport_listener = EagerSocketListener(listener.transport_listener)
    return listener


async def serve_listeners(handler: Any, listeners: list[Any], **kwargs: Any) -> None:
    """``trio.serve_listeners`` over :func:`eager` listeners."""
    await trio.serve_listeners(handler, [eager(x) for x in listeners], **kwargs)


class _TrioForHypercorn(types.ModuleType):
    """The ``trio`` module as ``hypercorn.trio.run`` sees it: the same, but for
    :func:`serve_listeners`."""

    serve_listeners = staticmethod(serve_listeners)

    def __getattr__(self, name: str) -> Any:
        return getattr(trio, name)


def install() -> None:
    """Make Hypercorn's trio worker in this process accept in bursts. Idempotent."""
    if not isinstance(getattr(hypercorn_trio_run, "trio", None), _TrioForHypercorn):
        setattr(hypercorn_trio_run, "trio", _TrioForHypercorn("trio"))  # noqa: B010


__all__ = ["ACCEPT_BURST", "EagerSocketListener", "eager", "install"]
