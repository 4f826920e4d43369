"""The hub's HTTP API and the sidecar WebSocket handshake, in process.

The app runs through its lifespan (``app.test_app()``, quart-trio's TrioTestApp) on a
``MemorySubstrate``; requests go through Quart's test client, so the whole ASGI stack
(before_request, error handlers, routing) is exercised with no socket. Every test runs
on trio's ``MockClock`` with autojump: a job that somebody forgot to refuse would wait
out its timeout in virtual time and fail the status assertion, not hang the suite.

"Nothing was enqueued" is checked on the substrate itself: every call that reaches it is
recorded (``RecordingSubstrate``) and stream entries are counted directly.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_common import Hello, Job, JobResult, Ping, Pong, Welcome, decode_frame, encode_frame
from deskbridge_hub import HubConfig, create_app, issue_token
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._substrate import Asleep
from deskbridge_hub._tokens import key_id
from quart.testing.connections import WebsocketDisconnectError, WebsocketResponseError

SECRET = "http-api-test-secret-0123456789abcdef0123"
OTHER_SECRET = "an-attackers-secret-0123456789abcdef01234"
API_KEYS = ("k1", "k2")
AUTH = {"Authorization": "Bearer k1"}
ONLINE = "u1"  # has presence in every test that asks for it
MAX_ARGS_BYTES = 256 * 1024


class RecordingSubstrate:
    """Delegates to a MemorySubstrate and records the name of every async call."""

    def __init__(self, inner: MemorySubstrate | None = None) -> None:
        self.inner = inner or MemorySubstrate()
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        if name in (
            "wait_wakes",
            "heartbeat",
            "set_liveness",
            "clear_liveness",
        ):  # the process reader
            return attr

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await attr(*args, **kwargs)

        return recorded

    def entries(self, user_id: str) -> int:
        """Stream entries for ``user_id`` (read or not): what ``enqueue`` added."""
        stream = self.inner._streams.get(user_id)
        return 0 if stream is None else len(stream.entries)

    def writes(self) -> list[str]:
        reads = {
            "get_presence",
            "get_asleep",
            "ping",
            "aclose",
            "wait_result",
            "get_result",
            "get_catalogue",
            "get_job_state",
            "job_owner",
            "read_notifications",
        }
        return [c for c in self.calls if c not in reads]


@contextlib.asynccontextmanager
async def running_hub(
    substrate: RecordingSubstrate | None = None, **config: Any
) -> AsyncIterator[tuple[Any, RecordingSubstrate]]:
    substrate = substrate or RecordingSubstrate()
    settings = {"secrets": (SECRET,), "api_keys": API_KEYS, **config}
    app = create_app(HubConfig(**settings), substrate=substrate)  # type: ignore[arg-type]
    async with app.test_app() as test_app:
        yield test_app.test_client(), substrate


async def post_job(client: Any, body: Any, user: str = ONLINE, headers=None) -> Any:
    """POST raw bytes (so the test controls every byte of the body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(
        f"/v1/users/{user}/jobs",
        data=data,
        headers={**AUTH, "Content-Type": "application/json", **(headers or {})},
    )


# -- health and API keys -----------------------------------------------------------------


async def test_healthz_needs_no_key_and_reports_the_substrate(autojump_clock):
    async with running_hub() as (client, sub):
        r = await client.get("/healthz")
        assert r.status_code == 200
        body = await r.get_json()
        assert body["ok"] is True and body["substrate"] == "ok"
        sub.inner.set_unavailable(True)
        r = await client.get("/healthz")
        assert r.status_code == 503
        assert (await r.get_json())["substrate"] == "unavailable"


async def test_healthz_is_not_ready_while_the_replica_refuses_every_call(autojump_clock):
    """A draining replica answers every call ``503 draining`` and ``/livez`` says so;
    ``/healthz`` (readiness) said ``{"ok": true}``, so a load balancer checking it kept
    sending calls to a replica that refuses them all."""
    config = HubConfig(secrets=(SECRET,), api_keys=API_KEYS)
    app = create_app(config, substrate=RecordingSubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        app.extensions["deskbridge"]["state"].drain.active = True
        call = await post_job(client, {"name": "echo"})
        assert call.status_code == 503 and (await call.get_json())["error"]["code"] == "draining"
        assert (await client.get("/livez")).status_code == 503
        r = await client.get("/healthz")
        body = await r.get_json()
        assert r.status_code == 503 and body["ok"] is False and body["draining"] is True, body
        assert body["substrate"] == "ok"  # Redis itself is fine: the reason is the drain


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer k1k2"},
        {"Authorization": "Bearer k"},
        {"Authorization": "Basic k1"},
        {"Authorization": "k1"},
        {"Authorization": "Bearer K1"},
    ],
)
async def test_missing_or_wrong_api_key_is_401(autojump_clock, headers):
    async with running_hub() as (client, sub):
        for method, path in [
            ("GET", f"/v1/users/{ONLINE}/presence"),
            ("POST", f"/v1/users/{ONLINE}/jobs"),
            ("POST", f"/v1/users/{ONLINE}/status"),
        ]:
            r = await client.open(path, method=method, headers=headers, json={"name": "echo"})
            assert r.status_code == 401, (method, path)
            assert (await r.get_json())["error"]["code"] == "unauthorized"
        assert sub.calls == []  # refused before touching the substrate


