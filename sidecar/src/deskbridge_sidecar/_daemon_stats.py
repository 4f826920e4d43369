"""The daemon's counters, as one snapshot (``Daemon.statistics()``)."""

from __future__ import annotations

import attrs

from ._session import SessionEnd


@attrs.frozen
class DaemonStatistics:
    """A snapshot of the daemon's counters.

    Attributes:
        connect_attempts: connections tried (successful or not).
        sessions_started: sessions the hub welcomed.
        reconnects: times the daemon went round again after a session or attempt ended.
        executions: per tool name, times the tool actually started (``status`` included).
        dedupe_hits: deliveries answered from the cache or by awaiting a running original.
        dedupe_entries: outcomes held in the dedupe cache now.
        running: the tool running now, or None.
        session_id: the current session's id, or None between sessions.
        last_end: how the previous session or attempt ended, or None.
    """

    connect_attempts: int
    sessions_started: int
    reconnects: int
    executions: dict[str, int]
    dedupe_hits: int
    dedupe_entries: int
    running: str | None
    session_id: str | None
    last_end: SessionEnd | None
