"""A cancel that lands between the holder's death and the same desktop's takeover.

Two pods behind HAProxy; the sidecar's socket is on one of them, a job runs on it (the
counting tool, async: a cancel stops it). The sidecar is held (SIGSTOP) so that it cannot
reconnect yet, the pod holding its socket is SIGKILLed, and the job's cancel goes to the
surviving pod (202, stage ``delivered``); then the sidecar goes on and reconnects to the
survivor, whose takeover finds the job's entry with its cancel flag.

Found by fault injection: the takeover answered every caller ``in_doubt`` ("cancelled
after it was delivered ... may have acted and is not delivered again") without asking
the desktop, and sent it no cancel: the tool ran on to its end on the connected desktop,
whose ledger knew the whole time. The cancel accepted with 202 was dropped, and the
callers were told "unknown" for a job whose outcome the connected desktop had. Now a
redelivery of a cancelled job to the desktop every earlier delivery went to is sent for
its answer only (no time left: the desktop's ledger joins the run or answers from its
record, and never starts it afresh), followed by the cancel: the run stops and the
callers are told ``cancelled``, which the ledger agrees with (started, never ended).
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.chaos._harness import TIMINGS, headers, pods_behind_haproxy
from tests.procs import Sidecar, issue, kill_group, wait_until

pytestmark = pytest.mark.chaos

#: The run outlives the sidecar's stop, the kill, the cancel and the reconnect (about
#: 1 s in all) by several seconds, so a cancel that reaches it stops it before its end.
JOB_S = 6.0


def _post(base: str, user: str, job_id: str, key: str) -> tuple[int, dict]:
    body = {
        "name": "record",
        "args": {"key": key, "seconds": JOB_S},
        "idempotency_key": key,
        "timeout_s": 30,
        "job_id": job_id,
    }
    with httpx.Client(headers=headers(), timeout=45) as client:
        r = client.post(f"{base}/v1/users/{user}/jobs", json=body)
    return r.status_code, r.json()


def test_a_cancel_sent_while_the_desktop_moves_pods_reaches_it(tmp_path, procs):
    user, ledger, sidecar, doomed, survivor, _ = pods_behind_haproxy(tmp_path, procs, TIMINGS)
    key, job_id = "ct-" + user, "ct-job-" + user
    caller = procs.callers.submit(_post, survivor.http, user, job_id, key)
    (start,) = wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")

    sidecar.signal_group(signal.SIGSTOP)  # < 1 s: under the sidecar's 5 s clock-gap check
    try:
        kill_group(doomed)
        with httpx.Client(headers=headers(), timeout=10) as client:
            cancel = client.delete(f"{survivor.http}/v1/jobs/{job_id}")
    finally:
        sidecar.signal_group(signal.SIGCONT)
    assert cancel.status_code == 202, cancel.text
    assert cancel.json()["stage"] == "delivered", cancel.text

    code, body = caller.result(timeout=45)
    retry = procs.callers.submit(_post, survivor.http, user, job_id, key).result(timeout=45)
    # the run's own end would have come JOB_S after its start: wait past it
    time.sleep(max(0.0, start["t"] + JOB_S + 1.0 - time.time()))
    assert ledger.counts() == {key: 1}, ledger.events()
    assert ledger.ends(key) == [], ledger.events()  # the cancel stopped the run
    assert (code, body["status"]) == (409, "cancelled"), body
    assert body["error"]["message"] == "cancelled by the hub", body
    assert (retry[0], retry[1]["status"]) == (409, "cancelled"), retry  # the same request


def test_a_cancel_while_the_sidecar_was_killed_gets_its_ledger_s_in_doubt(tmp_path, procs):
    """The sibling on the desktop's side: the sidecar is killed mid-run (its ledger keeps
    the start), the job is cancelled, the sidecar restarts on the same ledger. The hub
    now asks it (the same daemon), the cancel right behind the job: the ledger's
    ``in_doubt`` must stay every caller's answer, never "cancelled before it started".
    (A guard of the new path: here the restarted sidecar answers from memory before the
    cancel arrives; the queued case that said "cancelled" is
    tests/sidecar/test_session.py::test_cancel_of_a_queued_redelivery_the_ledger_*.)"""
    user, ledger, sidecar, _, survivor, _ = pods_behind_haproxy(tmp_path, procs, TIMINGS)
    key, job_id = "ck-" + user, "ck-job-" + user
    caller = procs.callers.submit(_post, survivor.http, user, job_id, key)
    wait_until(lambda: ledger.starts(key), timeout_s=10, what="the job started")
    kill_group(sidecar)
    with httpx.Client(headers=headers(), timeout=10) as client:
        cancel = client.delete(f"{survivor.http}/v1/jobs/{job_id}")
    assert cancel.status_code == 202, cancel.text
    hub_ws = sidecar.argv[sidecar.argv.index("--hub") + 1]  # HAProxy
    env = {**TIMINGS, **ledger.env()}
    procs.add(
        Sidecar(tmp_path, hub_ws, issue(user), tools=["counting_tools"], env=env,
                data_dir=sidecar.data_dir, name="again")
    )  # fmt: skip

    code, body = caller.result(timeout=45)
    assert (code, body["status"]) == (409, "in_doubt"), body
    assert "may have acted" in body["error"]["message"], body
    assert ledger.counts() == {key: 1} and ledger.ends(key) == [], ledger.events()
