"""Every 401 the hub answers carries ``WWW-Authenticate`` (RFC 9110 15.5.2: a 401 MUST).

Only the MCP endpoint and the connectors page sent one; the HTTP API's 401s (the job
route, presence, status, the admin API, ``/metrics``, a job's events) and the sidecar
handshake's (a missing, expired or revoked token) had none, so a client could not learn
from the answer which scheme to use. The API routes and the handshake ask for
``Bearer``; ``/admin/`` (a browser page) keeps ``Basic``, so the browser asks once.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from deskbridge_common import Hello, encode_frame
from deskbridge_hub import HubConfig, create_app, issue_token
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._revocation import revoke_user
from quart.testing.connections import WebsocketResponseError

SECRET = "www-authenticate-test-secret-0123456789abcdef"
AUTH = {"Authorization": "Bearer k1"}


def _app(substrate: MemorySubstrate | None = None) -> Any:
    config = HubConfig(secrets=(SECRET,), api_keys=("k1",))
    return create_app(config, substrate=substrate or MemorySubstrate())


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/users/u1/jobs"),
        ("GET", "/v1/users/u1/presence"),
        ("POST", "/v1/users/u1/status"),
        ("GET", "/v1/users/u1/tools"),
        ("GET", "/v1/jobs/j1"),
        ("DELETE", "/v1/jobs/j1"),
        ("GET", "/v1/jobs/j1/events"),
        ("GET", "/v1/admin/desktops"),
        ("GET", "/v1/admin/users/u1"),
        ("GET", "/metrics"),
    ],
)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
async def test_an_api_401_asks_for_a_bearer_key(autojump_clock, method, path, headers):
    async with _app().test_app() as test_app:
        client = test_app.test_client()
        body = json.dumps({"name": "echo"}).encode()
        r = await client.open(
            path,
            method=method,
            headers={**headers, "Content-Type": "application/json"},
            data=body,
        )
        assert r.status_code == 401, (method, path)
        assert (await r.get_json())["error"]["code"] == "unauthorized"
        assert r.headers.get("WWW-Authenticate") == "Bearer", (method, path)


async def test_the_connectors_page_still_asks_for_basic(autojump_clock):
    async with _app().test_app() as test_app:
        r = await test_app.test_client().get("/admin/")
        assert r.status_code == 401
        assert r.headers.get("WWW-Authenticate") == 'Basic realm="deskbridge admin"'


async def _refused_upgrade(client: Any, headers: dict[str, str]) -> Any:
    """The HTTP response refusing the sidecar's upgrade (the test fails on a 101)."""
    async with client.websocket("/v1/sidecar", headers=headers) as ws:
        try:
            await ws.send(encode_frame(Hello(protocol_version=1, sidecar_version="t")))
            await ws.receive()
        except WebsocketResponseError as exc:
            return exc.response
    raise AssertionError("the upgrade was accepted")


async def test_a_sidecar_handshake_401_asks_for_a_bearer_token(autojump_clock):
    substrate = MemorySubstrate()
    async with _app(substrate).test_app() as test_app:
        client = test_app.test_client()
        expired = issue_token(SECRET, "alice", lifetime_s=60, now=time.time() - 3600)
        await revoke_user(substrate, "bob", now_s=time.time())
        revoked = issue_token(SECRET, "bob", now=time.time() - 60)
        for headers in (
            {},  # missing
            {"Authorization": f"Bearer {expired}"},
            {"Authorization": f"Bearer {revoked}"},
        ):
            response = await _refused_upgrade(client, headers)
            assert response.status_code == 401, headers
            assert response.headers.get("WWW-Authenticate") == "Bearer", headers
        # a forged or malformed token is 403 (a credential was given and is refused
        # for good): no challenge, as RFC 9110 15.5.4 has none for 403
        response = await _refused_upgrade(client, {"Authorization": "Bearer garbage"})
        assert response.status_code == 403 and "WWW-Authenticate" not in response.headers


async def test_the_openapi_document_lists_the_challenge_on_every_401(autojump_clock):
    async with _app().test_app() as test_app:
        doc = await (await test_app.test_client().get("/openapi.json")).get_json()
    answers = [
        (path, method, op["responses"]["401"])
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if "401" in op["responses"]
    ]
    assert len(answers) > 10
    for path, method, answer in answers:
        scheme = answer["headers"]["WWW-Authenticate"]["schema"]["const"]
        expected = "Basic" if path.startswith("/admin") else "Bearer"
        assert scheme.split()[0] == expected, (method, path)
