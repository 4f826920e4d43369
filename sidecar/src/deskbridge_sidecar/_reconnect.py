"""The sidecar's reconnect policy: how the daemon (``_daemon``) decides, after a session
or a connection attempt ended, whether to stop and how long to wait before the next.

Reconnect policy, by how the last session ended:

* the hub closed a welcomed session with 1012 (restarting) or 1001 (going away):
  reconnect at once, no delay. The next few attempts are likely to meet the restarting
  process itself (HTTP 503 while it drains, a refused or reset connection as it exits),
  so up to ``QUICK_RETRIES`` (3) of those failures are retried after a small jitter
  (0-``QUICK_RETRY_JITTER_S``, 100 ms) before falling back to full-jitter backoff: the
  reconnect lands on a live replica in well under a second;
* HTTP 401/403 on the upgrade: the token is refused; stop (:class:`TokenRefused`);
  retrying cannot help;
* the server side is up but cannot serve yet — HTTP 502/503/504 on the upgrade (a load
  balancer whose backends all fail their health check, which needs Redis; a hub that
  cannot reach Redis) or a close with 1013 before the welcome (the hub's handshake found
  Redis unavailable): full-jitter backoff as below, but the window stops growing at
  ``UNAVAILABLE_MAX_S`` (2 s). Such a pause ends by itself within seconds (a Redis or
  pod restart), and a desktop that dropped during it must not stay away for a 30 s
  window after it (issue 16's soak: a pod killed as Redis restarted left its desktops
  offline 7-14 s after Redis was back, the window having doubled to 16 s in 2.5 s of
  refusals). Still jittered, so N desktops arrive at about N / 1 s; a ``Retry-After``
  (a hub asking for a longer pause) is honoured as always;
* anything else — refused or failed connects, other HTTP statuses, 1006, ping
  timeout, clock gap, a malformed frame — full-jitter exponential backoff: first retry
  within ``backoff_initial_s`` (0.5 s), the window doubling up to ``backoff_max_s``
  (30 s) while attempts keep failing.
  A 429 (a hub process pacing this user's handshakes: a crash loop, or another sidecar
  of the user reconnecting) is one of these: the window keeps growing, and the delay is
  at least its ``Retry-After``.

When the backoff starts again. A session the hub *welcomed* and that stayed open at
least ``HEALTHY_SESSION_S`` (2 s) was healthy: the backoff resets, so the first
reconnect after it comes within ``backoff_initial_s`` (uniform over [0, 0.5 s): back
within 1 s at p99 with the connect included). Why this rule and not "answered pings" or
"scale by how long it lasted": the welcome already proves what a ping would (the token
is good, the hub app and its Redis work: the hub writes presence before it welcomes),
and with the default 10 s ping interval a session cut after 8 s has never seen a ping
although it served jobs fine (issue 16's soak: median session 12-13 s under faults,
which the old "lasted at least ``backoff_max_s``" rule never counted as healthy, so
reconnects waited up to 30 s). Scaling by duration would punish exactly those sessions.
The 2 s floor keeps a hub that welcomes and then at once closes (a loop) from being
hammered: such sessions count as failed attempts and the window keeps doubling.
A drop of many healthy sessions at once (a pod died) spreads their reconnects
uniformly over ``backoff_initial_s``: N desktops arrive at about N / 0.5 s per second
on the survivors, none in lockstep (``tests/sidecar/test_reconnect.py`` checks the
spread of 200 daemons on MockClock; ``bench/reconnect_gaps.py`` measures the gap).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
from deskbridge_common import (
    CLOSE_ABNORMAL,
    CLOSE_GOING_AWAY,
    CLOSE_SERVICE_RESTART,
    CLOSE_SUPERSEDED,
    CLOSE_TRY_AGAIN_LATER,
)

from ._backoff import Backoff
from ._errors import HandshakeRejected, Superseded
from ._session import CLOSED, SessionEnd

log = logging.getLogger("deskbridge.sidecar")

#: SessionEnd.cause when the connection could not be opened.
CONNECT_FAILED = "connect_failed"
#: SessionEnd.cause when the hub refused the upgrade with an HTTP status other than 401/403.
REJECTED = "rejected"

#: Close codes after which the daemon reconnects without delay.
IMMEDIATE_RECONNECT_CODES = frozenset({CLOSE_SERVICE_RESTART, CLOSE_GOING_AWAY})
#: Hub error codes of a 401/403 refusal that may pass by themselves: never final.
TRANSIENT_REFUSAL_CODES = frozenset({"token_not_yet_valid", "draining", "not_configured"})
#: Longest ``Retry-After`` honoured, seconds (a hub cannot park a desktop for hours).
MAX_RETRY_AFTER_S = 60.0

#: After a restart close (1012/1001), this many failed attempts in a row are retried
#: quickly: a draining hub refuses with 503, an exiting one refuses or resets.
QUICK_RETRIES = 3
#: Upper bound of the (uniform) delay before a quick retry, seconds.
QUICK_RETRY_JITTER_S = 0.1
#: HTTP statuses of a refused upgrade that are retried quickly after a restart close
#: (a draining hub says 503; a load balancer without a live backend 502/503/504).
QUICK_RETRY_STATUSES = frozenset({502, 503, 504})
#: Close codes of a socket that closed before the welcome, retried quickly after a
#: restart close (the restarting process accepted it and then went away).
_QUICK_RETRY_CLOSE_CODES = frozenset({CLOSE_ABNORMAL, CLOSE_SERVICE_RESTART, CLOSE_GOING_AWAY})
#: Longest backoff window (seconds) after a refusal by a server side that is up but
#: cannot serve yet (``_unavailable``; module docstring): a Redis restart's pause.
UNAVAILABLE_MAX_S = 2.0
#: HTTP statuses of such a refusal: a load balancer without a live backend, a hub
#: without Redis.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
#: A welcomed session open at least this long (seconds) was healthy: the reconnect
#: backoff starts again from ``backoff_initial_s`` (see the module docstring for why).
HEALTHY_SESSION_S = 2.0


def _final_refusal(exc: HandshakeRejected) -> bool:
    """True if a refused upgrade means the token will never be accepted: 401/403, unless
    the hub's code or reason says it may pass (a token not yet valid on a skewed clock,
    a hub without its secret yet, a draining hub)."""
    if exc.status_code not in (401, 403):
        return False
    if exc.code in TRANSIENT_REFUSAL_CODES:
        return False
    return "not yet valid" not in exc.message.lower()


def _restart_in_progress(end: SessionEnd, rejected_status: int | None) -> bool:
    """True if a failed attempt looks like the restarting hub process itself: the
    connection was refused or broke, the upgrade was refused with 502/503/504, or the
    socket closed (1006/1012/1001) before any welcome."""
    if end.cause == CONNECT_FAILED:
        return True
    if end.cause == REJECTED:
        return rejected_status in QUICK_RETRY_STATUSES
    return end.cause == CLOSED and not end.welcomed and end.code in _QUICK_RETRY_CLOSE_CODES


def _unavailable(end: SessionEnd, rejected_status: int | None) -> bool:
    """True if the attempt met a server side that is up but cannot serve yet: the upgrade
    refused with 502/503/504, or the socket closed with 1013 before any welcome."""
    if end.cause == REJECTED:
        return rejected_status in UNAVAILABLE_STATUSES
    return end.cause == CLOSED and not end.welcomed and end.code == CLOSE_TRY_AGAIN_LATER


@attrs.define(eq=False)
class ReconnectPolicy:
    """What to do after a session or a connection attempt ended (module docstring):
    stop (superseded), reconnect at once, retry quickly, or back off.

    Args:
        backoff: the full-jitter backoff (reset after a healthy session).
        random: floats in [0, 1) for the quick-retry jitter; injectable for tests.
        url: the hub URL, for the log lines.
    """

    backoff: Backoff
    random: Callable[[], float]
    url: str
    #: Quick retries left after a restart close (1012/1001).
    quick_left: int = 0

    def after(
        self, end: SessionEnd, *, rejected_status: int | None, retry_after_s: float | None
    ) -> float:
        """Log how ``end`` ended and return the delay before the next attempt, seconds.

        Args:
            end: how the session or attempt ended.
            rejected_status: the HTTP status of a refused upgrade, else None.
            retry_after_s: the hub's ``Retry-After`` (seconds), else None; honoured up
                to ``MAX_RETRY_AFTER_S``.

        Raises:
            Superseded: a welcomed session was closed with 4001 (a newer sidecar of this
                user connected): the daemon must stop, not reconnect.
        """
        if end.cause == CLOSED and end.welcomed and end.code == CLOSE_SUPERSEDED:
            log.warning(
                "superseded: a newer sidecar for this user connected (hub: %s); stopping "
                "this one so the two do not take the user from each other. One sidecar "
                "per user: stop the other one first to use this one",
                end.reason or "4001",
            )
            raise Superseded(end.reason)
        if end.cause in (CONNECT_FAILED, REJECTED):
            log.warning("could not connect to %s: %s", self.url, end.reason)
        else:
            log.info(
                "disconnected from hub (%s, code %s%s) after %.1f s",
                end.cause,
                end.code,
                f": {end.reason}" if end.reason else "",
                end.duration_s,
            )
        if end.welcomed and end.duration_s >= HEALTHY_SESSION_S:
            self.backoff.reset()
        if end.cause == CLOSED and end.welcomed and end.code in IMMEDIATE_RECONNECT_CODES:
            delay = 0.0
            self.quick_left = QUICK_RETRIES
            log.info("hub closed with %d; reconnecting now", end.code)
        elif self.quick_left > 0 and _restart_in_progress(end, rejected_status):
            self.quick_left -= 1
            delay = min(max(float(self.random()), 0.0), 1.0) * QUICK_RETRY_JITTER_S
            log.info(
                "hub is restarting; retrying in %.3f s (quick retry %d of %d)",
                delay,
                QUICK_RETRIES - self.quick_left,
                QUICK_RETRIES,
            )
        else:
            self.quick_left = 0
            cap = UNAVAILABLE_MAX_S if _unavailable(end, rejected_status) else None
            delay = self.backoff.next_delay(cap)
            if retry_after_s is not None:  # the hub said when (e.g. a token not yet valid)
                delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
            log.info("reconnecting in %.2f s", delay)
        return delay
