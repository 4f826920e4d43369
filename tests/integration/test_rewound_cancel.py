"""A cancel of a job running on the desktop whose state a store rewound to ``queued``
(it lost its last writes: an older snapshot restored, a replica promoted without them),
on a real hub process, Redis and sidecar process. The cancel answered the job's caller
``cancelled`` ("cancelled before it started") at once, while the tool, a sync one a
cancel cannot stop, ran on and completed (its answer dropped). Now the hub process
holding the desktop's socket answers: it has the job in flight, sends the cancel frame,
and the desktop's real answer (``completed``) is the caller's. The tool ran once; the
caller and the canceller each got a terminal, true answer."""

from __future__ import annotations

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._substrate import fence_key, state_key

from tests.procs import Hub, Ledger, RedisPoller, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def test_a_rewound_running_job_s_cancel_gets_the_desktop_s_real_answer(tmp_path: Path) -> None:
    tag = secrets.token_hex(3)
    user, job_id = f"rewound-{tag}", f"rw-{tag}"
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = Hub(tmp_path, workers=1)
    sidecar = Sidecar(
        tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env()
    )
    with running(sidecar, hub), api() as client, ThreadPoolExecutor(1) as pool, RedisPoller() as r:
        hub.wait_healthy()
        url = f"{hub.http}/v1/users/{user}"
        wait_until(lambda: client.get(url + "/presence").json()["online"], timeout_s=20)
        body = {
            "name": "record_sync", "args": {"key": job_id, "seconds": 4},
            "job_id": job_id, "timeout_s": 60,
        }  # fmt: skip
        call = pool.submit(client.post, url + "/jobs", json=body)
        wait_until(lambda: ledger.starts(job_id), timeout_s=20, what="the tool started")
        # the store rewinds: the job's state back to queued, its claim epoch gone
        stored = JobState.decode(r.get(state_key(user, job_id)))
        queued = JobState(Stage.QUEUED, user, at=time.time(), reply_to=stored.reply_to)
        r.command("SET", state_key(user, job_id), queued.encode(), "PX", 600_000)
        r.command("DEL", fence_key(user, job_id))
        cancel = client.delete(f"{hub.http}/v1/jobs/{job_id}")
        assert cancel.status_code == 202, cancel.text
        assert cancel.json()["stage"] == "queued"  # requested; the holder answers
        answer = call.result(timeout=30)
        assert answer.status_code == 200, answer.text  # was: 409 cancelled while it ran
        assert answer.json()["status"] == "completed"
        wait_until(lambda: ledger.ends(job_id), timeout_s=10, what="the tool ended")
        assert len(ledger.starts(job_id)) == 1  # executed exactly once
        final = client.get(f"{hub.http}/v1/jobs/{job_id}").json()
        assert final["stage"] == "finished", json.dumps(final)
