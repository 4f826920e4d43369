"""How often one user's sidecars may open a session on a hub process.

Every accepted handshake costs the process that serves it, for every user of that process:
presence ``SET``, the daemon record and takeover script, the catalogue, a supersede of the
session before it, and the hub CPU around them. Found by fault injection
(``bench/handshake_storm.py``): one client with a valid token doing the whole handshake 300
times a second -- a sidecar in a crash loop under a supervisor that restarts it at once, or
two desktops of one user taking the session from each other without backing off -- took
another user's echo p50 from 4.7 to 81 ms on one hub worker.

A process now admits a user's handshakes within a :class:`HandshakeBudget` (a token bucket
per user id: :data:`BURST` at once, then :data:`PER_S` a second) and refuses the rest
before the upgrade with HTTP 429 ``too_many_requests`` and ``Retry-After`` (the seconds
until the bucket holds one again): nothing is written to Redis, and the sidecar waits at
least that long (it honours ``Retry-After`` on any refused upgrade). The bucket is charged
only once the token verified, so forged tokens naming a user cannot keep that user's
desktop out; a refused attempt costs nothing (a client that honours ``Retry-After`` is
admitted at its next try). Each process keeps its own buckets: behind N processes a user
gets N times the rate, still a few handshakes a second, and no Redis write per attempt
(a shared bucket in Redis would be the very cost it bounds).

Where the numbers come from: the real sidecar's honest worst case is its reconnects while
the hub answers 1013 (Redis down): full jitter over a window of at most 2 s, so one a
second on average, with short runs faster, for as long as the outage lasts -- a random
walk around the bucket's rate, so those are given back (below); after a restart close it
reconnects at once and retries a draining hub three times (those 503s come before the
token check and are not charged). A burst of 10 and 1 a second leave the rest alone.

A handshake the hub refuses for its own outage (1013: Redis unreachable or refusing
writes) is given back (:meth:`HandshakeBudget.refund`): a sidecar retrying through a
Redis outage of minutes is never paced.

Refused handshakes of a user are logged once, then at most once per :data:`LOG_EVERY_S`
counting the rest (the count of a storm's last seconds is dropped with its bucket, once
full again). Also here: the process's budgets of log lines about refused tokens, one per
kind of refusal (:func:`token_log`), which wrote one WARNING per attempt (2,551 lines in
8.5 s from one client at 300 a second).
Pure (no I/O): the caller passes its monotonic time (``trio.current_time()``).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import attrs

from ._peer_noise import LogBudget

#: Handshakes of one user a process admits at once (also the most a quiet user saves up).
BURST = 10
#: Handshakes of one user a second a process admits past the burst.
PER_S = 1.0
#: At most one WARNING about one user's refused handshakes per this many seconds.
LOG_EVERY_S = 10.0
#: The longest ``Retry-After`` the hub sends, seconds (the sidecar honours up to 60).
MAX_RETRY_AFTER_S = 60

#: Lines about refused sidecar tokens per process: 10 at once, then one every 10 s
#: saying how many were left out (``_sidecar_asgi``).
TOKEN_LOG_BURST = 10
TOKEN_LOG_EVERY_S = 10.0


@attrs.define
class _Bucket:
    tokens: float
    at_s: float
    refused: int = 0
    next_log_s: float = float("-inf")


@attrs.frozen
class HandshakeStatistics:
    """``users``: users with a bucket not yet full again (the memory held)."""

    users: int


@attrs.define(eq=False)
class HandshakeBudget:
    """Per-user token buckets of handshakes (module docstring). Not thread-safe.

    Args:
        burst: handshakes admitted at once per user (positive).
        per_s: handshakes a second per user past the burst (positive).
        log_every_s: at most one refusal line per user per this many seconds.
    """

    burst: float = BURST
    per_s: float = PER_S
    log_every_s: float = LOG_EVERY_S
    _buckets: OrderedDict[str, _Bucket] = attrs.field(init=False, factory=OrderedDict)

    def admit(self, user_id: str, now_s: float) -> float:
        """Charge one handshake of ``user_id`` at ``now_s`` (monotonic seconds), if it fits.

        Returns:
            0.0: admitted (charged). Else the seconds until one more would be admitted;
            nothing is charged.
        """
        self._forget_full(now_s)
        bucket = self._buckets.get(user_id)
        if bucket is None:
            bucket = self._buckets[user_id] = _Bucket(tokens=self.burst, at_s=now_s)
        else:
            elapsed_s = max(0.0, now_s - bucket.at_s)
            bucket.tokens = min(self.burst, bucket.tokens + elapsed_s * self.per_s)
            bucket.at_s = now_s
            self._buckets.move_to_end(user_id)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        bucket.refused += 1
        return round((1.0 - bucket.tokens) / self.per_s, 9)

    def refund(self, user_id: str) -> None:
        """Give back the handshake :meth:`admit` charged to ``user_id`` last: the hub
        refused it for its own outage (Redis unreachable or refusing writes: 1013).
        The sidecar retries those about once a second for as long as the outage lasts
        (full jitter over at most 2 s), a random walk around this bucket's rate: charged,
        most sidecars met a 429 within a few minutes, and a 429 sends a sidecar to its
        full backoff window (up to 30 s after Redis is back). Such an attempt writes
        nothing, the cost the budget bounds. A bucket already forgotten stays so."""
        bucket = self._buckets.get(user_id)
        if bucket is not None:
            bucket.tokens = min(self.burst, bucket.tokens + 1.0)

    def retry_after_s(self, wait_s: float) -> int:
        """``Retry-After`` for a refusal that said ``wait_s``: whole seconds, 1 to 60."""
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait_s)))

    def refusal_line(self, user_id: str, now_s: float) -> str | None:
        """The WARNING to log about ``user_id``'s refused handshakes at ``now_s``, or None
        when a line went out less than ``log_every_s`` ago (the refusals are counted
        into the next line)."""
        bucket = self._buckets.get(user_id)
        if bucket is None or bucket.refused == 0 or now_s < bucket.next_log_s:
            return None
        more = bucket.refused - 1
        bucket.refused = 0
        bucket.next_log_s = now_s + self.log_every_s
        line = (
            f"sidecar handshake of {user_id} refused: too many handshakes "
            f"(over {self.burst:g} at once or {self.per_s:g} a second); answered 429"
        )
        if more:
            line += f" ({more} more refused since the last line)"
        return line

    def statistics(self) -> HandshakeStatistics:
        """How many users' buckets are held."""
        return HandshakeStatistics(users=len(self._buckets))

    def _forget_full(self, now_s: float) -> None:
        """Drop the least recently used buckets that are full again (they would start
        over the same), keeping memory to the users seen in the last ``burst / per_s``."""
        full_after_s = self.burst / self.per_s
        while self._buckets:
            user_id, bucket = next(iter(self._buckets.items()))
            if now_s - bucket.at_s < full_after_s:
                return
            del self._buckets[user_id]