@pytest.mark.parametrize("key", API_KEYS)
async def test_every_listed_key_is_accepted_rotation(autojump_clock, key):
    async with running_hub() as (client, _):
        for scheme in ("Bearer", "bearer"):
            r = await client.get(
                f"/v1/users/{ONLINE}/presence", headers={"Authorization": f"{scheme} {key}"}
            )
            assert r.status_code == 200


async def test_api_key_is_checked_before_the_body(autojump_clock):
    """A caller without a key learns nothing about validation (401, not 400)."""
    async with running_hub() as (client, _):
        r = await post_job(client, b"{not json", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401


async def test_no_keys_configured_leaves_the_api_open(autojump_clock):
    """Loopback-only mode (the CLI refuses non-loopback binds without a key)."""
    async with running_hub(api_keys=()) as (client, _):
        r = await client.get(f"/v1/users/{ONLINE}/presence")
        assert r.status_code == 200


# -- presence ----------------------------------------------------------------------------


async def test_presence_offline_then_online(autojump_clock):
    async with running_hub() as (client, sub):
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert r.status_code == 200
        assert await r.get_json() == {
            "user_id": ONLINE, "online": False, "session_id": None, "status": "offline"
        }  # fmt: skip
        await sub.inner.set_presence(ONLINE, "sess-1", 30.0)
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert await r.get_json() == {
            "user_id": ONLINE, "online": True, "session_id": "sess-1", "status": "online"
        }  # fmt: skip
        await trio.sleep(30.0)  # the TTL passes: offline again, on every replica alike
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert (await r.get_json())["online"] is False


async def test_an_asleep_desktop_reads_asleep_and_its_calls_say_why(autojump_clock):
    """Issue 12.6: the presence status and the offline answer's reason (status and HTTP
    code stay offline / 503: docs/outcomes.md, "Asleep")."""
    async with running_hub() as (client, sub):
        await sub.inner.set_asleep(ONLINE, Asleep(1_700_000_000.5, "announced"), ttl_s=60)
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert await r.get_json() == {
            "user_id": ONLINE, "online": False, "session_id": None, "status": "asleep",
            "since": 1_700_000_000.5,
        }  # fmt: skip
        r = await post_job(client, {"name": "echo", "args": {}})
        assert r.status_code == 503
        body = await r.get_json()
        assert body["status"] == "offline" and body["error"]["code"] == "offline"
        assert body["detail"] == {"reason": "asleep", "since": 1_700_000_000.5}
        assert "asleep (since 2023-11-14T22:13:20Z)" in body["error"]["message"]
        await sub.inner.set_presence(ONLINE, "sess-1", 30.0)  # online wins over the record
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert (await r.get_json())["status"] == "online"


@pytest.mark.parametrize("user", ["a%20b", "a%7Bb%7D", "x" * 129, "%C3%A9"])
async def test_presence_of_a_bad_user_id_is_400(autojump_clock, user):
    async with running_hub() as (client, sub):
        r = await client.get(f"/v1/users/{user}/presence", headers=AUTH)
        assert r.status_code == 400
        assert (await r.get_json())["error"]["field"] == "user_id"
        assert sub.calls == []


# -- POST jobs: bad input ----------------------------------------------------------------

BAD_BODIES = [
    # (id, body bytes, field)
    ("not-json", b"{not json", "$"),
    ("empty-body", b"", "$"),
    ("not-utf8", b'{"name": "\xff\xfe"}', "$"),
    ("array-body", b'["echo"]', "$"),
    ("string-body", b'"echo"', "$"),
    ("null-body", b"null", "$"),
    ("number-body", b"42", "$"),
    ("deeply-nested-body", b'{"name":"echo","args":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "$"),
    ("missing-name", b'{"args": {}}', "name"),
    ("null-name", b'{"name": null}', "name"),
    ("name-int", b'{"name": 5}', "name"),
    ("name-list", b'{"name": ["echo"]}', "name"),
    ("name-object", b'{"name": {"echo": 1}}', "name"),
    ("name-bool", b'{"name": true}', "name"),
    ("name-empty", b'{"name": ""}', "name"),
    ("name-space", b'{"name": "rm -rf"}', "name"),
    ("name-slash", b'{"name": "../echo"}', "name"),
    ("name-brace", b'{"name": "echo}"}', "name"),
    ("name-newline", b'{"name": "echo\\n"}', "name"),
    ("name-unicode", b'{"name": "\\u00e9cho"}', "name"),
    ("name-too-long", json.dumps({"name": "e" * 65}).encode(), "name"),
    ("args-list", b'{"name": "echo", "args": [1]}', "args"),
    ("args-string", b'{"name": "echo", "args": "x=1"}', "args"),
    ("args-number", b'{"name": "echo", "args": 1}', "args"),
    ("args-bool", b'{"name": "echo", "args": false}', "args"),
    ("args-nan", b'{"name": "echo", "args": {"x": NaN}}', "$"),
    ("args-infinity", b'{"name": "echo", "args": {"x": -Infinity}}', "$"),
    ("args-overflowing-float", b'{"name": "echo", "args": {"x": 1e999}}', "$"),
    ("timeout-negative", b'{"name": "echo", "timeout_s": -1}', "timeout_s"),
    ("timeout-zero", b'{"name": "echo", "timeout_s": 0}', "timeout_s"),
    ("timeout-zero-float", b'{"name": "echo", "timeout_s": 0.0}', "timeout_s"),
    ("timeout-string", b'{"name": "echo", "timeout_s": "5"}', "timeout_s"),
    ("timeout-bool", b'{"name": "echo", "timeout_s": true}', "timeout_s"),
    ("timeout-list", b'{"name": "echo", "timeout_s": [5]}', "timeout_s"),
    ("timeout-nan", b'{"name": "echo", "timeout_s": NaN}', "$"),
    ("timeout-infinite", b'{"name": "echo", "timeout_s": 1e999}', "$"),
    ("timeout-huge-int", b'{"name": "echo", "timeout_s": 1' + b"0" * 400 + b"}", "timeout_s"),
    ("extra-field", b'{"name": "echo", "nmae": "echo"}', "nmae"),
    ("extra-field-user", b'{"name": "echo", "user_id": "someone-else"}', "user_id"),
    ("key-empty", b'{"name": "echo", "idempotency_key": ""}', "idempotency_key"),
    ("key-space", b'{"name": "echo", "idempotency_key": "a b"}', "idempotency_key"),
    ("key-int", b'{"name": "echo", "idempotency_key": 42}', "idempotency_key"),
    ("key-unicode", b'{"name": "echo", "idempotency_key": "cl\\u00e9"}', "idempotency_key"),
    ("key-control", b'{"name": "echo", "idempotency_key": "a\\u0000b"}', "idempotency_key"),
    ("key-too-long", json.dumps({"name": "echo", "idempotency_key": "k" * 201}).encode(),
     "idempotency_key"),
    ("job-id-space", b'{"name": "echo", "job_id": "my job"}', "job_id"),
    ("job-id-too-long", json.dumps({"name": "echo", "job_id": "j" * 201}).encode(), "job_id"),
    # a path segment: /v1/jobs/a/b matches no route, clients drop dot segments
    ("job-id-slash", b'{"name": "echo", "job_id": "a/b"}', "job_id"),
    ("job-id-dot", b'{"name": "echo", "job_id": "."}', "job_id"),
    ("job-id-dot-dot", b'{"name": "echo", "job_id": ".."}', "job_id"),
    ("job-id-query", b'{"name": "echo", "job_id": "a?b"}', "job_id"),
    ("job-id-fragment", b'{"name": "echo", "job_id": "a#b"}', "job_id"),
    ("job-id-percent", b'{"name": "echo", "job_id": "%2e%2e"}', "job_id"),
    # the same key twice: json keeps the last silently (a log keeping the first would
    # show another call than the one run); 400 naming the top-level field holding it
    ("duplicate-name", b'{"name": "echo", "name": "sleep", "args": {"seconds": 1}}', "name"),
    ("duplicate-args-key", b'{"name": "echo", "args": {"a": 1, "a": 2}}', "args"),
    ("duplicate-nested-key", b'{"name": "echo", "args": {"x": [{"b": 1, "b": 1}]}}', "args"),
    ("duplicate-timeout", b'{"name": "echo", "timeout_s": 5, "timeout_s": 500}', "timeout_s"),
    ("args-too-big", json.dumps({"name": "echo", "args": {"x": "a" * MAX_ARGS_BYTES}}).encode(),
     "args"),
    # a lone surrogate parses to a str UTF-8 cannot hold (was a 500 from the digest)
    ("lone-surrogate", b'{"name": "echo", "args": {"s": "\\ud800"}}', "args"),
    ("lone-surrogate-key", b'{"name": "echo", "args": {"\\udfff": 1}}', "args"),
    ("lone-surrogate-nested", b'{"name": "echo", "args": {"a": ["\\udc00x"]}}', "args"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
async def test_bad_job_body_is_400_naming_the_field_and_enqueues_nothing(
    autojump_clock, body, field
):
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)  # a slip would enqueue
        sub.calls.clear()
        started = trio.current_time()
        r = await post_job(client, body)
        assert r.status_code == 400, await r.get_data(as_text=True)
        assert trio.current_time() == started  # refused at once, nothing awaited
        error = (await r.get_json())["error"]
        assert error["code"] == "bad_request"
        assert error["field"] == field
        assert error["message"]
        if field in ("job_id", "idempotency_key"):  # one rule, each message names its own
            assert error["message"].startswith(f"{field} must be"), error["message"]
        assert sub.entries(ONLINE) == 0
        assert sub.writes() == []


@pytest.mark.parametrize(
    "user", ["a%20b", "a%7Bb%7D", "a:b%2A", "%00", "x" * 129, "%C3%A9l%C3%A8ve", "a%0Ab"]
)
async def test_bad_user_id_in_the_path_is_400_and_enqueues_nothing(autojump_clock, user):
    async with running_hub() as (client, sub):
        r = await post_job(client, {"name": "echo", "args": {}}, user=user)
        assert r.status_code == 400
        assert (await r.get_json())["error"]["field"] == "user_id"
        assert sub.calls == []


async def test_longest_valid_user_id_is_accepted(autojump_clock):
    async with running_hub() as (client, sub):
        r = await post_job(client, {"name": "echo"}, user="x" * 128)
        assert r.status_code == 503 and (await r.get_json())["status"] == "offline"


async def test_args_size_limit_is_exact_and_configurable(autojump_clock):
    """``max_args_bytes`` (DESKBRIDGE_MAX_ARGS_BYTES) bounds the args' compact JSON
    (non-ASCII escaped: what goes on the stream)."""
    limit = 64
    async with running_hub(max_args_bytes=limit) as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        at_limit = {"x": "\u00e9" + "a" * (limit - len('{"x":""}') - 6)}
        assert len(json.dumps(at_limit, separators=(",", ":"))) == limit
        over = {"x": at_limit["x"] + "a"}

        r = await post_job(client, {"name": "echo", "args": over, "timeout_s": 1})
        assert r.status_code == 400 and (await r.get_json())["error"]["field"] == "args"
        assert sub.entries(ONLINE) == 0

        r = await post_job(client, {"name": "echo", "args": at_limit, "timeout_s": 1})
        assert sub.entries(ONLINE) == 1  # accepted and enqueued; no sidecar answers
        assert r.status_code == 504 and (await r.get_json())["status"] == "timeout"


async def test_timeout_s_is_capped_at_24_hours(autojump_clock):
    """A giant timeout would push the BLPOP timeout out of Redis's range (a 500) and
    keep a job deliverable for ever."""
    async with running_hub() as (client, sub):
        r = await post_job(client, {"name": "echo", "timeout_s": 86400.001})
        assert r.status_code == 400 and (await r.get_json())["error"]["field"] == "timeout_s"
        r = await post_job(client, {"name": "echo", "timeout_s": 86400})
        assert r.status_code == 503 and (await r.get_json())["status"] == "offline"
        assert sub.entries(ONLINE) == 0


@pytest.mark.parametrize("bind", ["0.0.0.0:8080", "10.1.2.3:8080", "[::]:8080"])
def test_serve_refuses_a_non_loopback_bind_without_an_api_key(monkeypatch, capsys, bind):
    from deskbridge_hub import cli

    monkeypatch.setenv("DESKBRIDGE_SECRET", SECRET)
    monkeypatch.delenv("DESKBRIDGE_API_KEY", raising=False)
    monkeypatch.delenv("DESKBRIDGE_REDIS_URL", raising=False)
    assert cli.main(["serve", "--bind", bind]) == 2
    assert "DESKBRIDGE_API_KEY" in capsys.readouterr().err


async def test_body_over_the_limit_is_refused_413_before_parsing(autojump_clock):
    """Quart's MAX_CONTENT_LENGTH (4 MiB, ``_http.MAX_BODY_BYTES``) bounds what one request
    may make the hub buffer; the args limit then applies to what is left."""
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        huge = b'{"name":"echo","args":{"x":"' + b"a" * (16 * 1024 * 1024) + b'"}}'
        r = await post_job(client, huge)
        assert r.status_code == 413
        assert sub.entries(ONLINE) == 0


def test_default_args_limit_is_256_kib_and_env_overrides():
    assert HubConfig().max_args_bytes == MAX_ARGS_BYTES == 256 * 1024
    assert HubConfig.from_env({"DESKBRIDGE_MAX_ARGS_BYTES": "1000"}).max_args_bytes == 1000
    with pytest.raises(ValueError, match="DESKBRIDGE_MAX_ARGS_BYTES"):
        HubConfig.from_env({"DESKBRIDGE_MAX_ARGS_BYTES": "lots"})


async def test_well_formed_job_with_every_optional_field_is_accepted(autojump_clock):
    """The validation is not so strict that it refuses a good request (the 400 tests
    above would pass vacuously against an endpoint that refuses everything)."""
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        body = {"name": "a.b-c_D9", "args": {"x": [1, 2.5, None, "é"]}, "timeout_s": 2.5,
                "idempotency_key": "order-42:~!"}  # fmt: skip
        r = await post_job(client, body)
        assert r.status_code == 504
        assert sub.entries(ONLINE) == 1
        fields = next(iter(sub.inner._streams[ONLINE].entries.values()))
        assert fields["idempotency_key"] == "order-42:~!"
        assert json.loads(fields["args"]) == body["args"]


# -- POST jobs: offline and unavailable --------------------------------------------------


async def test_job_for_an_offline_user_is_503_offline_at_once(autojump_clock):
    async with running_hub() as (client, sub):
        started = trio.current_time()
        r = await post_job(client, {"name": "echo", "args": {"x": 1}, "timeout_s": 60})
        assert trio.current_time() == started  # no waiting out the timeout
        assert r.status_code == 503
        body = await r.get_json()
        assert body["status"] == "offline" and body["job_id"] is None
        assert body["error"]["code"] == "offline"
        assert sub.entries(ONLINE) == 0
        # one enqueue step, which found no presence and wrote nothing
        assert sub.writes() == ["submit"]
        assert not [k for k in sub.inner._kv if k.startswith(("bridge:state:", "bridge:idem:"))]


async def test_substrate_unavailable_is_503_unavailable_never_offline(autojump_clock):
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        sub.inner.set_unavailable(True)
        for user in (ONLINE, "nobody"):  # online or not, Redis down says nothing about it
            r = await post_job(client, {"name": "echo"}, user=user)
            assert r.status_code == 503
            body = await r.get_json()
            assert body["status"] == "unavailable", body
            assert body["error"]["code"] == "unavailable"
        r = await client.get(f"/v1/users/{ONLINE}/presence", headers=AUTH)
        assert r.status_code == 503
        assert (await r.get_json())["status"] == "unavailable"
        r = await client.post(f"/v1/users/{ONLINE}/status", headers=AUTH)
        assert r.status_code == 503
        assert (await r.get_json())["status"] == "unavailable"


BAD_STATUS_BODIES = [
    ("not-json", b"{", "$"),
    ("array", b"[]", "$"),
    ("null", b"null", "$"),
    ("unexpected-field", b'{"x": 1}', "x"),
    ("a-job-body", b'{"name": "echo", "args": {}}', "args"),
    ("timeout-string", b'{"timeout_s": "5"}', "timeout_s"),
    ("timeout-zero", b'{"timeout_s": 0}', "timeout_s"),
    ("timeout-over-a-day", b'{"timeout_s": 86401}', "timeout_s"),
    ("timeout-twice", b'{"timeout_s": 1, "timeout_s": 60}', "timeout_s"),
]


@pytest.mark.parametrize(
    ("body", "field"), [b[1:] for b in BAD_STATUS_BODIES], ids=[b[0] for b in BAD_STATUS_BODIES]
)
async def test_a_bad_status_body_is_400_naming_the_field(autojump_clock, body, field):
    # The body was ignored: {"timeot_s": 1} or a whole job body got a status round trip.
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        sub.calls.clear()
        r = await client.post(
            f"/v1/users/{ONLINE}/status",
            data=body,
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert r.status_code == 400, await r.get_data(as_text=True)
        assert (await r.get_json())["error"]["field"] == field
        assert sub.writes() == []


@pytest.mark.parametrize(
    ("body", "waited_s"), [(b"", 5.0), (b"{}", 5.0), (b'{"timeout_s": 1.5}', 1.5)]
)
async def test_status_waits_its_timeout_s_or_5_s(autojump_clock, body, waited_s):
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)  # nobody answers
        started = trio.current_time()
        r = await client.post(f"/v1/users/{ONLINE}/status", data=body, headers=AUTH)
        assert r.status_code == 504
        assert (await r.get_json())["status"] == "timeout"
        assert trio.current_time() - started == pytest.approx(waited_s, abs=0.5)


async def test_substrate_failing_while_waiting_is_unavailable(autojump_clock):
    async with running_hub() as (client, sub):
        await sub.inner.set_presence(ONLINE, "sess-1", 3600.0)
        async with trio.open_nursery() as nursery:

            async def break_redis() -> None:
                await trio.sleep(1.0)
                sub.inner.set_unavailable(True)

            nursery.start_soon(break_redis)
            r = await post_job(client, {"name": "echo", "timeout_s": 30})
        assert r.status_code == 503
        assert (await r.get_json())["status"] == "unavailable"


# -- the sidecar WebSocket handshake -----------------------------------------------------


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def refused(client: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """Open /v1/sidecar; return the HTTP refusal (status, JSON body). Fails if the hub
    accepted the upgrade."""
    async with client.websocket("/v1/sidecar", headers=headers) as ws:
        with pytest.raises(WebsocketResponseError) as info:
            await ws.receive()
        assert not ws.accepted
    response = info.value.response
    return response.status_code, json.loads(await response.get_data(as_text=True))


def _hs256(header: dict[str, Any], claims: dict[str, Any], secret: str) -> str:
    import jwt

    return jwt.encode(claims, secret, algorithm="HS256", headers=header)


def _now() -> int:
    return int(time.time())


HANDSHAKE_REFUSALS = [
    ("no-header", {}, 401),
    ("empty-header", {"Authorization": ""}, 401),
    ("bearer-nothing", {"Authorization": "Bearer "}, 401),
    ("basic-scheme", {"Authorization": "Basic dTE6cHc="}, 401),
    ("garbage", _bearer("not-a-token"), 403),
    ("forged", _bearer(issue_token(OTHER_SECRET, "u1", lifetime_s=86400)), 403),
    ("forged-with-our-kid",
     _bearer(_hs256({"kid": key_id(SECRET)}, {"sub": "u1", "exp": _now() + 86400}, OTHER_SECRET)),
     403),
    ("bad-sub",
     _bearer(_hs256({"kid": key_id(SECRET)}, {"sub": "u 1", "exp": _now() + 86400}, SECRET)), 403),
    ("no-exp", _bearer(_hs256({"kid": key_id(SECRET)}, {"sub": "u1"}, SECRET)), 403),
    ("expired",
     _bearer(issue_token(SECRET, "u1", lifetime_s=60, now=time.time() - 3600)), 401),
]  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "status"),
    [h[1:] for h in HANDSHAKE_REFUSALS],
    ids=[h[0] for h in HANDSHAKE_REFUSALS],
)
async def test_bad_token_is_refused_before_the_upgrade_writing_nothing(
    autojump_clock, headers, status
):
    async with running_hub() as (client, sub):
        got, body = await refused(client, headers)
        assert got == status
        assert body["error"]["code"] in ("unauthorized", "forbidden")
        assert sub.calls == []  # no presence, no stream, not even a read
        assert {k: v for k, v in sub.inner._kv.items() if not k.startswith("bridge:proc:")} == {}
        # no presence (nor any other key) stored; the process's own liveness key aside


async def test_hub_without_a_secret_refuses_every_sidecar_with_503(autojump_clock):
    async with running_hub(secrets=()) as (client, sub):
        status, body = await refused(client, _bearer(issue_token(SECRET, "u1")))
        assert status == 503 and body["error"]["code"] == "not_configured"
        assert sub.calls == []


async def _hello(ws: Any) -> Welcome:
    await ws.send(encode_frame(Hello(protocol_version=1, sidecar_version="test")))
    welcome = decode_frame(await ws.receive())
    assert isinstance(welcome, Welcome)
    return welcome


async def test_user_id_comes_from_the_token_only(autojump_clock):
    """Query string and headers cannot pick another user."""
    async with running_hub() as (client, sub):
        token = issue_token(SECRET, "alice", lifetime_s=600)
        async with client.websocket(
            "/v1/sidecar",
            headers={**_bearer(token), "X-User-Id": "bob"},
            query_string={"user_id": "bob"},
        ) as ws:
            welcome = await _hello(ws)
            assert await sub.inner.get_presence("alice") == welcome.session_id
            assert await sub.inner.get_presence("bob") is None
            r = await client.get("/v1/users/bob/presence", headers=AUTH)
            assert (await r.get_json())["online"] is False


async def test_valid_token_end_to_end_echo_through_http(autojump_clock):
    """The positive path of the whole stack: token -> upgrade -> hello -> HTTP job ->
    job frame -> job_result -> 200 with the result."""
    async with running_hub() as (client, sub):
        token = issue_token(SECRET, ONLINE, lifetime_s=600)
        async with client.websocket("/v1/sidecar", headers=_bearer(token)) as ws:
            await _hello(ws)
            async with trio.open_nursery() as nursery:

                async def sidecar() -> None:
                    while True:
                        frame = decode_frame(await ws.receive())
                        if isinstance(frame, Ping):
                            await ws.send(encode_frame(Pong(frame.nonce)))
                        elif isinstance(frame, Job):
                            await ws.send(encode_frame(JobResult(frame.id, True, frame.args)))

                nursery.start_soon(sidecar)
                r = await post_job(client, {"name": "echo", "args": {"x": [1, "two"]}})
                nursery.cancel_scope.cancel()
            assert r.status_code == 200
            body = await r.get_json()
            assert body["status"] == "completed" and body["result"] == {"x": [1, "two"]}


async def test_valid_token_with_substrate_down_closes_1013(autojump_clock):
    async with running_hub() as (client, sub):
        sub.inner.set_unavailable(True)
        token = issue_token(SECRET, ONLINE, lifetime_s=600)
        async with client.websocket("/v1/sidecar", headers=_bearer(token)) as ws:
            await ws.send(encode_frame(Hello(protocol_version=1, sidecar_version="test")))
            with pytest.raises(WebsocketDisconnectError) as info:
                await ws.receive()
        assert info.value.args[0] == 1013


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"name": "echo", "args": []}', "args must be a JSON object"),
        (b'{"name": 7}', "name must be a string"),
        (b'{"name": "echo", "timeout_s": "5"}', "timeout_s must be a number"),
    ],
)
async def test_a_field_of_the_wrong_type_says_which_type_it_must_be(autojump_clock, body, needle):
    async with running_hub() as (client, _sub):
        r = await post_job(client, body)
        assert r.status_code == 400
        assert needle in (await r.get_json())["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "body is not valid JSON (nested too deeply)",
        ),
        (
            b'{"a": ' + b"9" * 5000 + b"}",
            "body holds an integer of more than 4300 digits",
        ),
    ],
    ids=["deep", "long integer"],
)
def test_json_the_hub_cannot_take_is_refused_in_the_api_s_words(raw, message):
    """A newcomer pass: the 400 told an API client to "use sys.set_int_max_str_digits() to
    increase the limit" (Python's advice to the hub's own code), and "maximum recursion
    depth exceeded while decoding a JSON array from a unicode string"."""
    from deskbridge_hub import BadRequest
    from deskbridge_hub._http_body import parse_json_body

    with pytest.raises(BadRequest) as refused:
        parse_json_body(raw)
    assert (str(refused.value), refused.value.field) == (message, "$")
