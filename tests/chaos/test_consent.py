"""Issue 12 item 5 on real processes: a real hub, a real sidecar process and the real CLI
(``deskbridge-sidecar pending|approve|decline``). An approval-gated tool waits on the
desktop; meanwhile the job state endpoint and the progress events say
``awaiting_approval``; approve -> it runs once (200 completed); decline -> 409 declined,
never run. The oracle of "it ran" is the tool's own ledger file."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from tests.chaos._harness import HTTP_SLACK_S, TIMINGS, Answer, headers, new_user, wait_online
from tests.procs import BIN, Ledger, Sidecar, issue, wait_until

pytestmark = pytest.mark.chaos

TIMEOUT_S = 60.0


def _post(base: str, user: str, job_id: str, key: str) -> Answer:
    body = {"name": "pay", "args": {"key": key}, "idempotency_key": key, "job_id": job_id,
            "timeout_s": TIMEOUT_S}  # fmt: skip
    with httpx.Client(headers=headers(), timeout=TIMEOUT_S + HTTP_SLACK_S) as client:
        r = client.post(f"{base}/v1/users/{user}/jobs", json=body)
    return Answer(r.status_code, r.json(), time.time())


def _cli(*args: str, data_dir) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "deskbridge-sidecar"), *args, "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def _first_progress_event(base: str, job_id: str) -> dict:
    """The first ``progress`` event of ``GET /v1/jobs/{job_id}/events`` (bounded)."""
    with httpx.Client(headers=headers(), timeout=10.0) as client:
        with client.stream("GET", f"{base}/v1/jobs/{job_id}/events") as r:
            assert r.status_code == 200
            kind = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: ") and kind == "progress":
                    return json.loads(line.removeprefix("data: "))
    raise AssertionError("the event stream ended without a progress event")


def test_a_gated_tool_waits_for_the_cli_then_runs_or_is_declined(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = procs.hub(tmp_path, dict(TIMINGS), name="pod")
    sidecar = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["consent_tools"],
                                env={**TIMINGS, **ledger.env()}))  # fmt: skip
    wait_online(hub.http, user)
    with httpx.Client(headers=headers(), timeout=10.0) as client:
        listed = client.get(f"{hub.http}/v1/users/{user}/tools").json()["tools"]
    tools = {t["name"]: t for t in listed}
    assert tools["pay"]["approval_after_wait_s"] == 0  # the catalogue shows the declaration

    for job_id, verb in ((f"pay-a-{user}", "approve"), (f"pay-d-{user}", "decline")):
        caller = procs.callers.submit(_post, hub.http, user, job_id, job_id)
        def asked(job_id=job_id):
            return job_id in _cli("pending", data_dir=sidecar.data_dir).stdout

        wait_until(asked, timeout_s=20, interval_s=0.2, what=f"{job_id} awaits approval")
        assert _first_progress_event(hub.http, job_id)["stage"] == "awaiting_approval"

        def stage(job_id=job_id):
            with httpx.Client(headers=headers(), timeout=5.0) as client:
                return client.get(f"{hub.http}/v1/jobs/{job_id}").json().get("stage")

        wait_until(lambda: stage() == "awaiting_approval", timeout_s=10, what="the job state")
        time.sleep(1.0)  # nobody decided yet: it waits, it does not run
        assert not caller.done() and ledger.starts(job_id) == []
        decided = _cli(verb, job_id, data_dir=sidecar.data_dir)
        assert decided.returncode == 0 and decided.stdout.strip() == f"{job_id}: {verb}d"
        answer = caller.result(timeout=TIMEOUT_S + HTTP_SLACK_S)
        if verb == "approve":
            assert (answer.http_status, answer.body["result"]) == (200, {"paid": job_id})
            assert len(ledger.starts(job_id)) == 1
            wait_until(lambda: stage() == "finished", timeout_s=10, what="finished")
        else:
            assert answer.http_status == 409 and answer.status == "declined", answer.body
            assert ledger.starts(job_id) == []
            wait_until(lambda: stage() == "cancelled", timeout_s=10, what="cancelled")
    assert _cli("pending", data_dir=sidecar.data_dir).stdout == ""


def test_nobody_decides_the_deadline_ends_the_wait_unstarted(tmp_path, procs):
    """Nothing is approved by default: at ``timeout_s`` the caller's wait and the desktop's
    end together, so the caller is answered 504 ``timeout`` with the stage
    ``awaiting_approval`` or, when the desktop's answer wins the race, 410 ``expired``; the
    job ends ``expired``, the request is withdrawn and the tool never ran."""
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = procs.hub(tmp_path, dict(TIMINGS), name="pod")
    sidecar = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["consent_tools"],
                                env={**TIMINGS, **ledger.env()}))  # fmt: skip
    wait_online(hub.http, user)
    job_id = f"pay-t-{user}"
    body = {"name": "pay", "args": {"key": job_id}, "job_id": job_id, "timeout_s": 4}
    started = time.monotonic()
    with httpx.Client(headers=headers(), timeout=4 + HTTP_SLACK_S) as client:
        r = client.post(f"{hub.http}/v1/users/{user}/jobs", json=body)
        waited = time.monotonic() - started
        answer = r.json()
        if r.status_code == 504:
            assert answer["detail"] == {"stage": "awaiting_approval"}, answer
        else:
            assert (r.status_code, answer["status"]) == (410, "expired"), answer
            assert "awaited approval" in answer["error"]["message"]
        assert 4 <= waited < 4 + HTTP_SLACK_S

        def stage():
            return client.get(f"{hub.http}/v1/jobs/{job_id}").json().get("stage")

        wait_until(lambda: stage() == "expired", timeout_s=10, what="the desktop's expired")
    assert ledger.starts(job_id) == []
    assert _cli("pending", data_dir=sidecar.data_dir).stdout == ""
