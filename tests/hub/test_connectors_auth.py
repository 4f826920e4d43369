"""The connectors page takes the API key as a bearer token or as the password of HTTP
Basic (what a browser sends); without it, 401 with a Basic challenge."""

from __future__ import annotations

import base64

import pytest
from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture
async def client(autojump_clock):
    app = create_app(HubConfig(secrets=("s" * 40,), api_keys=("k1",)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        yield test_app.test_client()


async def test_page_needs_the_key(client) -> None:
    r = await client.get("/admin/")
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == 'Basic realm="deskbridge admin"'
    for headers in (basic("admin", "nope"), basic("k1", ""), {"Authorization": "Basic !!"}):
        assert (await client.get("/admin/", headers=headers)).status_code == 401
    r = await client.get("/admin/", headers=basic("anyone", "k1"))
    assert r.status_code == 200 and r.content_type.startswith("text/html")
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    html = await r.get_data(as_text=True)
    assert '<script src="connectors.js"></script>' in html and "http" not in html.lower()
    r = await client.get("/admin/connectors.js", headers={"Authorization": "Bearer k1"})
    assert r.status_code == 200 and "/admin/api/desktops" in await r.get_data(as_text=True)
    r = await client.get("/admin", headers=basic("x", "k1"))
    assert r.status_code == 308 and r.headers["Location"].endswith("/admin/")
    # Basic works for the API too (the page's fetches), and 401s outside /admin have
    # no browser challenge: they ask for Bearer, which no browser prompts for.
    assert (await client.get("/v1/admin/desktops", headers=basic("x", "k1"))).status_code == 200
    r = await client.get("/v1/admin/desktops")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
