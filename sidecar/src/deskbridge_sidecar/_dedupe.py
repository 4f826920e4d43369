"""The dedupe cache: outcomes by idempotency key, bounded in size and age.

Keyed on ``idempotency_key`` (set once by the requester, carried unchanged by every
redelivery), never on the delivery ``id`` (minted fresh by the hub per delivery). The
daemon owns one cache for its whole life, so it survives reconnects: a job reclaimed
after a dropped socket is redelivered on a new socket, often through another hub
replica. Defaults mirror the hub's result TTL (seed report): 256 outcomes for 300 s.

Eviction is LRU by insertion: entries leave in the order they were recorded, when
older than ``ttl_s`` or when more than ``size`` are held. Reading does not refresh an
entry. Time is the trio clock (``trio.current_time``) by default, so ``MockClock``
tests can expire entries without sleeping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import attrs
import trio

from ._outcome import Outcome


@attrs.define(eq=False)
class DedupeCache:
    """Recorded outcomes by idempotency key.

    Args:
        size: most outcomes held (oldest recorded leaves first); positive.
        ttl_s: seconds an outcome is kept after it was recorded; positive.
        clock: monotonic time source in seconds (default ``trio.current_time``, which
            needs a running trio loop).

    Raises:
        ValueError: ``size`` or ``ttl_s`` not positive.
    """

    size: int = 256
    ttl_s: float = 300.0
    clock: Callable[[], float] = trio.current_time
    _entries: OrderedDict[str, tuple[float, Outcome]] = attrs.field(
        factory=OrderedDict, init=False, repr=False
    )
    evictions: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.size <= 0 or self.ttl_s <= 0:
            raise ValueError("DedupeCache size and ttl_s must be positive")

    def get(self, key: str) -> Outcome | None:
        """The outcome recorded for ``key`` if it is still held, else None."""
        self._expire()
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def put(self, key: str, outcome: Outcome) -> None:
        """Record ``outcome`` for ``key`` (replacing and re-inserting any older one)."""
        self._expire()
        self._entries.pop(key, None)
        self._entries[key] = (self.clock() + self.ttl_s, outcome)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
            self.evictions += 1

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def _expire(self) -> None:
        # Same TTL for all and insertion order, so expiry times are in order too.
        now = self.clock()
        while self._entries:
            expires_at, _ = next(iter(self._entries.values()))
            if expires_at > now:
                break
            self._entries.popitem(last=False)


__all__ = ["DedupeCache"]
