"""Issue 14 item 1: ``GET /metrics`` after a few calls carries each named series with the
right counts. Real Redis, a real ``deskbridge-hub serve --workers 1`` (one process: the
recommended one-worker-per-pod deployment), a real sidecar; every wait is bounded."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import (
    API_KEY,
    REDIS_URL,
    Hub,
    Sidecar,
    api,
    issue,
    resp_command,
    running,
    wait_until,
)

pytestmark = pytest.mark.integration


def scrape(hub: Hub) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(hub.http + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_after_a_few_calls(tmp_path: Path) -> None:
    user = "metrics-" + secrets.token_hex(4)
    late_user = "metrics-late-" + secrets.token_hex(4)
    hub = Hub(
        tmp_path, workers=1, env={"DESKBRIDGE_HEARTBEAT_S": "1", "DESKBRIDGE_PRESENCE_TTL_S": "3"}
    )
    sidecar = Sidecar(tmp_path, hub.ws, issue(user))
    redis = urlsplit(REDIS_URL)
    with running(sidecar, hub), api() as client:
        hub.wait_healthy()
        assert httpx.get(hub.http + "/metrics").status_code == 401  # API key required
        wait_until(
            lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"],
            timeout_s=20,
            what="sidecar online",
        )
        for i in range(3):
            r = client.post(
                f"{hub.http}/v1/users/{user}/jobs", json={"name": "echo", "args": {"i": i}}
            )
            assert r.json()["status"] == "completed"
        r = client.post(f"{hub.http}/v1/users/offline-{user}/jobs", json={"name": "echo"})
        assert r.json()["status"] == "offline"
        # An entry whose deadline passes while queued: presence written by hand (no
        # relay reads the stream), the caller times out, then a sidecar connects and
        # its hub answers the entry "expired" without forwarding it.
        resp_command(
            redis.hostname, redis.port, "SET", f"bridge:presence:{{{late_user}}}", "x", "PX", 30000
        )
        r = client.post(
            f"{hub.http}/v1/users/{late_user}/jobs", json={"name": "echo", "timeout_s": 0.3}
        )
        assert r.json()["status"] == "timeout"
        resp_command(redis.hostname, redis.port, "DEL", f"bridge:presence:{{{late_user}}}")
        late = Sidecar(tmp_path, hub.ws, issue(late_user), name="late")
        with running(late):
            wait_until(
                lambda: value(scrape(hub), "deskbridge_jobs_expired_total") == 1.0,
                timeout_s=20,
                what="expired entry answered",
            )
            time.sleep(2.5)  # two heartbeats of 1 s: refresh writes and lag probes happen
            m = scrape(hub)
            assert value(m, "deskbridge_sessions_open") == 2.0
            assert value(m, "deskbridge_connected_users") == 2.0
        wait_until(
            lambda: value(scrape(hub), "deskbridge_sessions_open") == 1.0,
            timeout_s=20,
            what="late sidecar's session closed",
        )
        m = scrape(hub)

    assert value(m, "deskbridge_sessions_total") == 2.0
    assert value(m, "deskbridge_presence_writes_total", kind="set") == 2.0
    assert value(m, "deskbridge_presence_writes_total", kind="refresh") >= 2.0
    assert value(m, "deskbridge_jobs_total", tool="echo", outcome="completed") == 3.0
    assert value(m, "deskbridge_jobs_total", tool="echo", outcome="offline") == 1.0
    assert value(m, "deskbridge_jobs_total", tool="echo", outcome="timeout") == 1.0
    assert value(m, "deskbridge_job_seconds_count", tool="echo") == 5.0
    assert 0 < value(m, "deskbridge_job_seconds_sum", tool="echo") < 5.0
    assert value(m, "deskbridge_job_seconds_bucket", tool="echo", le="+Inf") == 5.0
    assert value(m, "deskbridge_dispatch_seconds_count", tool="echo") == 3.0
    assert value(m, "deskbridge_jobs_served_total", tool="echo", outcome="completed") == 3.0
    assert value(m, "deskbridge_jobs_served_total", tool="echo", outcome="expired") == 1.0
    assert value(m, "deskbridge_jobs_expired_total") == 1.0
    assert value(m, "deskbridge_jobs_lost_total") == 0.0
    assert value(m, "deskbridge_reclaimed_entries_total") == 0.0
    # The remaining user's stream: 3 acknowledged entries (XLEN counts them until
    # trimmed), nothing pending.
    assert value(m, "deskbridge_queue_entries") == 3.0
    assert value(m, "deskbridge_pending_entries") == 0.0
    assert value(m, "deskbridge_draining") == 0.0
    assert value(m, "deskbridge_event_loop_lag_seconds_count") >= 2.0
    assert ("deskbridge_presence_write_failures_total", (("reason", "unavailable"),)) not in m