@attrs.define(eq=False)
class TokenLog:
    """The process's budgets of log lines about refused sidecar tokens, one per kind of
    refusal (:data:`TOKEN_LOG_BURST` at once, then one per :data:`TOKEN_LOG_EVERY_S`
    counting the rest). One budget for all let a client sending forged tokens spend it,
    and the first line about another problem (a real user's expired token) was left out
    for up to 10 s and then only counted. The kinds are the verifier's exception
    classes: a few. Not thread-safe; times are monotonic seconds."""

    _budgets: dict[str, LogBudget] = attrs.field(init=False, factory=dict)

    def admit(self, kind: str, now_s: float) -> int | None:
        """As :meth:`LogBudget.admit`, on ``kind``'s budget."""
        budget = self._budgets.get(kind)
        if budget is None:
            budget = self._budgets[kind] = LogBudget(
                burst=TOKEN_LOG_BURST, interval_s=TOKEN_LOG_EVERY_S
            )
        return budget.admit(now_s)


def token_log() -> TokenLog:
    """Fresh budgets of log lines about refused sidecar tokens (one per process)."""
    return TokenLog()


__all__ = [
    "BURST",
    "LOG_EVERY_S",
    "PER_S",
    "HandshakeBudget",
    "HandshakeStatistics",
    "TokenLog",
    "token_log",
]
