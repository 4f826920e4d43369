"""Fixtures for the chaos suite: a process registry that stops every process it started
(by process group) and, when a test fails, prints the tail of every process's log."""

from __future__ import annotations

import pytest

from tests.chaos._harness import Procs


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"chaos_rep_{report.when}", report)
    return report


@pytest.fixture
def procs(request):
    registry = Procs()
    try:
        yield registry
    finally:
        registry.stop_all()
        rep = getattr(request.node, "chaos_rep_call", None)
        if rep is not None and rep.failed:
            registry.dump_logs()
