"""Issue 14 item 2: ``DESKBRIDGE_LOG_FORMAT=json`` gives JSON lines with the job's fields,
one INFO line per finished job, an access log for the HTTP API, and the same in the
sidecar. Real hub (``serve --workers 1``), real sidecar, real Redis."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest

from tests.procs import Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_json_logs_carry_the_job_fields(tmp_path: Path) -> None:
    user = "jsonlog-" + secrets.token_hex(4)
    env = {"DESKBRIDGE_LOG_FORMAT": "json"}
    hub = Hub(tmp_path, workers=1, env=env)
    sidecar = Sidecar(tmp_path, hub.ws, issue(user), env=env)
    with running(sidecar, hub), api() as client:
        hub.wait_healthy()
        wait_until(
            lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"],
            timeout_s=20,
            what="sidecar online",
        )
        r = client.post(f"{hub.http}/v1/users/{user}/jobs", json={"name": "echo", "args": {"a": 1}})
        body = r.json()
        assert body["status"] == "completed"
        job_id = body["job_id"]
        r = client.post(f"{hub.http}/v1/users/nobody-{user}/jobs", json={"name": "echo"})
        assert r.json()["status"] == "offline"

        def finished():
            return [
                rec
                for rec in json_lines(hub.output())
                if rec.get("job_id") == job_id and rec.get("outcome") and rec["level"] == "INFO"
            ]

        hub_job = wait_until(finished, timeout_s=10, what="hub job line")
        side_job = wait_until(
            lambda: [r for r in json_lines(sidecar.output()) if r.get("job_id") == job_id],
            timeout_s=10,
            what="sidecar job line",
        )
    hub_text = hub.log_path.read_text()
    hub_records = json_lines(hub_text)
    assert hub_records, "no JSON lines in the hub's log"
    # Every line the hub wrote is JSON (Hypercorn's own lines included).
    text_lines = [
        line for line in hub_text.splitlines() if line.strip() and not line.startswith("{")
    ]
    assert text_lines == []
    # One INFO line for the finished job, with every field.
    assert len(hub_job) == 1
    rec = hub_job[0]
    assert rec["user_id"] == user and rec["tool"] == "echo" and rec["outcome"] == "completed"
    # a session id names its hub process: "<holder id: 16 hex>.<32 hex>"
    assert re.fullmatch(r"[0-9a-f]{16}\.[0-9a-f]{32}", rec["session_id"]), rec["session_id"]
    assert isinstance(rec["elapsed_ms"], float) and rec["elapsed_ms"] >= 0
    assert {"time", "level", "logger", "message"} <= set(rec)
    # The offline answer has its INFO line at the caller (no holder ever saw it): what the
    # caller was told (``answer``), never a job outcome (docs/operations.md, "Logs").
    offline = [r for r in hub_records if r.get("answer") == "offline"]
    assert len(offline) == 1 and offline[0]["user_id"] == f"nobody-{user}"
    assert offline[0]["logger"] == "deskbridge.hub.calls" and "outcome" not in offline[0]
    assert [r for r in hub_records if r.get("outcome") == "offline"] == []
    assert offline[0]["tool"] == "echo" and "elapsed_ms" in offline[0]
    # The session's lines carry user and session.
    online = [r for r in hub_records if "online" in r["message"] and r.get("user_id") == user]
    assert online and online[0]["session_id"] == rec["session_id"]
    # The access log: one line per API request, with status and timing.
    access = [r for r in hub_records if r["logger"] == "deskbridge.hub.access"]
    posts = [r for r in access if r["method"] == "POST"]
    assert [(r["path"], r["status"]) for r in posts] == [
        (f"/v1/users/{user}/jobs", 200),
        (f"/v1/users/nobody-{user}/jobs", 503),
    ]
    assert all(isinstance(r["elapsed_ms"], float) for r in posts)
    # The sidecar's line for the same job.
    assert len(side_job) == 1
    s = side_job[0]
    assert s["tool"] == "echo" and s["outcome"] == "completed" and s["elapsed_ms"] >= 0
