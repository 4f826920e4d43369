"""Issue 14 item 3: the admin API and ``deskbridge-hub inspect`` on a real hub (two
workers: any replica answers the same), real sidecars and Redis. Sidecars appear online
with their tools, a running job shows as pending with its consumer and job id, a stopped
sidecar goes offline with the time it left, and a job's state is readable."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.procs import API_KEY, BIN, Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def hub_cli(hub: Hub, *argv: str, key: str = API_KEY) -> subprocess.CompletedProcess:
    """``deskbridge-hub ARGV`` against ``hub`` (``DESKBRIDGE_HUB_HTTP``) with ``key``."""
    env = {**os.environ, "DESKBRIDGE_API_KEY": key, "DESKBRIDGE_HUB_HTTP": hub.http}
    return subprocess.run(
        [str(BIN / "deskbridge-hub"), *argv],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def inspect(hub: Hub, *argv: str) -> subprocess.CompletedProcess:
    return hub_cli(hub, "inspect", *argv)


def test_admin_api_and_inspect(tmp_path: Path) -> None:
    tag = secrets.token_hex(3)
    alice, bob = f"adm-alice-{tag}", f"adm-bob-{tag}"
    hub = Hub(tmp_path, workers=2)
    a = Sidecar(tmp_path, hub.ws, issue(alice), name="alice")
    b = Sidecar(tmp_path, hub.ws, issue(bob), name="bob", tools=["trace_tools"])
    with running(a, b, hub), api() as client, ThreadPoolExecutor(1) as pool:
        hub.wait_healthy()
        for user in (alice, bob):
            wait_until(
                lambda u=user: client.get(f"{hub.http}/v1/users/{u}/presence").json()["online"],
                timeout_s=20,
                what=f"{user} online",
            )
        started = time.time()
        r = client.get(f"{hub.http}/v1/admin/desktops", params={"limit": 500})
        assert r.status_code == 200
        rows = {d["user_id"]: d for d in r.json()["desktops"]}
        assert rows[alice]["online"] and rows[bob]["online"]
        assert set(rows[alice]["tools"]) == {"echo", "sleep"} or "echo" in rows[alice]["tools"]
        assert "traceparent_sync" in rows[bob]["tools"]
        assert rows[alice]["sidecar_version"]
        assert rows[alice]["since"] <= started + 1
        assert rows[alice]["queue"] == {"length": 0, "pending_count": 0}
        # bad paging is a 400 naming the field; no key is a 401
        bad = client.get(f"{hub.http}/v1/admin/desktops", params={"limit": 0})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "limit"
        assert (
            client.get(
                f"{hub.http}/v1/admin/desktops", headers={"Authorization": "Bearer no"}
            ).status_code
            == 401
        )

        # A running job is in flight: pending, with its consumer and job id.
        job_id = "adm-job-" + tag
        running_job = pool.submit(
            client.post,
            f"{hub.http}/v1/users/{alice}/jobs",
            json={"name": "sleep", "args": {"seconds": 8}, "job_id": job_id},
        )

        def in_flight():
            body = client.get(f"{hub.http}/v1/admin/users/{alice}").json()
            return body if body["in_flight"] == [job_id] else None

        user = wait_until(in_flight, timeout_s=10, what="job in flight")
        (pending,) = user["queue"]["pending"]
        assert pending["job_id"] == job_id and pending["deliveries"] == 1
        assert pending["consumer"].split("-")[-2].isdigit()  # host-pid-suffix
        job = client.get(f"{hub.http}/v1/jobs/{job_id}").json()
        assert job["stage"] == "delivered" and job["user_id"] == alice and not job["terminal"]
        out = inspect(hub, "user", alice)
        assert out.returncode == 0, out.stderr
        assert job_id in out.stdout and "online" in out.stdout
        assert running_job.result(timeout=20).json()["status"] == "completed"
        job = client.get(f"{hub.http}/v1/jobs/{job_id}").json()
        assert job["stage"] == "finished" and job["terminal"]
        missing = client.get(f"{hub.http}/v1/jobs/no-such-{tag}")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

        # The CLI: a table, and --json for scripts.
        out = inspect(hub, "desktops", "--limit", "500")
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if x.startswith(bob))
        assert "online" in line and "traceparent_async" in line
        listed = json.loads(inspect(hub, "desktops", "--json", "--limit", "500").stdout)
        assert bob in {d["user_id"] for d in listed["desktops"]}
        out = inspect(hub, "job", job_id)
        assert out.returncode == 0 and "finished" in out.stdout
        out = inspect(hub, "job", "no-such-" + tag)
        assert out.returncode == 1 and "404 not_found" in out.stderr

        # Bob's sidecar stops: offline, since when it left, with the close code.
        stopped = time.time()
        t0 = time.monotonic()
        b.stop()
        print(f"sidecar stop took {time.monotonic() - t0:.1f} s")
        wait_until(
            lambda: not client.get(f"{hub.http}/v1/users/{bob}/presence").json()["online"],
            timeout_s=20,
            what="bob offline",
        )
        user = wait_until(
            lambda: (
                (body := client.get(f"{hub.http}/v1/admin/users/{bob}").json())["ended_at"] and body
            ),
            timeout_s=10,
            what="bob's end recorded",
        )
        assert user["online"] is False
        assert stopped - 1 <= user["since"] <= time.time() + 1
        assert user["end"]["reason"]  # the close code and reason, or "socket gone"
    out = inspect(hub, "desktops")
    assert out.returncode == 1 and "cannot reach hub" in out.stderr
