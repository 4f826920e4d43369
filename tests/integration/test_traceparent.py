"""Issue 14 item 2: a caller's W3C ``traceparent`` reaches the tool through the stream
entry and the job frame, and the job's log lines carry its trace id. Real hub, sidecar
and Redis; the tool reports the trace context current while it runs."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.procs import Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def test_traceparent_reaches_the_tool(tmp_path: Path) -> None:
    user = "trace-" + secrets.token_hex(4)
    trace_id = secrets.token_hex(16)
    parent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_LOG_FORMAT": "json"})
    sidecar = Sidecar(
        tmp_path, hub.ws, issue(user), tools=["trace_tools"], env={"DESKBRIDGE_LOG_FORMAT": "json"}
    )
    with running(sidecar, hub), api() as client:
        hub.wait_healthy()
        wait_until(
            lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"],
            timeout_s=20,
            what="sidecar online",
        )
        url = f"{hub.http}/v1/users/{user}/jobs"
        for tool in ("traceparent_async", "traceparent_sync"):
            r = client.post(url, json={"name": tool}, headers={"traceparent": parent})
            body = r.json()
            assert body["status"] == "completed", body
            # Same trace; the span id may be the caller's (no SDK: non-recording span)
            # or a child's (an SDK in the sidecar), never another trace.
            assert body["result"].split("-")[1] == trace_id
        # Without a header, no trace context is invented.
        r = client.post(url, json={"name": "traceparent_async"})
        assert r.json()["result"] is None
        # Malformed header: ignored, the job runs.
        r = client.post(url, json={"name": "traceparent_async"}, headers={"traceparent": "x"})
        assert r.json() == {**r.json(), "status": "completed", "result": None}

        def traced(text: str) -> list[dict]:
            return [
                json.loads(line)
                for line in text.splitlines()
                if line.startswith("{") and f'"trace_id": "{trace_id}"' in line
            ]

        hub_lines = wait_until(lambda: traced(hub.output()), timeout_s=10, what="hub line")
        side_lines = wait_until(lambda: traced(sidecar.output()), timeout_s=10, what="line")
    assert {r["tool"] for r in hub_lines} == {"traceparent_async", "traceparent_sync"}
    assert {r["tool"] for r in side_lines} == {"traceparent_async", "traceparent_sync"}
