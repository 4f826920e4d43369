"""A browser on another site cannot use the API key a browser holds (CSRF).

The connectors page is authenticated with HTTP Basic, which a browser caches and then
attaches by itself: after ``/admin`` (its challenge covers the whole origin: the
directory of ``/admin`` is ``/``), a hostile page the operator visits could submit a
``text/plain`` form whose body is valid JSON (``{"name":"files_write","args":{"content":
"=..."}}``) to ``POST /v1/users/{id}/jobs`` and run any tool on any desktop. Requests a
browser marks as cross-site (``Sec-Fetch-Site``) or from another ``Origin`` are refused
on every route behind the key, before the key or the body is read."""

from __future__ import annotations

import base64
import json

import pytest

from tests.hub.test_http_api import ONLINE, running_hub

BASIC = {"Authorization": "Basic " + base64.b64encode(b"operator:k1").decode()}
#: What a browser sends with a form or fetch from a page of another site.
CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.test"},
    {"Sec-Fetch-Site": "same-site", "Origin": "http://evil.localhost"},
    {"Origin": "http://evil.test"},  # a browser without Fetch Metadata
    {"Origin": "null"},  # a sandboxed frame, a data: page
]
FORM_BODY = b'{"name":"echo","args":{"csrf":"="},"timeout_s":1}'


@pytest.mark.parametrize("headers", CROSS_SITE)
async def test_a_cross_site_form_post_enqueues_nothing(autojump_clock, headers):
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        sub.calls.clear()
        r = await client.post(
            f"/v1/users/{ONLINE}/jobs",
            data=FORM_BODY,
            headers={**BASIC, "Content-Type": "text/plain", **headers},
        )
        assert r.status_code == 403, await r.get_data(as_text=True)
        assert (await r.get_json())["error"]["code"] == "cross_site_request"
        assert sub.entries(ONLINE) == 0 and sub.writes() == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/api/desktops"),
        ("GET", "/v1/admin/desktops"),
        ("GET", f"/v1/users/{ONLINE}/presence"),
        ("GET", f"/v1/users/{ONLINE}/tools"),
        ("DELETE", "/v1/jobs/x~u1"),
        ("POST", f"/v1/users/{ONLINE}/mcp"),
        ("GET", "/metrics"),
        ("GET", "/admin/"),
    ],
)
async def test_every_route_behind_the_key_refuses_cross_site(autojump_clock, method, path):
    async with running_hub() as (client, _):
        headers = {**BASIC, **CROSS_SITE[0]}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
        r = await client.open(path, method=method, headers=headers, data=body)
        assert r.status_code == 403, (path, r.status_code)


async def test_api_clients_and_the_page_itself_still_work(autojump_clock):
    async with running_hub() as (client, _):
        for headers in ({}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
            r = await client.get("/admin/api/desktops", headers={**BASIC, **headers})
            assert r.status_code == 200, (headers, r.status_code)
        same = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers={**BASIC, **same})
        assert r.status_code == 200
        link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}  # a link to it
        r = await client.get("/admin/", headers={**BASIC, **link})
        assert r.status_code == 200
        r = await client.get("/livez", headers=CROSS_SITE[0])  # no key needed: not refused
        assert r.status_code == 200


async def test_without_a_key_only_loopback_host_names_are_served(autojump_clock):
    """DNS rebinding: with no API key (a loopback hub), a page of ``rebind.evil.test``
    whose name now resolves to 127.0.0.1 is same-origin to the browser (no Fetch Metadata
    says otherwise) and could dispatch jobs. Without a key only loopback names are served."""
    async with running_hub(api_keys=()) as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        sub.calls.clear()
        rebound = {"Host": "rebind.evil.test:8080", "Origin": "http://rebind.evil.test:8080"}
        r = await client.post(
            f"/v1/users/{ONLINE}/jobs",
            data=FORM_BODY,
            headers={"Content-Type": "text/plain", "Sec-Fetch-Site": "same-origin", **rebound},
        )
        assert r.status_code == 403, await r.get_data(as_text=True)
        assert sub.entries(ONLINE) == 0
        for host in ("127.0.0.1:8080", "localhost", "[::1]:8080", "localhost."):
            r = await client.get(f"/v1/users/{ONLINE}/presence", headers={"Host": host})
            assert r.status_code == 200, host
    async with running_hub() as (client, _):  # with a key, any host name (a real domain)
        r = await client.get(
            f"/v1/users/{ONLINE}/presence", headers={"Host": "hub.example.com", **BASIC}
        )
        assert r.status_code == 200


# -- job ids: one id, one job (security review) ------------------------------------------


async def test_a_chosen_job_id_in_the_hubs_own_form_for_another_user_is_refused(autojump_clock):
    """Hub-minted ids are ``<32 hex>~<user>`` and have no owner record (their user is in
    the id). A caller choosing another user's minted id got a second live job under it:
    reproduced with real processes, alice's caller (``sleep 5``) was answered bob's
    result (``slept_s: 2``), and progress, events, look-ups and cancels by that id mix the
    two users' jobs."""
    async with running_hub() as (client, sub):
        await sub.inner.set_presence("u2", "sess-2", 3600.0)
        sub.calls.clear()
        minted_for_u1 = f"{'0123456789abcdef' * 2}~{ONLINE}"
        r = await client.post(
            "/v1/users/u2/jobs",
            data=json.dumps({"name": "echo", "args": {}, "job_id": minted_for_u1, "timeout_s": 1}),
            headers={"Authorization": "Bearer k1", "Content-Type": "application/json"},
        )
        assert r.status_code == 400, await r.get_data(as_text=True)
        assert (await r.get_json())["error"]["field"] == "job_id"
        assert sub.entries("u2") == 0
        # its own user's form, and ids that merely hold a ~, stay usable
        for job_id in ("order~42", f"{'0123456789abcdef' * 2}~u2", "a~u1"):
            r = await client.post(
                "/v1/users/u2/jobs",
                data=json.dumps({"name": "echo", "args": {}, "job_id": job_id, "timeout_s": 1}),
                headers={"Authorization": "Bearer k1", "Content-Type": "application/json"},
            )
            assert r.status_code != 400, (job_id, await r.get_data(as_text=True))
