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
