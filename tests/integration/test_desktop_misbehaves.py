"""The desktop changes or misbehaves under queued or running work: real hub and sidecar
processes. Each test asserts at most one start per key (the counting ledger) and a
terminal answer for every caller within its timeout."""

from __future__ import annotations

import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.procs import Hub, Ledger, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def _online(client, hub: Hub, user: str) -> None:
    wait_until(
        lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"],
        timeout_s=20,
        what=f"{user} online",
    )


def test_a_tool_ignoring_cancellation_is_answered_in_doubt_and_the_sidecar_still_stops(
    tmp_path,
):
    """Before: SIGTERM gave up on the tool ("answered in_doubt") but the answer waited for
    the tool to give in, so the caller waited for its timeout, and the process never
    exited (a second SIGTERM neither)."""
    user = "stub-" + secrets.token_hex(4)
    key = "stubborn-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = Hub(tmp_path, workers=1)
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(
            tmp_path,
            hub.ws,
            issue(user),
            tools=["counting_tools", "stubborn_tools"],
            env={"DESKBRIDGE_GRACE_S": "1", **ledger.env()},
        )
        with running(sidecar), api() as client, ThreadPoolExecutor(1) as pool:
            _online(client, hub, user)
            job_id = "job-" + key
            call = pool.submit(
                client.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "stubborn", "args": {"key": key}, "timeout_s": 30,
                      "job_id": job_id, "idempotency_key": key},
            )  # fmt: skip
            wait_until(lambda: ledger.starts(key), timeout_s=20, what="the tool started")
            started = time.monotonic()
            sidecar.popen.send_signal(signal.SIGTERM)
            status = sidecar.popen.wait(20)
            assert status == 0, sidecar.output()[-2000:]
            assert time.monotonic() - started < 1 + 1 + 5 + 5  # grace, flush, bound, slack
            answer = call.result(timeout=30)
            assert answer.status_code == 409, answer.text
            assert answer.json()["status"] == "in_doubt"
            assert answer.json()["elapsed_ms"] < 20_000
            state = client.get(f"{hub.http}/v1/jobs/{job_id}").json()
            assert state["terminal"] and state["stage"] == "finished", state
            assert len(ledger.starts(key)) == 1 and ledger.ends(key) == []
            assert "ignores cancellation" in sidecar.output()
