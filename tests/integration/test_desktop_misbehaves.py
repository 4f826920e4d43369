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


def test_a_job_queued_before_a_restart_with_other_files_roots_is_refused_not_run(tmp_path):
    """Before: a files_write queued (behind a busy tool) for --files-root A was run, after
    a restart with --files-root B, into B: the same relative path, another folder."""
    user = "roots-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    root_a, root_b = tmp_path / "root-a", tmp_path / "root-b"
    root_a.mkdir()
    root_b.mkdir()
    hub = Hub(tmp_path, workers=2)
    with running(hub):
        hub.wait_healthy()
        first = Sidecar(
            tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env(),
            extra_args=["--files-root", str(root_a)],
        )  # fmt: skip
        with running(first), api() as client, ThreadPoolExecutor(2) as pool:
            _online(client, hub, user)
            busy = pool.submit(
                client.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "record", "args": {"key": "busy", "seconds": 3}, "timeout_s": 30},
            )
            wait_until(lambda: ledger.starts("busy"), timeout_s=20, what="the busy tool started")
            job_id = "write-" + secrets.token_hex(4)
            write = pool.submit(
                client.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "files_write", "args": {"path": "note.txt", "content": "for A"},
                      "timeout_s": 30, "job_id": job_id},
            )  # fmt: skip
            wait_until(
                lambda: client.get(f"{hub.http}/v1/jobs/{job_id}").status_code == 200,
                timeout_s=10,
                what="the write enqueued",
            )
            first.popen.send_signal(signal.SIGTERM)  # the busy tool finishes, the write waits
            assert first.popen.wait(30) == 0
            assert busy.result(timeout=30).status_code == 200
            second = Sidecar(
                tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env(),
                extra_args=["--files-root", str(root_b)], data_dir=first.data_dir,
            )  # fmt: skip
            with running(second):
                answer = write.result(timeout=40)
                assert answer.status_code == 422, answer.text
                assert answer.json()["error"]["code"] == "catalogue_changed"
                state = client.get(f"{hub.http}/v1/jobs/{job_id}").json()
                assert state["terminal"] and state["stage"] == "finished", state
                assert list(root_a.iterdir()) == [] and list(root_b.iterdir()) == []
                time.sleep(1.5)  # past CATALOGUE_SLACK_S after the welcome
                again = client.post(
                    f"{hub.http}/v1/users/{user}/jobs",
                    json={"name": "files_write", "args": {"path": "note.txt", "content": "B"},
                          "timeout_s": 30},
                )  # fmt: skip
                assert again.status_code == 200, again.text  # a new call runs, into B
                assert (root_b / "note.txt").read_text() == "B"


def _faketime_lib() -> str:
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        raise FileNotFoundError("libfaketime not found: apt-get install faketime")
    return found[0]


def test_a_queued_job_never_starts_after_its_caller_gave_up_when_the_clock_steps_back(
    tmp_path,
):
    """The sidecar's wall clock steps back an hour (libfaketime, offset read from a file
    at every call; the monotonic clock left alone, as an NTP step leaves it) while a job
    queues behind a busy tool. Before: it started 3 s after its caller was told timeout."""
    user = "step-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    offset = tmp_path / "faketime.txt"
    offset.write_text("+0s\n")
    env = {
        "LD_PRELOAD": _faketime_lib(),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        **ledger.env(),
    }
    hub = Hub(tmp_path, workers=2)
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=env)
        with running(sidecar), api() as client, ThreadPoolExecutor(2) as pool:
            _online(client, hub, user)
            busy = pool.submit(
                client.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "record", "args": {"key": "busy", "seconds": 6}, "timeout_s": 30},
            )
            wait_until(lambda: ledger.starts("busy"), timeout_s=20, what="the busy tool started")
            job_id = "late-" + secrets.token_hex(4)
            late = pool.submit(
                client.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "record", "args": {"key": "late"}, "timeout_s": 3,
                      "job_id": job_id},
            )  # fmt: skip
            time.sleep(1)
            offset.write_text("-3600s\n")  # the wall clock steps back an hour
            answer = late.result(timeout=20)
            assert answer.status_code == 504, answer.text  # timeout: it was queued there
            assert busy.result(timeout=30).status_code == 200
            wait_until(
                lambda: client.get(f"{hub.http}/v1/jobs/{job_id}").json()["terminal"],
                timeout_s=20,
                what="the late job's final state",
            )
            assert client.get(f"{hub.http}/v1/jobs/{job_id}").json()["stage"] == "expired"
            assert ledger.starts("late") == [] and len(ledger.starts("busy")) == 1
