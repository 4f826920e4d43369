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


async def test_a_silent_job_s_stream_sends_a_comment_every_15_s(autojump_clock):
    """A newcomer pass: a job running without progress reports sent nothing on its event
    stream until the outcome (curl saw 18 silent seconds), so a proxy's read timeout
    (nginx: 60 s) cut the stream of any longer job. Now an SSE comment line every
    :data:`KEEPALIVE_S` of silence, which every SSE client skips."""
    from deskbridge_hub._events import KEEPALIVE_S

    assert KEEPALIVE_S == 15.0  # as the MCP SDK's SSE ping (docs/mcp.md)
    async with running_hub() as (client, sub):
        user, job = "alice", "cafe~alice"
        payload = json.dumps({"status": "completed", "result": {"x": 1}})
        await sub.inner.set_job_state(user, job, JobState(Stage.DELIVERED, user), ttl_s=300)

        async def answer_later() -> None:
            await trio.sleep(40)
            await sub.inner.finish(user, job, payload, JobState(Stage.FINISHED, user), ttl_s=300)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer_later)
                r = await client.get(f"/v1/jobs/{job}/events", headers=AUTH)
                body = (await r.get_data()).decode()
    blocks = body.strip().split("\n\n")
    assert blocks[:2] == [": keep-alive", ": keep-alive"], body  # at 15 s and 30 s
    assert _events("\n\n".join(blocks[2:])) == [
        ("outcome", {"status": "completed", "result": {"x": 1}})
    ]
