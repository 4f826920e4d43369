"""Read-only views of a user's queue for metrics and the admin API (no I/O here).

Substrates return these from ``queue_info(user_id, count=N)``: the stream length (XLEN),
the size of the consumer group's pending entries list (XPENDING summary) and up to ``N``
pending entries with their consumer, idle time and delivery count (XPENDING extended).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class PendingEntry:
    """One record of the pending entries list.

    Attributes:
        entry_id: the stream entry ID.
        consumer: the consumer (hub process) it was delivered to.
        idle_ms: milliseconds since it was last delivered.
        deliveries: how many times it was delivered.
    """

    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int


@attrs.frozen
class QueueInfo:
    """A user's job stream at one moment.

    Attributes:
        length: entries in the stream (XLEN; acknowledged entries stay until trimmed).
        pending_count: entries delivered and not acknowledged (every consumer).
        pending: the oldest pending entries, at most the ``count`` asked for.
    """

    length: int
    pending_count: int
    pending: tuple[PendingEntry, ...] = ()
