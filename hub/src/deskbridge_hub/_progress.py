"""Progress of a running job, from the sidecar's ``progress`` frames to every caller that
watches the job, on any replica.

Path: the hub session holding the desktop's socket hands each frame to the process's
:class:`ProgressRelay` (``offer``: synchronous, never blocks the session's reader); the
relay publishes the latest report of each job to the job's progress stream
(``bridge:progress:{job_id}``, XADD MAXLEN ~ 64, expiring with the result TTL), coalescing
reports that arrive faster than Redis takes them. Watchers read that stream (XREAD BLOCK):
:meth:`Bridge.dispatch` with ``on_progress``, ``GET /v1/jobs/{job_id}/events`` (server-sent
events) and MCP progress notifications. The stream ends with the job's outcome, appended
by the holder's finishing step (``Substrate.finish``) in the same round trip as the
result (only when the stream exists).

Progress is best effort (a report may be coalesced or, while Redis is away, dropped); the
outcome never depends on it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
import attrs
from deskbridge_common import DESK_STAGES, Progress, replace_lone_surrogates

from ._substrate import Substrate

log = logging.getLogger("deskbridge.hub.progress")

#: Most jobs with a report waiting to be published; beyond it new jobs' reports are
#: dropped (a Redis outage must not grow memory without bound).
MAX_PENDING_JOBS = 10_000
#: Progress entries kept per job (XADD MAXLEN ~).
PROGRESS_MAXLEN = 64
#: How long a watcher blocks on the stream before checking the job's state, ms.
WATCH_BLOCK_MS = 1000
#: The entry a watcher adds to open the stream, so the outcome is appended to it.
WATCHING = '{"watching":true}'


@attrs.frozen
class ProgressReport:
    """One progress report of a job: ``progress`` so far, ``total`` when known, and the
    desktop's ``stage`` when the sidecar said (``awaiting_approval`` while the tool waits
    for the person's approval, ``running`` once it may run; None otherwise)."""

    progress: float
    total: float | None = None
    message: str | None = None
    stage: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The stream entry's (and the ``progress`` event's) JSON object; ``stage`` only
        when set."""
        body: dict[str, Any] = {
            "progress": self.progress, "total": self.total, "message": self.message
        }  # fmt: skip
        if self.stage is not None:
            body["stage"] = self.stage
        return body


@attrs.define(eq=False)
class ProgressRelay:
    """Publishes the sidecar sessions' progress frames of this process.

    Args:
        substrate: where progress streams live.
        ttl_s: how long a job's progress stream is kept (the result TTL).
    """

    substrate: Substrate
    ttl_s: float
    _pending: dict[str, Progress] = attrs.field(factory=dict)
    _wake: anyio.Event = attrs.field(factory=anyio.Event)
    dropped: int = 0

    def offer(self, job_id: str, frame: Progress) -> None:
        """Queue ``frame`` for ``job_id`` (replacing an unpublished one); never blocks."""
        if job_id not in self._pending and len(self._pending) >= MAX_PENDING_JOBS:
            self.dropped += 1
            return
        self._pending[job_id] = frame
        self._wake.set()

    async def run(self) -> None:
        """Publish queued reports until cancelled (one task per process)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            batch, self._pending = self._pending, {}
            for job_id, frame in batch.items():
                payload = json.dumps(
                    ProgressReport(
                        frame.progress,
                        frame.total,
                        # valid text only (an older sidecar's lone surrogate: U+FFFD)
                        None if frame.message is None else replace_lone_surrogates(frame.message),
                        frame.stage,
                    ).to_json()
                )
                try:
                    await self.substrate.publish_progress(
                        job_id, payload, ttl_s=self.ttl_s, maxlen=PROGRESS_MAXLEN
                    )
                except Exception as exc:  # noqa: BLE001 - best effort; the outcome is not
                    log.debug("progress of %s not published: %r", job_id, exc)


async def watch(
    substrate: Substrate, job_id: str, *, ttl_s: float, is_over: Callable[[], Awaitable[bool]]
) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
    """The events of one job: ``("progress", report)`` ..., then ``("outcome", payload)``;
    ``("idle", {})`` after each block (:data:`WATCH_BLOCK_MS`) that brought nothing.

    Opens the job's progress stream first (an entry :data:`WATCHING`), so the outcome is
    appended to it when the result is published.

    Args:
        substrate: where the stream lives.
        job_id: the job.
        ttl_s: lifetime of the stream if this call creates it.
        is_over: checked whenever a block ends with nothing: True when the job is over
            (its state is terminal) although no outcome entry came (it was answered
            before this watcher opened the stream); the iteration then ends.

    Raises:
        SubstrateUnavailable: Redis unreachable.
    """
    await substrate.publish_progress(job_id, WATCHING, ttl_s=ttl_s, maxlen=PROGRESS_MAXLEN)
    after = "0"
    while True:
        entries = await substrate.read_progress(job_id, after, block_ms=WATCH_BLOCK_MS)
        if not entries:
            if await is_over():
                return
            yield "idle", {}
        for entry_id, payload in entries:
            after = entry_id
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if "outcome" in event:
                yield "outcome", event["outcome"]
                return
            if "progress" in event and _finite(event["progress"]):
                yield "progress", event


def parse_progress(payload: str) -> ProgressReport | None:
    """A progress-stream entry as a report; None for other entries (the watcher mark,
    the outcome) and anything malformed."""
    try:
        event = json.loads(payload)
        if not isinstance(event, dict) or not _finite(event.get("progress")):
            return None
        total = event.get("total")
        message = event.get("message")
        stage = event.get("stage")
        return ProgressReport(
            float(event["progress"]),
            float(total) if total is not None and _finite(total) else None,
            message if isinstance(message, str) else None,
            stage if stage in DESK_STAGES else None,
        )
    except ValueError:
        return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


__all__ = ["ProgressRelay", "ProgressReport", "parse_progress", "watch"]
