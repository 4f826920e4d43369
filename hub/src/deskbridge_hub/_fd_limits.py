"""File descriptors: what a client that connects and says nothing costs the hub process,
and what the process does at its ``ulimit -n`` (``RLIMIT_NOFILE``).

Measured against a real ``deskbridge-hub serve --workers 1`` (tests/integration/
test_os_limits.py), Hypercorn 0.18 under trio:

- **A connection closed before its request.** Hypercorn's connection task reads EOF, but
  then waits for its keep-alive timer (``keep_alive_timeout``, 75 s) before it closes the
  socket: the timer is a task of the connection's task group and nothing stops it when
  the peer has gone without a request (a load balancer's TCP check, a port scan, a
  client that gave up while the listen backlog was full). Each such connection held a
  descriptor in CLOSE-WAIT for 75 s, so 14 connects a second with no request kept a
  process at the common default limit of 1024, and a process at its limit served the
  dead connections of its backlog first, 75 s per backlog's worth: it never came back
  while clients kept retrying. :class:`PromptClosingTCPServer` stops that timer as soon
  as reading ends; a request still being answered finishes first (the timer is not
  running while one is).
- **accept() failing with EMFILE.** trio's ``serve_listeners`` sleeps 0.1 s and retries
  (no spin, no crash: new connections wait in the kernel's listen backlog), but logs an
  ERROR with a traceback on every retry: ten a second for as long as the process sits at
  its limit. :class:`AcceptErrorFilter` keeps the first line, without the traceback and
  saying what it means, then one a minute counting the rest.

Hypercorn has no setting for the first and trio none for the second, so :func:`install`
replaces ``TCPServer`` in ``hypercorn.trio.run`` (looked up when the worker starts
serving, after the app is loaded) and adds the filter to trio's logger. Idempotent.
"""

from __future__ import annotations

import errno
import logging
import resource
import time

from hypercorn.trio import run as hypercorn_trio_run
from hypercorn.trio.tcp_server import TCPServer

from ._peer_noise import LogBudget

#: trio's logger for its accept loop (``trio._highlevel_serve_listeners``).
ACCEPT_LOGGER = "trio.serve_listeners"
#: After the first line about failing accepts: at most one per this many seconds.
ACCEPT_LOG_INTERVAL_S = 60.0


class PromptClosingTCPServer(TCPServer):
    """Hypercorn's trio connection, closed as soon as the peer's EOF has been read (and no
    request is being answered), instead of after ``keep_alive_timeout``."""

    async def _read_data(self) -> None:
        await super()._read_data()
        # Reading ended (EOF, a reset, a closed stream): no request can come any more.
        # The keep-alive timer is the only task left that would hold the connection open.
        await self.idle_task.stop()


class AcceptErrorFilter(logging.Filter):
    """Rewrites trio's "accept returned EMFILE/ENFILE/ENOBUFS/ENOMEM" ERROR lines: the
    first one without a traceback and with the limit named, then one a minute counting
    the ones left out. Other records pass unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._budget = LogBudget(burst=0, interval_s=ACCEPT_LOG_INTERVAL_S)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, OSError) or exc.errno not in _CAPACITY_ERRNOS:
            return True
        held = self._budget.admit(time.monotonic())
        if held is None:
            return False
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        record.msg = (
            "cannot accept connections: %s (%s): this process is at its limit of %d file "
            "descriptors (ulimit -n) or the system's; new connections wait in the listen "
            "backlog, accept is retried every 0.1 s (%d such failures not logged since "
            "the last line)"
        )
        record.args = (name, exc.strerror, soft, held)
        record.exc_info = None
        record.exc_text = None
        return True


#: What trio's accept loop retries on (its ``ACCEPT_CAPACITY_ERRNOS``).
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def install() -> None:
    """Make Hypercorn (trio worker) in this process close a connection once its peer has
    gone, and rate-limit trio's log lines about failing accepts. Idempotent."""
    hypercorn_trio_run.TCPServer = PromptClosingTCPServer  # type: ignore[attr-defined]
    logger = logging.getLogger(ACCEPT_LOGGER)
    if not any(isinstance(f, AcceptErrorFilter) for f in logger.filters):
        logger.addFilter(AcceptErrorFilter())


__all__ = ["ACCEPT_LOGGER", "AcceptErrorFilter", "PromptClosingTCPServer", "install"]
