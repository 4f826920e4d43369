"""The ``tool`` label of the per-tool metrics is capped: callers may name any tool (an
offline desktop checks nothing) and a stream entry's ``name`` is any string, so labels
taken as given made one series per name, for good (unbounded cardinality)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from deskbridge_hub import Bridge, _metrics
from deskbridge_hub._memory import MemorySubstrate
from prometheus_client import REGISTRY

MAX = getattr(_metrics, "MAX_TOOL_LABELS", 100)


def _tools(metric: str, prefix: str) -> set[str]:
    return {
        sample.labels["tool"]
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == metric and sample.labels.get("tool", "").startswith(prefix)
    }


def _other(metric: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(metric, {"tool": "other", "outcome": outcome}) or 0.0


@pytest.fixture(autouse=True)
def fresh_labels(monkeypatch):
    """This test's own label set (others in the process have taken some)."""
    monkeypatch.setattr(_metrics, "_tool_labels", set(), raising=False)


async def test_names_only_ever_answered_offline_take_no_label(autojump_clock) -> None:
    bridge = Bridge(MemorySubstrate())
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    before = _other("deskbridge_jobs_total", "offline")
    for i in range(2 * MAX):
        outcome = await bridge.dispatch("nobody", f"{prefix}{i}", {}, timeout_s=5)
        assert outcome.status == "offline"
    assert _tools("deskbridge_jobs_total", prefix) == set()
    assert _other("deskbridge_jobs_total", "offline") == before + 2 * MAX


def test_served_names_take_at_most_max_tool_labels() -> None:
    session = SimpleNamespace(
        user_id="u1", session_id="s1", wall_clock=lambda: 0.0, knows=lambda name: True
    )  # a desktop announcing every name (a label each: still at most MAX)
    prefix = f"s{uuid.uuid4().hex[:8]}-"
    before = _other("deskbridge_jobs_served_total", "failed")
    for i in range(MAX + 50):  # malformed entries: their name field is any string
        _metrics.job_served(session, "failed", tool=f"{prefix}{i}")
    assert len(_tools("deskbridge_jobs_served_total", prefix)) == MAX
    assert _other("deskbridge_jobs_served_total", "failed") == before + 50
    for i in range(MAX):  # a labelled name keeps its label
        _metrics.job_dispatched(f"{prefix}{i}", 0.1, known=True)
    _metrics.job_dispatched(f"{prefix}{MAX}", 0.1, known=True)
    assert len(_tools("deskbridge_dispatch_seconds_count", prefix)) == MAX


async def test_names_of_calls_abandoned_before_any_check_take_no_label(autojump_clock) -> None:
    """A caller that goes away (hangs up, cancels) before the desktop's catalogue looked
    at the name: the call is counted ``abandoned``, under ``other`` unless the name has
    a label already. Was: each such name took one of the ``MAX_TOOL_LABELS`` for good, so
    a caller naming tools that do not exist and hanging up at once (an unknown name is
    otherwise refused, uncounted) filled the labels and real tools went to ``other``."""
    import trio

    bridge = Bridge(MemorySubstrate())
    prefix = f"a{uuid.uuid4().hex[:8]}-"
    before = _other("deskbridge_jobs_total", "abandoned")
    for i in range(2 * MAX):
        with trio.CancelScope() as scope:
            scope.cancel()  # gone before the first look at anything
            await bridge.dispatch("u1", f"{prefix}{i}", {}, timeout_s=5)
    assert _tools("deskbridge_jobs_total", prefix) == set()
    assert _other("deskbridge_jobs_total", "abandoned") == before + 2 * MAX


# -- only a tool the user's catalogue has takes a label --------------------------------
# Was: a call answered ``timeout`` or ``unavailable`` took a label for whatever name its
# caller sent (only ``offline`` and ``abandoned`` did not): a desktop that announced no
# catalogue checks nothing, so a caller naming random tools there (each times out), or
# while Redis is down (each unavailable), filled the label set with names that are no
# tools, and the real tools went to ``other`` for the process's life.


def test_served_names_the_desktop_did_not_announce_take_no_label() -> None:
    session = SimpleNamespace(
        user_id="u1", session_id="s1", wall_clock=lambda: 0.0, knows=lambda name: False
    )
    prefix = f"x{uuid.uuid4().hex[:8]}-"
    for i in range(5):
        _metrics.job_served(session, "failed", tool=f"{prefix}{i}")
    assert _tools("deskbridge_jobs_served_total", prefix) == set()


async def test_names_answered_unavailable_before_any_catalogue_take_no_label(autojump_clock):
    substrate = MemorySubstrate()
    bridge = Bridge(substrate)
    substrate.set_unavailable(True)
    prefix = f"u{uuid.uuid4().hex[:8]}-"
    before = _other("deskbridge_jobs_total", "unavailable")
    for i in range(2 * MAX):
        with pytest.raises(Exception, match="(?i)unavailable|redis|store"):
            await bridge.dispatch("u1", f"{prefix}{i}", {}, timeout_s=5)
    assert _tools("deskbridge_jobs_total", prefix) == set()
    assert _other("deskbridge_jobs_total", "unavailable") == before + 2 * MAX


async def test_names_no_catalogue_has_take_no_label_when_they_time_out(autojump_clock, nursery):
    """A desktop that announced no catalogue (nothing is checked): the names are
    enqueued, forwarded and time out; neither the caller's count nor the holder's
    dispatch latency takes a label for them."""
    from deskbridge_common import Timings
    from deskbridge_hub._session import HubState

    from tests.hub.test_outcomes import connect, ignore, sidecar
    from tests.hub.test_session import wall

    substrate = MemorySubstrate(clock=wall)
    state = HubState(substrate=substrate, timings=Timings(), consumer="hub-1", wall_clock=wall)
    bridge = Bridge(substrate, state.timings, wall_clock=wall)
    peer = await connect(nursery, state)  # no tools announced
    nursery.start_soon(sidecar, peer, ignore)
    prefix = f"n{uuid.uuid4().hex[:8]}-"
    for i in range(3):
        outcome = await bridge.dispatch("u1", f"{prefix}{i}", {}, timeout_s=1)
        assert outcome.status == "timeout"
    assert _tools("deskbridge_jobs_total", prefix) == set()
    assert _tools("deskbridge_dispatch_seconds_count", prefix) == set()
    # a tool of the catalogue does take one ("status" is every desktop's)
    assert (await bridge.status("u1", timeout_s=1)).status == "timeout"
    assert "status" in _tools("deskbridge_jobs_total", "status")
