"""``GET /v1/jobs/{job_id}/events`` opened as the job is answered (on another replica, a
moment before): the stream ends with the job's outcome, the one every other reader
(the caller, a retry by the key) gets, not ``{"status": null}``."""

from __future__ import annotations

import json

import trio
from deskbridge_hub._jobstate import JobState, Stage

from tests.hub.test_http_api import AUTH, running_hub


def _events(body: str) -> list[tuple[str, dict]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_events_of_a_job_answered_before_the_stream_opened_end_with_its_outcome(
    autojump_clock,
):
    async with running_hub() as (client, sub):
        user, job = "alice", "f00d~alice"
        payload = json.dumps({"status": "completed", "result": {"x": 1}})
        state = JobState(Stage.FINISHED, user, at=1.0)
        with trio.fail_after(5):
            await sub.inner.finish(user, job, payload, state, ttl_s=300)
            r = await client.get(f"/v1/jobs/{job}/events", headers=AUTH)
            body = (await r.get_data()).decode()
        assert r.status_code == 200
        assert _events(body) == [("outcome", {"status": "completed", "result": {"x": 1}})]


async def test_events_of_a_job_whose_answer_is_gone_still_end_with_its_stage(autojump_clock):
    async with running_hub() as (client, sub):
        user, job = "alice", "beef~alice"
        with trio.fail_after(5):
            await sub.inner.set_job_state(user, job, JobState(Stage.LOST, user), ttl_s=300)
            r = await client.get(f"/v1/jobs/{job}/events", headers=AUTH)
            body = (await r.get_data()).decode()
        assert _events(body) == [("outcome", {"status": None, "stage": "lost"})]
