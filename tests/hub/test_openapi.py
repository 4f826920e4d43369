"""Issue 14 item 7: ``/openapi.json`` describes exactly the routes the app serves (each
path and method, both ways), so the document cannot fall behind the code."""

from __future__ import annotations

import re
from typing import Any

from deskbridge_hub import HubConfig, SubstrateUnavailable, create_app
from deskbridge_hub._memory import MemorySubstrate

IMPLICIT = {"HEAD", "OPTIONS"}
KEY = "k" * 32


async def test_document_matches_the_routes(autojump_clock) -> None:
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.websocket or rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        served |= {(path, m.lower()) for m in rule.methods or () if m not in IMPLICIT}
    async with app.test_app() as test_app:
        r = await test_app.test_client().get("/openapi.json")  # no key needed
        assert r.status_code == 200
        doc = await r.get_json()
    assert doc["openapi"].startswith("3.1")
    described = {(path, m) for path, ops in doc["paths"].items() for m in ops}
    assert served - described == set(), "routes missing from the OpenAPI document"
    assert described - served == set(), "the document names routes the app does not serve"
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"{([^}]+)}", path))
        for method, op in ops.items():
            assert op["responses"], (path, method)
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == names, (path, method)


class _Down(MemorySubstrate):
    """The memory substrate, refusing every public call once ``down`` is set (Redis
    unreachable after the app started)."""

    down = False

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or not callable(attr) or not object.__getattribute__(self, "down"):
            return attr

        async def refuse(*args: Any, **kwargs: Any) -> Any:
            raise SubstrateUnavailable("Redis at test:0 unavailable (down)")

        return refuse


async def _statuses(
    doc: dict[str, Any],
    substrate: MemorySubstrate,
    *,
    user: str = "alice",
    job: str = "job-1",
    key: str = KEY,
    body: bytes = b"{}",
) -> dict[tuple[str, str], tuple[int, set[str]]]:
    """Each documented route's status for one probe, with the statuses it documents."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=substrate)
    got = {}
    async with app.test_app() as test_app:
        client = test_app.test_client()
        if isinstance(substrate, _Down):
            substrate.down = True
        for path, ops in doc["paths"].items():
            if path.endswith("/events") or path.startswith("/admin"):
                continue  # an event stream and the pages: their own tests probe them
            url = path.replace("{user_id}", user).replace("{job_id}", job)
            for method, op in ops.items():
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                data = None
                if "requestBody" in op:
                    data, headers["Content-Type"] = body, "application/json"
                r = await client.open(url, method=method.upper(), headers=headers, data=data)
                got[(path, method)] = (r.status_code, set(op["responses"]))
        if isinstance(substrate, _Down):
            substrate.down = False  # Redis back for the app's shutdown
    return got


async def test_every_status_a_route_answers_is_documented(autojump_clock) -> None:
    """Probe every documented route as a newcomer would (no key, a wrong key, a bad path
    value, a body over the limit or malformed, Redis down): the status of each answer is
    one the document lists for that route."""
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        doc = await (await test_app.test_client().get("/openapi.json")).get_json()
    limit = app.config["MAX_CONTENT_LENGTH"]
    cases = {
        "no key": await _statuses(doc, MemorySubstrate(), key=""),
        "wrong key": await _statuses(doc, MemorySubstrate(), key="x" * 32),
        "bad user_id / job_id": await _statuses(doc, MemorySubstrate(), user="a%20b", job="a%20b"),
        "body over the limit": await _statuses(doc, MemorySubstrate(), body=b" " * (limit + 1)),
        "malformed body": await _statuses(doc, MemorySubstrate(), body=b"{"),
        "Redis down": await _statuses(doc, _Down()),
    }
    missing = [
        f"{why}: {method.upper()} {path} answered {status}, documented {sorted(listed)}"
        for why, got in cases.items()
        for (path, method), (status, listed) in got.items()
        if str(status) not in listed
    ]
    assert missing == [], "\n".join(missing)
