"""A call refused before anything was enqueued (offline, a bad field, an unknown tool, a
reused key, an id in use, Redis down, a draining replica) answers with the ``job_id``
its caller chose, when it chose one: the caller's own correlation id, echoed. It names no
job (``GET /v1/jobs/{job_id}`` answers 404) and is free for a retry. An ``offline``
answer used to say ``job_id: null`` while a timeout said the id: a caller keyed on it
lost track. Both ways in (the ASGI fast path and the Quart route) answer the same."""

from __future__ import annotations

import json

import pytest
from deskbridge_hub._errors import BadRequest, IdempotencyKeyReused, JobIdInUse

from tests.hub.test_jobs_asgi import (
    JSON,
    ONLINE,
    _down,
    _draining,
    _nothing,
    _online,
    _raising,
    hub,
)

MINE = "order-42.attempt-1"


def _body(**fields: object) -> bytes:
    return json.dumps({"name": "echo", "job_id": MINE, **fields}).encode()


CASES = [
    ("offline", _nothing, _body(), 503),
    ("bad tool name", _online, _body(name="rm -rf"), 400),
    ("args not an object", _nothing, _body(args=[1]), 400),
    ("bad timeout", _nothing, _body(timeout_s=0), 400),
    ("unknown field", _nothing, _body(nmae=1), 400),
    ("unknown tool", _raising(BadRequest("no tool 'x' on the desktop", field="name")),
     _body(), 400),
    ("key reused", _raising(IdempotencyKeyReused("other args", job_id="j0")), _body(), 422),
    ("id in use", _raising(JobIdInUse("taken")), _body(), 409),
    ("Redis down", _down, _body(), 503),
    ("draining", _draining, _body(), 503),
]  # fmt: skip


@pytest.mark.parametrize(
    ("setup", "body", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi", "quart"])
async def test_a_refused_call_echoes_the_job_id_its_caller_chose(
    autojump_clock, monkeypatch, asgi_route, setup, body, status
):
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        await setup(h)
        r = await h.client.post(f"/v1/users/{ONLINE}/jobs", data=body, headers=JSON)
        assert r.status_code == status, await r.get_data()
        answer = await r.get_json()
        assert answer["job_id"] == MINE, answer
        assert "detail" not in answer or answer["detail"].get("stage") != "unknown"
        h.substrate.inner.set_unavailable(False)
        looked_up = await h.client.get(f"/v1/jobs/{MINE}", headers=JSON)
        assert looked_up.status_code == 404  # it names no job


@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi", "quart"])
async def test_no_job_id_is_made_up_for_a_refused_call_that_chose_none(
    autojump_clock, monkeypatch, asgi_route
):
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        r = await h.client.post(f"/v1/users/{ONLINE}/jobs", data=b'{"name": "echo"}', headers=JSON)
        assert (r.status_code, (await r.get_json())["job_id"]) == (503, None)
        bad = json.dumps({"name": "echo", "job_id": "a/b"}).encode()  # not an id: not echoed
        r = await h.client.post(f"/v1/users/{ONLINE}/jobs", data=bad, headers=JSON)
        assert r.status_code == 400 and "job_id" not in await r.get_json()


async def test_bridge_offline_outcome_has_the_callers_job_id(autojump_clock):
    from deskbridge_common import Timings
    from deskbridge_hub import Bridge
    from deskbridge_hub._memory import MemorySubstrate

    bridge = Bridge(MemorySubstrate(), Timings())
    mine = await bridge.dispatch("nobody", "echo", {}, job_id=MINE)
    assert (mine.status, mine.job_id) == ("offline", MINE)
    made = await bridge.dispatch("nobody", "echo", {})
    assert (made.status, made.job_id) == ("offline", None)  # no hub-made id is shown
    assert await bridge.job_state(MINE) is None  # it names no job


@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi", "quart"])
async def test_an_unexpected_error_does_not_echo_the_id(autojump_clock, monkeypatch, asgi_route):
    # a 500 says nothing about what was enqueued: its id is not presented as naming nothing
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        await _raising(RuntimeError("boom"))(h)
        r = await h.client.post(f"/v1/users/{ONLINE}/jobs", data=_body(), headers=JSON)
        assert r.status_code == 500 and "job_id" not in await r.get_json()
