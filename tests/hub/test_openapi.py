"""Issue 14 item 7: ``/openapi.json`` describes exactly the routes the app serves (each
path and method, both ways), so the document cannot fall behind the code."""

from __future__ import annotations

import re

from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate

IMPLICIT = {"HEAD", "OPTIONS"}


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
