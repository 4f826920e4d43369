"""HTTP: the catalogue endpoint, DELETE /v1/jobs/{job_id}, caller-chosen job ids."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from deskbridge_common import (
    Cancel,
    Hello,
    Job,
    JobError,
    JobResult,
    ToolSpec,
    Welcome,
    decode_frame,
    encode_frame,
)
from deskbridge_hub import issue_token

from tests.hub.test_http_api import AUTH, SECRET, post_job, running_hub

SCHEMA = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}


async def _connect(client, user="u1", tools=()):
    token = issue_token(SECRET, user, lifetime_s=3600)
    ws = client.websocket("/v1/sidecar", headers={"Authorization": f"Bearer {token}"})
    conn = await ws.__aenter__()
    await conn.send(encode_frame(Hello(1, "test", tuple(tools))))
    assert isinstance(decode_frame(await conn.receive()), Welcome)
    return ws, conn


async def test_tools_endpoint_lists_the_catalogue_and_the_hub_enforces_it(autojump_clock):
    async with running_hub() as (client, sub):
        r = await client.get("/v1/users/u1/tools", headers=AUTH)
        assert (await r.get_json()) == {"user_id": "u1", "online": False, "tools": None}
        ws, conn = await _connect(client, tools=[ToolSpec("wait", "waits", SCHEMA, False)])
        r = await client.get("/v1/users/u1/tools", headers=AUTH)
        body = await r.get_json()
        assert body["online"] is True
        assert body["tools"] == [
            {"name": "wait", "description": "waits", "args_schema": SCHEMA, "side_effects": False}
        ]
        r = await post_job(client, {"name": "nope", "args": {}})
        assert r.status_code == 400 and (await r.get_json())["error"]["field"] == "name"
        r = await post_job(client, {"name": "wait", "args": {"seconds": "soon"}})
        err = (await r.get_json())["error"]
        assert r.status_code == 400 and err["field"] == "args" and "seconds" in err["message"]
        assert sub.entries("u1") == 0
        await ws.__aexit__(None, None, None)


async def test_delete_cancels_a_running_job_by_its_caller_chosen_id(autojump_clock):
    async with running_hub() as (client, sub):
        ws, conn = await _connect(client)
        answers = {}

        async def caller():
            r = await post_job(client, {"name": "click", "args": {}, "job_id": "order-7"})
            answers["r"] = (r.status_code, await r.get_json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            job = decode_frame(await conn.receive())
            assert isinstance(job, Job) and job.job_id == "order-7"
            r = await client.delete("/v1/jobs/order-7", headers=AUTH)
            assert r.status_code == 202
            assert (await r.get_json())["stage"] == "delivered"
            cancel = decode_frame(await conn.receive())
            assert cancel == Cancel(id=job.id)
            await conn.send(
                encode_frame(JobResult(job.id, False, error=JobError("cancelled", "ok")))
            )
        status, body = answers["r"]
        assert status == 409 and body["status"] == "cancelled" and body["job_id"] == "order-7"
        r = await client.delete("/v1/jobs/never-was", headers=AUTH)
        assert r.status_code == 404
        r = await client.delete("/v1/jobs/order-7", headers={})
        assert r.status_code == 401
        await ws.__aexit__(None, None, None)
        assert json.dumps(body)  # the body is plain JSON


async def test_livez_does_not_touch_redis(autojump_clock):
    async with running_hub() as (client, sub):
        sub.inner.set_unavailable(True)
        r = await client.get("/livez")
        assert r.status_code == 200 and (await r.get_json()) == {"ok": True, "draining": False}
        assert (await client.get("/healthz")).status_code == 503


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--bind", "127.0.0.1"], {}, "HOST:PORT"),
        (["--bind", "127.0.0.1:99999"], {}, "HOST:PORT"),
        # a newcomer's URL where HOST:PORT goes: "host 'http://127.0.0.1' does not resolve"
        (["--bind", "http://127.0.0.1:8080"], {}, "expected HOST:PORT, not a URL"),
        (["--bind", "ws://0.0.0.0:8080"], {}, "expected HOST:PORT, not a URL"),
        (["--certfile", "/etc/hostname"], {}, "--certfile and --keyfile go together"),
        ([], {"DESKBRIDGE_REDIS_URL": "notaurl"}, "DESKBRIDGE_REDIS_URL must look like"),
        # a newcomer's typos: Hypercorn's lifespan printed a traceback for these, and
        # coredis silently used database 0 for a DB that is not a number
        ([], {"DESKBRIDGE_REDIS_URL": "redis://127.0.0.1:notaport/0"}, "port 'notaport'"),
        ([], {"DESKBRIDGE_REDIS_URL": "redis://127.0.0.1:99999/0"}, "port '99999'"),
        ([], {"DESKBRIDGE_REDIS_URL": "redis://[::1/0"}, "Invalid IPv6 URL"),
        ([], {"DESKBRIDGE_REDIS_URL": "redis://127.0.0.1:6379/zero"}, "database 'zero'"),
        ([], {"DESKBRIDGE_REDIS_URL": "redis+cluster://a:7000,b:x/0"}, "port 'x'"),
        (["--graceful-timeout-s", "-1"], {}, "--graceful-timeout-s"),
    ],
)
def test_serve_usage_errors_exit_2_with_a_message(monkeypatch, capsys, argv, env, message):
    from deskbridge_hub import cli

    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 40)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://redis",
        "redis://:s3cr%2Ft@host:6379/3",
        "redis://user:pa:ss@host:6379/",
        "redis://[::1]:6379/0",
        "rediss://:pw@redis.internal:6380/0?ssl_cert_reqs=required",
        "unix:///run/redis.sock",
        "redis+cluster://a:7000,b:7001,[::1]:7002/0",
    ],
)
def test_serve_accepts_well_formed_redis_urls(url):
    from deskbridge_hub._config import HubConfig, redis_url_problem

    assert redis_url_problem(url) is None
    assert HubConfig.from_env({"DESKBRIDGE_REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:notaport/0", "port 'notaport'"),
        ("redis://127.0.0.1:6379/zero", "database 'zero'"),
        ("bogus://host", "must look like redis://HOST:PORT/DB"),
        ("redis://[::1/0", "Invalid IPv6 URL"),
    ],
)
def test_the_bare_asgi_entry_refuses_a_malformed_redis_url_in_one_line(capsys, url, message):
    # ``hypercorn deskbridge_hub.asgi:app`` checks at import what ``serve`` checks: it
    # printed a lifespan traceback (and exited 0) for these, and served bogus://.
    from deskbridge_hub._startup import load_config

    with pytest.raises(SystemExit) as exited:
        load_config({"DESKBRIDGE_REDIS_URL": url, "DESKBRIDGE_SECRET": "s" * 32})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("deskbridge-hub: DESKBRIDGE_REDIS_URL")
    assert url not in err  # a URL may carry a password


async def test_unavailable_after_the_job_was_enqueued_names_the_job(autojump_clock):
    # Redis going away while a call waited was answered like a call that enqueued
    # nothing ({"status": "unavailable", "error"}: no job_id), though the job was queued
    # and may run; the caller could neither look it up nor cancel it
    async with running_hub() as (client, sub):
        ws, conn = await _connect(client)
        answers = {}
        answered = trio.Event()

        async def caller():
            r = await post_job(client, {"name": "click", "args": {}, "timeout_s": 30})
            answers["r"] = (r.status_code, await r.get_json())
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            job = decode_frame(await conn.receive())
            assert isinstance(job, Job)
            sub.inner.set_unavailable(True)
            with trio.fail_after(60):
                await answered.wait()
        status, body = answers["r"]
        assert status == 503 and body["status"] == "unavailable", body
        assert body["job_id"] == job.job_id and body["detail"] == {"stage": "unknown"}
        sub.inner.set_unavailable(False)
        await ws.__aexit__(None, None, None)
