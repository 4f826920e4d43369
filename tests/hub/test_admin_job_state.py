"""``GET /v1/jobs/{job_id}`` finds a job's state through the Bridge (the state key is per
user; the route must not call the substrate with the job id alone)."""

from __future__ import annotations

from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate


async def test_job_state_route_answers_404_for_unknown_and_400_for_bad_ids(autojump_clock):
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        r = await client.get("/v1/jobs/no-such-job")
        assert r.status_code == 404 and (await r.get_json())["error"]["code"] == "not_found"
        r = await client.get("/v1/jobs/" + "x" * 1000)
        assert r.status_code == 400


async def test_a_finished_job_s_state_carries_its_outcome(autojump_clock):
    """A caller that went away mid-call (an HTTP client that disconnected: the job runs
    on) reads the job's answer by its id, the answer every other reader gets; a job not
    answered yet has none."""
    import json

    from deskbridge_hub._jobstate import JobState, Stage

    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        user, job = "alice", "c0ffee~alice"
        await substrate.set_job_state(user, job, JobState(Stage.DELIVERED, user), ttl_s=60)
        body = await (await client.get(f"/v1/jobs/{job}")).get_json()
        assert body["stage"] == "delivered" and "outcome" not in body
        payload = json.dumps({"status": "completed", "result": [1, 2]})
        await substrate.finish(user, job, payload, JobState(Stage.FINISHED, user), ttl_s=60)
        body = await (await client.get(f"/v1/jobs/{job}")).get_json()
        assert body["stage"] == "finished" and body["terminal"] is True
        assert body["outcome"] == {"status": "completed", "result": [1, 2]}
