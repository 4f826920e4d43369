"""``GET /v1/jobs/{job_id}/events``: a job's progress as server-sent events, ending with
its outcome.

Events (``text/event-stream``)::

    event: progress
    data: {"progress": 0, "total": null, "message": "awaiting approval: ...",
           "stage": "awaiting_approval"}                     (one line on the wire)

    event: progress
    data: {"progress": 3, "total": 10, "message": "page 3"}

(``stage``, present when the desktop reports one: ``awaiting_approval`` while the tool
waits for the person's approval, ``running`` once it may run; docs/outcomes.md.)

    event: outcome
    data: {"status": "completed", "result": ...}      (the result payload, as POST /jobs)

Any replica serves it: it reads the job's progress stream (see ``_progress``). A job that
was answered before the stream opened ends at once with its answer (the result payload,
while it is kept), else with ``{"stage": "finished" | "cancelled" | ..., "status": null}``.
A job id nobody knows (never dispatched, or its state expired) is 404.

Each open stream holds a Redis read (``XREAD BLOCK``) that polls on the shared
connections once the process's dedicated blocking connections are taken
(``_redis_session``): 1,000 streams opened by one caller on one job took another user's
call latency on the same process from p95 21 ms to 1.9 s (worst 21 s). So a process
keeps at most :data:`MAX_EVENT_STREAMS_PER_USER` open streams per user (the job's
owner); the next is **429** ``too_many_requests`` naming the bound, with ``Retry-After``.
32 is ``DESKBRIDGE_MAX_INFLIGHT``'s default: a desktop runs one tool at a time, so more
watched jobs than that are watched more than once.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import trio
from deskbridge_common import _codes
from quart import Response
from quart_trio import QuartTrio

from ._errors import BadRequest, SubstrateUnavailable
from ._jobstate import MalformedState
from ._progress import watch
from ._validate import validate_key

#: Most event streams one user's jobs may have open at once in one hub process.
MAX_EVENT_STREAMS_PER_USER = 32
#: ``Retry-After`` of the 429, seconds.
RETRY_AFTER_S = 5
#: Seconds of silence after which a stream sends an SSE comment line (``: keep-alive``),
#: which clients skip: a job running without progress reports otherwise sent nothing
#: until its outcome, and a proxy's read timeout (nginx: 60 s) cut the stream. 15 s as
#: the MCP SDK's SSE ping.
KEEPALIVE_S = 15.0


class _Streams:
    """The open event streams of this process, per user. A stream counts from when its
    route answers until its body ends; one whose body never started (the client went
    before it) stops counting when it is dropped (weak references)."""

    def __init__(self) -> None:
        self._by_user: dict[str, weakref.WeakSet[_Stream]] = {}

    def open(self, user_id: str) -> _Stream | None:
        """A new stream of ``user_id``'s, or None when it has ``MAX_EVENT_STREAMS_PER_USER``."""
        live = self._by_user.get(user_id)
        if live is None:
            if len(self._by_user) >= 1024:  # users whose streams all ended: forget them
                for user in [u for u, s in self._by_user.items() if not s]:
                    del self._by_user[user]
            live = self._by_user[user_id] = weakref.WeakSet()
        if sum(1 for s in live if not s.ended) >= MAX_EVENT_STREAMS_PER_USER:
            return None
        stream = _Stream()
        live.add(stream)
        return stream


class _Stream:
    ended = False


def _event(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def add_event_routes(app: QuartTrio, holder: dict[str, Any]) -> None:
    """Register ``GET /v1/jobs/<job_id>/events`` on ``app`` (behind the API key, as all
    of ``/v1/``), at most ``MAX_EVENT_STREAMS_PER_USER`` open per user (429 past it)."""
    streams = _Streams()

    @app.get("/v1/jobs/<job_id>/events")
    async def job_events(job_id: str):  # type: ignore[no-untyped-def]
        try:
            validate_key(job_id, "job_id")
        except ValueError as exc:
            raise BadRequest(str(exc), field="job_id") from None
        bridge = holder["bridge"]
        substrate = bridge.substrate
        try:
            state = await bridge.job_state(job_id)
        except MalformedState:
            state = None
        if state is None:
            body = {"error": {"code": _codes.NOT_FOUND, "message": f"no job {job_id!r}"}}
            return Response(json.dumps(body), status=404, content_type="application/json")
        slot = streams.open(state.user_id)
        if slot is None:
            message = (
                f"user {state.user_id!r} already has {MAX_EVENT_STREAMS_PER_USER} event "
                "streams open on this hub process (MAX_EVENT_STREAMS_PER_USER); close one"
            )
            error = {"code": _codes.TOO_MANY_REQUESTS, "message": message}
            refused = {"error": {**error, "retry_after_s": RETRY_AFTER_S}}
            return Response(
                json.dumps(refused),
                status=429,
                content_type="application/json",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

        async def is_over() -> bool:
            stage = await _stage(bridge, job_id)
            return stage is None or stage.terminal

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in events():
                    yield chunk
            finally:
                slot.ended = True

        async def events() -> AsyncIterator[bytes]:
            ttl_s = bridge.timings.result_ttl_s
            said_at = trio.current_time()
            try:
                # closed when the outcome returns early (else a ResourceWarning at GC)
                async with aclosing(watch(substrate, job_id, ttl_s=ttl_s, is_over=is_over)) as seen:
                    async for kind, data in seen:
                        if kind == "idle":
                            if trio.current_time() - said_at < KEEPALIVE_S:
                                continue
                            yield b": keep-alive\n\n"
                        else:
                            yield _event(kind, data)
                        said_at = trio.current_time()
                        if kind == "outcome":
                            return
                # answered before the stream opened (maybe a moment before, on another
                # replica): its answer, as every other reader gets it, when still kept
                try:
                    answer = await bridge.answer_of(job_id)
                except MalformedState:
                    answer = None
                if answer is not None:
                    yield _event("outcome", json.loads(answer))
                    return
                stage = await _stage(bridge, job_id)
                yield _event("outcome", {"status": None, "stage": stage and stage.value})
            except SubstrateUnavailable as exc:
                yield _event("error", {"code": "unavailable", "message": str(exc)})

        return Response(
            stream(),
            content_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


async def _stage(bridge: Any, job_id: str) -> Any:
    try:
        state = await bridge.job_state(job_id)
    except MalformedState:
        return None
    return None if state is None else state.stage


__all__ = ["add_event_routes"]
