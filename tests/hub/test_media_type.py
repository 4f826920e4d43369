"""A JSON body route refuses a body whose ``Content-Type`` is present and not JSON with
415 ``unsupported_media_type`` naming the expected type, before it parses anything; a
body without ``Content-Type`` is read as JSON (scripts that send none keep working).

Was: ``POST /v1/users/{id}/jobs`` with ``text/plain`` (or curl's default form type,
which the README's example sent) ran the job."""

from __future__ import annotations

import pytest

from tests.hub.test_http_api import AUTH, ONLINE, running_hub

JOB = b'{"name": "echo", "args": {}, "timeout_s": 1}'
#: a body that would echo its caller's job id if it were read (it is not: 415)
CHOSEN = b'{"name": "echo", "args": {}, "timeout_s": 1, "job_id": "mine-1"}'


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
@pytest.mark.parametrize("route", ["jobs", "status"])
async def test_a_body_of_another_media_type_is_415_naming_the_expected_one(
    autojump_clock, content_type, route
):
    body = CHOSEN if route == "jobs" else b"{}"
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        sub.calls.clear()
        r = await client.post(
            f"/v1/users/{ONLINE}/{route}",
            data=body,
            headers={**AUTH, "Content-Type": content_type},
        )
        assert r.status_code == 415, await r.get_data(as_text=True)
        answer = await r.get_json()
        assert "job_id" not in answer  # the body was not read, as a 413's is not
        error = answer["error"]
        assert error["code"] == "unsupported_media_type"
        assert "application/json" in error["message"]
        assert content_type.split(";")[0] in error["message"]
        assert sub.writes() == []


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "application/json; charset=utf-8", "Application/JSON",
     "application/vnd.example+json"],
)
async def test_json_or_no_content_type_is_read_as_json(autojump_clock, content_type):
    headers = dict(AUTH) if content_type is None else {**AUTH, "Content-Type": content_type}
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        r = await client.post(f"/v1/users/{ONLINE}/jobs", data=JOB, headers=headers)
        assert r.status_code == 504, await r.get_data(as_text=True)  # enqueued, no desktop
        assert sub.entries(ONLINE) == 1


async def test_an_empty_status_body_is_not_refused_for_its_type(autojump_clock):
    """``curl -X POST -d ''`` sends the form type with no body: there is nothing to read."""
    async with running_hub() as (client, sub):
        r = await client.post(
            f"/v1/users/{ONLINE}/status",
            data=b"",
            headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code != 415, await r.get_data(as_text=True)
