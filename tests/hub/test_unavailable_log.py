"""A caller answered ``unavailable`` (503) leaves the cause in the hub's log, rate-limited:
the access line alone says only 503 (found by a helper filling Redis's ``maxclients``:
every call failed and nothing said why)."""

from __future__ import annotations

import logging

import pytest
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub import _unavailable_log as unavailable
from deskbridge_hub._http import bridge_error_answer, outcome_answer
from deskbridge_hub._mcp import unavailable_result
from deskbridge_hub._outcome import Outcome
from deskbridge_hub._peer_noise import LogBudget

CAUSE = "Redis at h:1 unavailable (GET presence): max number of clients reached"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(unavailable, "_budget", LogBudget(burst=0, interval_s=unavailable.EVERY_S))
    clock = [1000.0]
    monkeypatch.setattr(unavailable.time, "monotonic", lambda: clock[0])
    return clock


def _lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "deskbridge.hub.unavailable" and r.levelno == logging.WARNING
    ]


def test_every_way_of_answering_unavailable_logs_the_cause(caplog, _fresh) -> None:
    answers = [
        lambda: bridge_error_answer(SubstrateUnavailable(CAUSE)),  # HTTP, raised
        lambda: outcome_answer(  # HTTP, an outcome
            Outcome(
                job_id="j", status="unavailable", error={"code": "unavailable", "message": CAUSE}
            )
        ),
        lambda: unavailable_result(SubstrateUnavailable(CAUSE, job_id="j")),  # MCP
    ]
    for answer in answers:
        caplog.clear()
        _fresh[0] += unavailable.EVERY_S
        answer()
        assert [CAUSE in line for line in _lines(caplog)] == [True]


def test_lines_are_rate_limited_and_count_what_they_left_out(caplog, _fresh) -> None:
    for _ in range(5):
        assert bridge_error_answer(SubstrateUnavailable(CAUSE))[0] == 503
    assert len(_lines(caplog)) == 1
    _fresh[0] += unavailable.EVERY_S - 0.01
    bridge_error_answer(SubstrateUnavailable(CAUSE))
    assert len(_lines(caplog)) == 1
    _fresh[0] += 0.01
    bridge_error_answer(SubstrateUnavailable(CAUSE))
    lines = _lines(caplog)
    assert len(lines) == 2 and "(5 more such answers since the last line)" in lines[1]
