"""``deskbridge-hub cancel JOB_ID`` on a real hub, Redis and sidecar: an operator ends a
running job without composing the HTTP request; each answer has its exit status."""

from __future__ import annotations

import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.test_admin import hub_cli
from tests.procs import API_KEY, Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def cancel(hub: Hub, *argv: str, key: str = API_KEY) -> subprocess.CompletedProcess:
    return hub_cli(hub, "cancel", *argv, key=key)


def test_cancel_ends_a_running_job_and_says_what_it_found(tmp_path: Path) -> None:
    tag = secrets.token_hex(3)
    user, job_id = f"cancel-cli-{tag}", f"stuck-{tag}"
    hub = Hub(tmp_path, workers=1)
    sidecar = Sidecar(tmp_path, hub.ws, issue(user))
    with running(sidecar, hub), api() as client, ThreadPoolExecutor(1) as pool:
        hub.wait_healthy()
        url = f"{hub.http}/v1/users/{user}"
        wait_until(lambda: client.get(url + "/presence").json()["online"], timeout_s=20)
        body = {"name": "sleep", "args": {"seconds": 60}, "job_id": job_id, "timeout_s": 90}
        call = pool.submit(client.post, url + "/jobs", json=body)
        wait_until(
            lambda: client.get(f"{hub.http}/v1/jobs/{job_id}").json().get("stage") == "delivered",
            timeout_s=20,
            what="the sleep delivered",
        )
        refused = cancel(hub, job_id, key="wrong-key")
        assert refused.returncode == 1 and "401" in refused.stderr, refused
        keyless = cancel(hub, job_id, key="")
        assert keyless.returncode == 1 and "DESKBRIDGE_API_KEY is not set" in keyless.stderr
        out = cancel(hub, job_id)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{job_id}: cancel requested (stage delivered)"
        answer = call.result(timeout=30)
        assert answer.status_code == 409 and answer.json()["status"] == "cancelled"
        again = cancel(hub, job_id, "--json")
        assert again.returncode == 3, again
        assert '"cancel_requested": false' in again.stdout
        unknown = cancel(hub, f"no-such-{tag}")
        assert unknown.returncode == 4 and "404 not_found" in unknown.stderr, unknown
