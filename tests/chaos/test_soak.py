"""Issue 16 item 4: the short soak (about two minutes) of ``bench/soak.py``.

Three hub processes behind HAProxy, 20 sidecars each behind a proxy that cuts its
connection half-open, 16 callers retrying one idempotency key each on offline /
unavailable / lost / timeout / a provisional ``in_doubt`` (``detail.pending``) and
HAProxy's 5xx, refused connections, a hub SIGKILLed
every 10 s and restarted 2 s later, a socket cut every 5 s, Redis SIGKILLed and restarted
on its AOF halfway, ``DESKBRIDGE_RECLAIM_IDLE_S=5``; production timings otherwise.

Fails on any double execution (counted by the tool in its ledger), any hung attempt
(no HTTP answer within the job's timeout + 10 s) or stuck caller, any key whose final
answer is ``offline``, ``lost`` or ``expired`` although it ran, and any ``completed`` for a
job that never ran. Throughput and latency are printed,
not asserted (they are the bench's figures; see bench/README.md).
"""

from __future__ import annotations

import pytest

from bench.lib.soak import Soak, SoakConfig, format_report

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(480)
def test_short_soak(tmp_path):
    config = SoakConfig(
        calm_s=20.0,
        faults_s=80.0,
        bucket_s=20.0,
        key_budget_s=30.0,
    )
    report = Soak(tmp_path, config).run()
    print("\n" + format_report(report))

    assert report["keys_issued"] > 0 and report["keys_completed"] > 0, report
    assert report["faults"].get("hub kill -9", 0) >= 5, report["faults"]
    assert report["faults"].get("redis restart on AOF", 0) == 1, report["faults"]
    assert report["double_executions"] == [], report["double_executions"]
    assert report["hung_attempts"] == 0, report["attempt_histogram"]
    assert report["stuck_callers"] == 0
    assert report["keys_answered"] == report["keys_issued"]
    assert report["final_offline_or_lost_but_ran"] == [], report["final_offline_or_lost_but_ran"]
    assert report["completed_but_not_run"] == [], report["completed_but_not_run"]
    # The same kind: docs/outcomes.md says `expired` did not run either (the false
    # `expired` of a redelivery past its deadline was issue 16's last gap).
    assert report["final_said_not_run_but_ran"] == [], report["final_said_not_run_but_ran"]
