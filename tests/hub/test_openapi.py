"""Issue 14 item 7: ``/openapi.json`` describes exactly the routes the app serves (each
path and method, both ways), so the document cannot fall behind the code."""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import trio
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
            if path.endswith("/events"):
                continue  # an event stream: its own tests probe it
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


async def _slow_body_statuses(doc: dict[str, Any]) -> dict[tuple[str, str], tuple[int, set[str]]]:
    """Each route with a body, sent a body that never finishes (a client stalled after its
    first bytes): its status (408 once Quart's ``BODY_TIMEOUT`` passed), with the statuses
    it documents."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    got = {}
    async with app.test_app():
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                if "requestBody" not in op:
                    continue
                url = path.replace("{user_id}", "alice")
                headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
                status = await _stalled(app, method, url, headers)
                got[(path, method)] = (status, set(op["responses"]))
    return got


async def _stalled(app: Any, method: str, path: str, headers: dict[str, str]) -> int:
    """The status ``app`` answers a request whose body stops after ``{`` (raw ASGI: the
    test client sends whole bodies)."""
    sent: list[dict[str, Any]] = []
    first = [{"type": "http.request", "body": b"{", "more_body": True}]

    async def receive() -> dict[str, Any]:
        if first:
            return first.pop()
        await trio.sleep_forever()  # the client sends nothing more, and stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method.upper(),
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "extensions": {},
    }  # fmt: skip
    with trio.fail_after(3600):  # MockClock: BODY_TIMEOUT (60 s) passes at once
        await app(scope, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


async def test_every_status_a_route_answers_is_documented(autojump_clock) -> None:
    """Probe every documented route as a newcomer would (no key, a wrong key, a bad path
    value, a body over the limit, malformed or never finished, Redis down): the status of
    each answer is one the document lists for that route. The admin API's page routes
    (``/admin/api/``) were left out and answered an undocumented 503 with Redis down,
    ``/admin`` an undocumented 308, and ``POST .../jobs`` and ``.../status`` an
    undocumented 408 for a body that never finished."""
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
        "body never finished": await _slow_body_statuses(doc),
    }
    missing = [
        f"{why}: {method.upper()} {path} answered {status}, documented {sorted(listed)}"
        for why, got in cases.items()
        for (path, method), (status, listed) in got.items()
        if str(status) not in listed
    ]
    assert missing == [], "\n".join(missing)


@contextlib.asynccontextmanager
async def _document_and_client() -> AsyncIterator[tuple[dict[str, Any], Any]]:
    """The served document and a test client of the same app (one key: ``KEY``)."""
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        yield await (await client.get("/openapi.json")).get_json(), client


def _probed(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(path, method, url, operation) of every documented route but the event stream."""
    return [
        (path, method, path.replace("{user_id}", "alice").replace("{job_id}", "job-1"), op)
        for path, ops in doc["paths"].items()
        if not path.endswith("/events")
        for method, op in ops.items()
    ]


async def test_every_auth_scheme_a_route_accepts_is_documented(autojump_clock) -> None:
    """Present the API key in each scheme the document defines (bearer; HTTP Basic's
    password): a route that takes it (no 401) must list the scheme in its ``security``,
    and a route that lists it must take it. /v1 took Basic, documented bearer only."""
    basic = "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()
    headers = {"bearer": f"Bearer {KEY}", "basic": basic}
    wrong = []
    async with _document_and_client() as (doc, client):
        assert set(doc["components"]["securitySchemes"]) == set(headers)
        for path, method, url, op in _probed(doc):
            if not op.get("security"):
                continue  # open routes take no key at all
            listed = {name for req in op["security"] for name in req}
            for scheme, header in headers.items():
                data = b"{}" if "requestBody" in op else None
                r = await client.open(
                    url,
                    method=method.upper(),
                    headers={"Authorization": header, "Content-Type": "application/json"},
                    data=data,
                )
                if (r.status_code != 401) != (scheme in listed):
                    wrong.append(f"{method.upper()} {path}: {scheme} -> {r.status_code}, "
                                 f"documented {sorted(listed)}")  # fmt: skip
    assert wrong == [], "\n".join(wrong)


def _outside(schema: dict[str, Any]) -> list[str]:
    values = ["x", "1.5"]
    if "minimum" in schema:
        values.append(str(schema["minimum"] - 1))
    if "maximum" in schema:
        values.append(str(schema["maximum"] + 1))
    return values


def _inside(schema: dict[str, Any]) -> list[str]:
    return [str(schema[b]) for b in ("minimum", "maximum", "default") if b in schema]


async def test_every_query_parameter_a_route_reads_is_documented_with_its_bounds(
    autojump_clock,
) -> None:
    """Probe every GET route with every query parameter the document names anywhere, at
    values outside its documented bounds and at them: a route that refuses a value (400)
    must document the parameter, its bounds and the 400; one that documents it must refuse
    exactly the values outside. /admin/api/desktops read offset and limit undocumented."""
    wrong = []
    async with _document_and_client() as (doc, client):
        known: dict[str, dict[str, Any]] = {}
        for ops in doc["paths"].values():
            for op in ops.values():
                for p in op.get("parameters", []):
                    if p["in"] == "query":
                        known.setdefault(p["name"], p["schema"])
        assert known, "the document names no query parameter"
        auth = {"Authorization": f"Bearer {KEY}"}
        for path, method, url, op in _probed(doc):
            if method != "get":
                continue
            documented = {p["name"]: p["schema"] for p in op.get("parameters", [])
                          if p["in"] == "query"}  # fmt: skip
            for name, schema in known.items():
                schema = documented.get(name, schema)
                for value in _outside(schema):
                    r = await client.get(f"{url}?{name}={value}", headers=auth)
                    refused = r.status_code == 400
                    undocumented_400 = refused and "400" not in op["responses"]
                    if refused != (name in documented) or undocumented_400:
                        wrong.append(f"GET {path}?{name}={value} -> {r.status_code}, "
                                     f"documented {sorted(documented)}")  # fmt: skip
                for value in _inside(schema):
                    r = await client.get(f"{url}?{name}={value}", headers=auth)
                    if r.status_code == 400:
                        wrong.append(f"GET {path}?{name}={value} (inside the bounds) -> 400")
    assert wrong == [], "\n".join(wrong)


def test_the_documented_patterns_are_the_rules_the_hub_applies() -> None:
    """Each string the API checks (path values, body fields) is documented with a
    ``pattern`` that accepts exactly what the hub accepts (they had none)."""
    from deskbridge_hub import _validate
    from deskbridge_hub._openapi import document

    doc = document("test")
    body = doc["components"]["schemas"]["JobRequest"]["properties"]
    path = {
        p["name"]: p["schema"]
        for route in ("/v1/jobs/{job_id}", "/v1/admin/users/{user_id}")
        for p in doc["paths"][route]["get"]["parameters"]
    }
    rules = {
        "user_id": (path["user_id"], _validate.validate_user_id),
        "job_id (path)": (path["job_id"], _validate.validate_job_id),
        "job_id": (body["job_id"], _validate.validate_job_id),
        "name": (body["name"], _validate.validate_tool_name),
        "idempotency_key": (body["idempotency_key"], _validate.validate_key),
    }
    samples = ["a", "echo", "a b", "é", "a/b", ".", "..", "...", "a%2f", "~$!", "a?b", ""]
    samples += ["k" * n for n in (64, 65, 128, 129, 200, 201)] + ["alice@x.example"]
    wrong = []
    for field, (schema, validator) in rules.items():
        for sample in samples:
            try:
                validator(sample)
                accepted = True
            except ValueError:
                accepted = False
            if bool(re.search(schema["pattern"], sample)) != accepted:
                wrong.append(f"{field}: {sample!r} hub {'accepts' if accepted else 'refuses'}")
    assert wrong == [], "\n".join(wrong)


def _body_errors(doc: dict[str, Any], path: str, method: str, status: int, body: Any) -> list[str]:
    """What is wrong with ``body`` against the schema ``doc`` gives for that answer."""
    import jsonschema
    import referencing
    from referencing.jsonschema import DRAFT202012

    registry = referencing.Registry().with_resource("urn:doc", DRAFT202012.create_resource(doc))
    response = doc["paths"][path][method]["responses"].get(str(status))
    if response is None:
        return [f"{status} is not documented"]
    pointer = "/".join(
        ["paths", path.replace("~", "~0").replace("/", "~1"), method, "responses", str(status)]
    )
    schema = {"$ref": f"urn:doc#/{pointer}/content/application~1json/schema"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [error.message for error in validator.iter_errors(body)]


async def test_the_refusals_bodies_match_their_documented_schemas(autojump_clock) -> None:
    """The body of each refusal a caller meets on ``POST .../jobs`` validates against the
    schema the document gives for its status. ``422 idempotency_key_reused`` and ``409
    job_id_in_use`` are error bodies (``{"error": ...}``, no ``status``: docs/outcomes.md),
    but the document gave both statuses the outcome schema only, whose ``status`` is
    required, so a client generated from it rejected the hub's own answers."""
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=(KEY,)), substrate=substrate)
    route = "/v1/users/{user_id}/jobs"
    async with app.test_app() as test_app:
        client = test_app.test_client()
        doc = await (await client.get("/openapi.json")).get_json()
        await substrate.set_presence("alice", "sess-1", 3600.0)  # online; nobody reads jobs

        async def post(body: dict[str, Any], user: str = "alice") -> tuple[int, Any]:
            r = await client.post(
                f"/v1/users/{user}/jobs", json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            return r.status_code, await r.get_json()

        first = {"name": "echo", "args": {"a": 1}, "idempotency_key": "k1", "job_id": "j1"}
        answers = {
            "timeout": await post({**first, "timeout_s": 1}),
            "idempotency_key_reused": await post({**first, "args": {"a": 2}, "job_id": "j2"}),
            "job_id_in_use": await post({"name": "echo", "args": {}, "job_id": "j1"}),
            "offline": await post({"name": "echo", "args": {}}, user="bob"),
            "bad_request": await post({"name": "echo", "args": []}),
        }
    assert {why: status for why, (status, _) in answers.items()} == {
        "timeout": 504,
        "idempotency_key_reused": 422,
        "job_id_in_use": 409,
        "offline": 503,
        "bad_request": 400,
    }
    wrong = {
        why: errors
        for why, (status, body) in answers.items()
        if (errors := _body_errors(doc, route, "post", status, body))
    }
    assert wrong == {}
