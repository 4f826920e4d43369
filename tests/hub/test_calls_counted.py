"""Every dispatch call answered is counted once, under the answer it got, and logged once
on ``deskbridge.hub.calls`` (docs/operations.md "Metrics" and "Logs").

A graceful restart's ``503 {"status": "unavailable", "error": {"code": "draining"}}`` is
an answer like any other: before, it was given before ``Bridge.dispatch`` (which counts
and logs), so ``deskbridge_jobs_total{outcome="unavailable"}`` and the calls log missed
every call a draining worker refused: the operator saw no refusal while callers were
told ``unavailable``.
"""

from __future__ import annotations

import logging
import re

import pytest
from prometheus_client import REGISTRY

from tests.hub.test_jobs_asgi import JSON, ONLINE, PATH, hub


def _count(outcome: str) -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name != "deskbridge_jobs":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome:
                total += sample.value
    return total


def _call_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.calls"]


@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi-route", "quart-route"])
async def test_a_draining_refusal_is_counted_and_logged_once(
    autojump_clock, monkeypatch, caplog, asgi_route
):
    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)
        h.holder["state"].drain.active = True
        before = _count("unavailable")
        r = await h.client.post(PATH, data=b'{"name": "drain-probe-tool"}', headers=JSON)
        body = await r.get_json()
        assert r.status_code == 503 and body["status"] == "unavailable", body
        assert body["error"]["code"] == "draining"
        assert _count("unavailable") - before == 1.0
        lines = _call_lines(caplog)
        assert lines == [f"call answered: unavailable (drain-probe-tool for {ONLINE})"], lines


async def test_a_draining_refusal_of_a_status_call_is_counted_and_logged_once(
    autojump_clock, monkeypatch, caplog
):
    """``POST /v1/users/{id}/status`` is a dispatch call (``Bridge.status``): its draining
    503 is an answer like the job route's. Was: refused in front of the dispatch and
    counted nowhere, so a draining worker's status refusals never showed."""
    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    async with hub(monkeypatch) as h:
        h.holder["state"].drain.active = True
        before = _count("unavailable")
        r = await h.client.post(f"/v1/users/{ONLINE}/status", headers=JSON)
        body = await r.get_json()
        assert r.status_code == 503 and body["error"]["code"] == "draining", body
        assert _count("unavailable") - before == 1.0
        assert _call_lines(caplog) == [f"call answered: unavailable (status for {ONLINE})"]


async def test_a_draining_refusal_names_the_callers_job_id_in_its_line(
    autojump_clock, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    async with hub(monkeypatch) as h:
        h.holder["state"].drain.active = True
        r = await h.client.post(
            PATH, data=b'{"name": "drain-probe-tool", "job_id": "mine-1"}', headers=JSON
        )
        assert (await r.get_json())["job_id"] == "mine-1"
        lines = _call_lines(caplog)
        expected = f"call for job mine-1 answered: unavailable (drain-probe-tool for {ONLINE})"
        assert lines == [expected], lines


async def test_a_draining_refusal_over_mcp_is_counted_and_logged_once(autojump_clock, caplog):
    import types as pytypes

    import mcp_types as types
    from deskbridge_hub import Bridge
    from deskbridge_hub._mcp import UserEndpoint
    from deskbridge_hub._memory import MemorySubstrate

    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    endpoint = UserEndpoint("u1", Bridge(MemorySubstrate()), is_draining=lambda: True)
    ctx = pytypes.SimpleNamespace(params={"_meta": {}}, session=None)
    params = types.CallToolRequestParams(name="drain-probe-tool", arguments={})
    before = _count("unavailable")
    result = await endpoint._call_tool(ctx, params)
    assert "draining" in str(result), result
    assert _count("unavailable") - before == 1.0
    assert _call_lines(caplog) == ["call answered: unavailable (drain-probe-tool for u1)"]


# -- a caller that goes away -----------------------------------------------------------------
# Before: ``timed_dispatch`` counted and logged only returned answers and
# SubstrateUnavailable; a call cancelled because its HTTP client hung up (or its MCP client
# cancelled, or its Python caller's scope ended) left no count and no line at all, while
# the holder logged "job J finished" for the job: the operator saw a job with no call.


async def test_an_abandoned_call_is_counted_and_logged_once_naming_its_job(
    autojump_clock, caplog, nursery
):
    import trio
    from deskbridge_common import Timings
    from deskbridge_hub import Bridge
    from deskbridge_hub._memory import MemorySubstrate
    from deskbridge_hub._session import HubState

    from tests.hub.test_outcomes import connect, ignore, sidecar
    from tests.hub.test_session import wall

    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    substrate = MemorySubstrate(clock=wall)
    hub_state = HubState(substrate=substrate, timings=Timings(), consumer="hub-1", wall_clock=wall)
    bridge = Bridge(substrate, hub_state.timings, wall_clock=wall)
    peer = await connect(nursery, hub_state)
    nursery.start_soon(sidecar, peer, ignore)  # takes the job, never answers
    before = _count("abandoned")
    with trio.move_on_after(2):  # the caller goes away after 2 s
        await bridge.dispatch("u1", "abandon-probe-tool", {}, timeout_s=30)
    assert _count("abandoned") - before == 1.0
    lines = _call_lines(caplog)
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r"call for job [0-9a-f]{32}~u1 answered: abandoned \(abandon-probe-tool for u1\)",
        lines[0],
    ), lines
    (record,) = [r for r in caplog.records if r.name == "deskbridge.hub.calls"]
    assert record.levelno == logging.INFO and record.answer == "abandoned"
