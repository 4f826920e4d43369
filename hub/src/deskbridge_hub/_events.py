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
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from deskbridge_common import _codes
from quart import Response
from quart_trio import QuartTrio

from ._errors import BadRequest, SubstrateUnavailable
from ._jobstate import MalformedState
from ._progress import watch
from ._validate import validate_key


def _event(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def add_event_routes(app: QuartTrio, holder: dict[str, Any]) -> None:
    """Register ``GET /v1/jobs/<job_id>/events`` on ``app`` (behind the API key, as all
    of ``/v1/``)."""

    @app.get("/v1/jobs/<job_id>/events")
    async def job_events(job_id: str):  # type: ignore[no-untyped-def]
        try:
            validate_key(job_id, "job_id")
        except ValueError as exc:
            raise BadRequest(str(exc), field="job_id") from None
        bridge = holder["bridge"]
        substrate = bridge.substrate
        if await _stage(bridge, job_id) is None:
            body = {"error": {"code": _codes.NOT_FOUND, "message": f"no job {job_id!r}"}}
            return Response(json.dumps(body), status=404, content_type="application/json")

        async def is_over() -> bool:
            stage = await _stage(bridge, job_id)
            return stage is None or stage.terminal

        async def stream() -> AsyncIterator[bytes]:
            ttl_s = bridge.timings.result_ttl_s
            try:
                async for kind, data in watch(substrate, job_id, ttl_s=ttl_s, is_over=is_over):
                    yield _event(kind, data)
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
