"""Named timings of the hub process that are not user knobs (``Timings`` holds those),
each with its reason, and the one retry helper for writes that must not be dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from ._errors import SubstrateUnavailable
from ._outage import outage_log
from ._outage import succeeded as outage_over

log = logging.getLogger("deskbridge.hub.retry")

T = TypeVar("T")

#: First wait before retrying a write that must happen (publish, XACK, mark delivered),
#: seconds: short, because a one-off connection reset is the common case.
DURABLE_RETRY_FIRST_S = 0.1
#: Longest wait between such retries, seconds: during an outage the job's caller is
#: waiting, so the write is retried at least this often (and logged each time). 1 s, so
#: a result held through a Redis restart is published within a second of its return
#: (was 5 s: the soak's Redis-restart minute waited up to 2.3 s more per held result).
DURABLE_RETRY_MAX_S = 1.0

#: Bound on best-effort cleanup after a session ends (clear presence, record
#: "interrupted"), seconds: shielded work that must not hold a closing socket for long;
#: both writes are single round trips that take a millisecond when Redis is healthy.
CLEANUP_TIMEOUT_S = 2.0

#: What a call may take beyond its ``timeout_s`` for the looks it takes once its time is
#: up (the result list once more, the job's stage, the desktop's asleep record), seconds.
#: Each is one round trip of a millisecond; a Redis that does not answer them within this
#: (stalled: ``DEBUG SLEEP``, a fork, a full client output buffer) is not waited for: the
#: caller is answered with what is known (stage ``unknown``). A caller's ``timeout_s`` is
#: the time it is answered by, not the Redis command timeout (5 s) on top of it.
ANSWER_GRACE_S = 0.25

#: Longest ``/healthz`` waits for Redis' PING, seconds, before it answers 503: a Redis
#: that holds commands (a black-holed connection, ``DEBUG SLEEP``, ``CLIENT PAUSE``, a
#: long script) otherwise held readiness for the whole command timeout (5 s), past a
#: load balancer's probe timeout, so an unready hub read as a hung one. A PING answers
#: within milliseconds when Redis is healthy.
HEALTHZ_PING_TIMEOUT_S = 1.0

#: Back-off after a substrate error in a read loop, seconds (bounded; no tight loop
#: while Redis is down, and back within 1 s once it returns: a job enqueued as Redis
#: returns waits for the read loops' next step; was up to 2 s).
READ_ERROR_BACKOFF_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)

#: A hub process's liveness key (``bridge:proc:{<holder>}``) expires this long after its
#: last refresh, seconds: presence held by a process that died (kill -9, OOM, a lost
#: node) stops counting as online within this time, instead of the 30 s presence TTL.
PROCESS_LIVENESS_TTL_S = 3.0
#: The process refreshes its liveness key this often, seconds (a third of the TTL, as
#: presence does, so one late refresh never lets it lapse).
PROCESS_LIVENESS_REFRESH_S = 1.0
#: A refresh that failed (Redis down) is tried again this soon, seconds: an outage
#: longer than the TTL lets the key lapse, and until it is rewritten every presence of
#: the process counts offline (callers are told ``offline``); one SET a quarter second
#: per process while Redis is down (was the 1 s refresh step).
PROCESS_LIVENESS_RETRY_S = 0.25
#: A caller trusts a holder's liveness it checked this recently, seconds (saves a round
#: trip per call; adds at most this much to the window in which a dead holder counts).
HOLDER_ALIVE_CACHE_S = 1.0
#: A holder whose liveness key is gone is looked at once more this much later, seconds,
#: before its desktops read offline: a live process whose refreshes Redis refused (out of
#: memory, a Cluster node down) rewrites the key within ``PROCESS_LIVENESS_RETRY_S`` of
#: Redis taking writes again (within a retry pause, at most 1 s, under Cluster); without
#: the second look the calls of that instant were told ``offline`` (a fault-injection
#: helper: 6-7 per outage's end). A dead holder's desktops read offline this much later.
LIVENESS_RECHECK_S = 1.0
#: A holder found dead is not looked at again for this long, seconds (its users' calls
#: do not each wait ``LIVENESS_RECHECK_S``).
HOLDER_DEAD_CACHE_S = 1.0

#: Least time, seconds, a hub process must have gone without refreshing its liveness key
#: before it ends its sessions (1013, so their sidecars reconnect elsewhere); the bound is
#: the presence TTL, and never less than this (``ProcessReader.cut_off_s``). Why: a
#: process partitioned from Redis (black-holed, no RST) kept its sockets for as long as
#: the partition lasted while every other replica told its desktops' callers
#: ``offline``; but a whole-Redis outage looks the same from inside, and there every
#: hub dropping every socket would only cost a reconnect storm, so short outages (a
#: restart, a few seconds) must stay below the bound.
CUT_OFF_MIN_S = 10.0

#: Retry a failed heartbeat this soon (seconds, or the heartbeat if shorter): after Redis
#: comes back (possibly empty) the desktop must read online again within a second.
HEARTBEAT_RETRY_S = 1.0


async def retrying(fn: Callable[[], Awaitable[T]], *, what: str) -> T:
    """Call ``fn`` until it does not raise :class:`SubstrateUnavailable`.

    Waits :data:`DURABLE_RETRY_FIRST_S`, doubling up to :data:`DURABLE_RETRY_MAX_S`,
    between attempts, with a DEBUG line naming ``what`` each time; the outage itself is
    told once, with a summary a minute, by :mod:`._outage`.

    Returns:
        What ``fn`` returned.

    Raises:
        Whatever ``fn`` raises other than ``SubstrateUnavailable``.

    Cancellation: stops retrying; the write may or may not have happened.
    """
    delay = DURABLE_RETRY_FIRST_S
    while True:
        try:
            result = await fn()
        except SubstrateUnavailable as exc:
            outage_log().failed(what, exc)
            log.debug("%s failed: %s; retrying in %.1f s", what, exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, DURABLE_RETRY_MAX_S)
        else:
            outage_over()
            return result
