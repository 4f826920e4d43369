"""Issue 11 item 2: skewed clocks never refuse valid work.

Real processes whose clocks are moved with libfaketime (``faketime -f +300s``): a hub
holding the socket 5 minutes ahead of the replica that enqueues, a desktop 5 minutes
ahead of (or behind) the hubs, and a hub behind the machine that minted the token.
The kind: anything compared across machines' clocks (docs/operations.md, "Clocks").
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.procs import Hub, Ledger, Sidecar, api, faketime, issue, running, wait_until

pytestmark = pytest.mark.integration


def _online(client, hub: Hub, user: str) -> None:
    wait_until(
        lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"],
        timeout_s=20,
        what=f"{user} online",
    )


def _echo_all(client, hub: Hub, user: str, n: int) -> None:
    for i in range(n):
        args = {"i": i, "nonce": secrets.token_hex(4)}
        r = client.post(
            f"{hub.http}/v1/users/{user}/jobs",
            json={"name": "echo", "args": args, "timeout_s": 30},
        )
        assert r.status_code == 200, r.text
        assert r.json()["result"] == args


def test_holder_five_minutes_ahead_runs_jobs_enqueued_by_another_replica(tmp_path):
    """Before: the holder compared the caller replica's deadline (now + 30 s) with its
    own clock (+300 s) and answered 410 expired at once."""
    user = "skew-" + secrets.token_hex(4)
    ahead = Hub(tmp_path, workers=1, name="hub-ahead", prefix=faketime(300))
    caller = Hub(tmp_path, workers=1, name="hub-caller")
    with running(ahead, caller):
        ahead.wait_healthy()
        caller.wait_healthy()
        sidecar = Sidecar(tmp_path, ahead.ws, issue(user))
        with running(sidecar), api() as client:
            _online(client, caller, user)
            _echo_all(client, caller, user, 5)
            status = client.post(f"{caller.http}/v1/users/{user}/status")
            assert status.status_code == 200, status.text
            assert status.json()["status"] == "completed"


def test_caller_replica_five_minutes_ahead_sets_no_later_deadline(tmp_path):
    """The replica that enqueues runs 300 s ahead. The job's deadline still comes from
    Redis' clock: a job that cannot start within its 2 s (the desktop's serial tool
    worker is busy for 4 s) never starts, instead of running 5 minutes past it."""
    user = "skew-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    holder = Hub(tmp_path, workers=1, name="hub-holder")
    ahead = Hub(tmp_path, workers=1, name="hub-ahead", prefix=faketime(300))
    with running(holder, ahead):
        holder.wait_healthy()
        ahead.wait_healthy()
        sidecar = Sidecar(
            tmp_path, holder.ws, issue(user), tools=["counting_tools"], env=ledger.env()
        )
        with running(sidecar), api() as client, ThreadPoolExecutor(1) as pool:
            _online(client, ahead, user)

            def run_busy():
                with api() as c:
                    return c.post(
                        f"{holder.http}/v1/users/{user}/jobs",
                        json={"name": "record", "args": {"key": "busy", "seconds": 4}},
                    )

            busy = pool.submit(run_busy)
            wait_until(lambda: ledger.starts("busy"), timeout_s=10, what="busy tool started")
            r = client.post(
                f"{ahead.http}/v1/users/{user}/jobs",
                json={"name": "record", "args": {"key": "late"}, "timeout_s": 2},
            )
            assert r.json()["status"] in {"expired", "timeout"}, r.text
            assert busy.result(timeout=30).status_code == 200
            time.sleep(2)  # a deadline set 300 s late would let "late" start by now
            assert ledger.ends("busy") and ledger.starts("late") == []


@pytest.mark.parametrize("offset_s", [300, -300])
def test_desktop_clock_off_by_five_minutes_still_runs_jobs(tmp_path, offset_s):
    """Before: the sidecar compared the hub's absolute deadline with its own clock; 300 s
    ahead, every job was refused as expired. Now it gets the time left (``timeout_s``)."""
    user = "skew-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1)
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user), prefix=faketime(offset_s))
        with running(sidecar), api() as client:
            _online(client, hub, user)
            _echo_all(client, hub, user, 5)


def test_token_minted_30s_ahead_of_the_hub_is_accepted(tmp_path):
    """Before: 403 "not yet valid (iat)" and the sidecar exited for good."""
    user = "skew-" + secrets.token_hex(4)
    behind = Hub(tmp_path, workers=1, name="hub-behind", prefix=faketime(-30))
    with running(behind):
        behind.wait_healthy()
        sidecar = Sidecar(tmp_path, behind.ws, issue(user))
        with running(sidecar), api() as client:
            _online(client, behind, user)
            _echo_all(client, behind, user, 2)


def test_token_minted_far_ahead_is_refused_as_transient_and_the_sidecar_retries(tmp_path):
    """Beyond the 300 s leeway the hub answers 503 token_not_yet_valid (Retry-After): a
    refusal that goes away by itself, so the sidecar keeps retrying instead of exiting."""
    user = "skew-" + secrets.token_hex(4)
    behind = Hub(tmp_path, workers=1, name="hub-behind", prefix=faketime(-900))
    with running(behind):
        behind.wait_healthy()
        sidecar = Sidecar(tmp_path, behind.ws, issue(user))
        with running(sidecar):
            wait_until(
                lambda: "reconnecting in" in sidecar.output(),
                timeout_s=20,
                what="the refused sidecar scheduling a retry",
            )
            time.sleep(1)
            assert sidecar.popen.poll() is None, sidecar.output()  # it did not give up
            assert "token_not_yet_valid" in sidecar.output()
            assert "runs ahead" in behind.output()
