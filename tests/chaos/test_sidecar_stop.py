"""Issue 11 items 4 and 5 on real processes: a sidecar that ends on purpose.

* Ctrl-C (SIGINT) mid-job: one WARNING line, no traceback, exit 130; the running job is
  given the grace (1 s here) and then reported ``in_doubt`` at once: its caller is
  answered about a second after the signal, not at its own timeout (field: 30 s).
* SIGTERM mid-job with a job shorter than the grace: the job finishes and is answered
  ``completed``, then the sidecar exits 0.
* A second sidecar for the same user: the older one is closed 4001, says so once at
  WARNING and exits 3; the newer keeps the user (presence never flips back).
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos._harness import TIMINGS, new_user, wait_online
from tests.procs import Ledger, Sidecar, issue, wait_until

pytestmark = pytest.mark.chaos


def _start(tmp_path, procs, user, ledger, **env):
    full = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": "60", **env}
    hub = procs.hub(tmp_path, full, name="pod")
    sidecar = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                                env={**full, **ledger.env()}))  # fmt: skip
    wait_online(hub.http, user)
    return hub, sidecar


def test_ctrl_c_mid_job_answers_the_caller_in_doubt_within_the_grace(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub, sidecar = _start(tmp_path, procs, user, ledger, DESKBRIDGE_GRACE_S="1")
    key = "ctrlc-" + user
    caller = procs.callers.post(
        hub.http, user, "record", {"key": key, "seconds": 30}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=15, what="the job started")
    sent_at = time.time()
    sidecar.popen.send_signal(signal.SIGINT)
    answer = caller.result(timeout=40)
    took = answer.at - sent_at
    assert answer.http_status == 409 and answer.status == "in_doubt", answer.body
    assert took < 3.0, took  # grace 1 s + the answer's way; the caller's timeout was 30 s
    assert sidecar.popen.wait(10) == 130
    out = sidecar.output()
    assert "Traceback" not in out and "ExceptionGroup" not in out, out[-2000:]
    assert out.count("Ctrl-C: stopping; waiting up to 1 s for record to finish") == 1
    assert ledger.ends(key) == []  # given up, not finished
    print(f"\nCtrl-C mid-job -> caller answered in_doubt {took:.2f} s later (grace 1 s)")


def test_sigterm_lets_a_short_job_finish_then_exits_0(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub, sidecar = _start(tmp_path, procs, user, ledger, DESKBRIDGE_GRACE_S="10")
    key = "term-" + user
    caller = procs.callers.post(
        hub.http, user, "record", {"key": key, "seconds": 2}, key=key, timeout_s=30
    )
    wait_until(lambda: ledger.starts(key), timeout_s=15, what="the job started")
    sidecar.popen.send_signal(signal.SIGTERM)
    answer = caller.result(timeout=40)
    assert answer.status == "completed", answer.body
    assert sidecar.popen.wait(15) == 0
    assert len(ledger.ends(key)) == 1
    assert "Traceback" not in sidecar.output()


def test_the_older_of_two_sidecars_stops_once_superseded(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub, older = _start(tmp_path, procs, user, ledger)
    first = wait_online(hub.http, user)
    newer = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                              env={**TIMINGS, **ledger.env()}, name="newer"))  # fmt: skip
    assert older.popen.wait(20) == 3
    second = wait_online(hub.http, user)
    assert second != first
    out = older.output()
    assert out.count("superseded: a newer sidecar for this user connected") == 1
    assert "Traceback" not in out
    time.sleep(3)  # a few heartbeats: the newer one keeps the user
    assert wait_online(hub.http, user) == second and newer.popen.poll() is None
