"""``POST /v1/users/{user_id}/jobs`` as plain ASGI in front of Quart (``_jobs_asgi``).

Two things are checked: which requests the ASGI route takes (that path and method only;
everything else reaches Quart unchanged), and that what it answers is what the Quart
route answers, byte for byte: every case is sent to the hub as served and to the same hub
with the ASGI route left out (``mount_jobs`` replaced by the identity), and the status,
headers and body must be equal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio
from deskbridge_hub import HubConfig, _app, _tracing, create_app
from deskbridge_hub._asgi_body import DRAIN_S
from deskbridge_hub._bridge_jobs import queue_full
from deskbridge_hub._disconnects import WATCH_AFTER_S
from deskbridge_hub._errors import (
    BadRequest,
    IdempotencyKeyReused,
    JobIdInUse,
    SubstrateMisconfigured,
    SubstrateUnavailable,
)
from deskbridge_hub._jobs_asgi import mount_jobs
from werkzeug.datastructures import Headers

from tests.hub.test_http_api import API_KEYS, AUTH, ONLINE, SECRET, RecordingSubstrate

PATH = f"/v1/users/{ONLINE}/jobs"
JSON = {**AUTH, "Content-Type": "application/json"}


class Hub:
    """A running hub app, its test client, its substrate, and what reached Quart."""

    def __init__(self, app: Any, client: Any, substrate: RecordingSubstrate) -> None:
        self.app = app
        self.client = client
        self.substrate = substrate
        self.reached_quart: list[tuple[str, str]] = []

    @property
    def holder(self) -> dict[str, Any]:
        return self.app.extensions["deskbridge"]


@contextlib.asynccontextmanager
async def hub(
    monkeypatch: pytest.MonkeyPatch, *, asgi_route: bool = True, **config: Any
) -> AsyncIterator[Hub]:
    """The hub as served (``asgi_route``), or with POST .../jobs left to Quart's route."""
    spies: list[Hub] = []

    def mount(asgi_app: Any, *args: Any) -> Any:
        async def quart(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                spies[0].reached_quart.append((scope["method"], scope["path"]))
            await asgi_app(scope, receive, send)

        return mount_jobs(quart, *args) if asgi_route else quart

    substrate = RecordingSubstrate()
    settings = {"secrets": (SECRET,), "api_keys": API_KEYS, **config}
    with monkeypatch.context() as patch:
        patch.setattr(_app, "mount_jobs", mount)
        app = create_app(HubConfig(**settings), substrate=substrate)  # type: ignore[arg-type]
    async with app.test_app() as test_app:
        spies.append(Hub(app, test_app.test_client(), substrate))
        yield spies[0]


async def answer(response: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body; a fresh job id (a random UUID) reads ``JOB``."""
    body = re.sub(rb'"[0-9a-f]{32}~', b'"JOB~', await response.get_data())
    return response.status_code, list(response.headers.items()), body


# -- what the ASGI route takes ---------------------------------------------------------------


async def test_post_jobs_is_served_without_reaching_quart(autojump_clock, monkeypatch):
    async with hub(monkeypatch) as h:
        r = await h.client.post(PATH, data=b'{"name": "echo"}', headers=JSON)
        assert r.status_code == 503 and (await r.get_json())["status"] == "offline"
        assert h.reached_quart == []


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", PATH, 405),  # the Quart route keeps the path's 405 (Allow: POST)
        ("PUT", PATH, 405),
        ("OPTIONS", PATH, 204),
        ("POST", PATH + "/x", 404),  # a sub-path
        ("POST", PATH + "/", 404),
        ("POST", "/v1/users//jobs", 404),
        ("POST", "/v1/users/a/b/jobs", 404),
        ("POST", "/v2/users/u1/jobs", 404),
        ("POST", f"/v1/users/{ONLINE}/status", 200),
        ("POST", f"/v1/users/{ONLINE}/mcp-not", 404),
    ],
)
async def test_other_methods_and_paths_fall_through_to_quart(
    autojump_clock, monkeypatch, method, path, status
):
    async with hub(monkeypatch) as h:
        await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)
        r = await h.client.open(path, method=method, data=b"", headers=JSON)
        assert r.status_code in (status, 504), await r.get_data()  # status: no desktop answers
        assert h.reached_quart == [(method, path)]
        if status == 405:
            assert r.headers["Allow"] == "OPTIONS, POST"
            assert r.content_type == "application/json"


@pytest.mark.parametrize(
    ("path", "status"),
    [("/api" + PATH, 503), (PATH, 404)],  # Quart strips the root path; a path without it: 404
)
async def test_a_request_under_a_root_path_is_left_to_quarts_route(
    autojump_clock, monkeypatch, path, status
):
    async with hub(monkeypatch) as h:
        r = await h.client.post(path, data=b'{"name": "echo"}', headers=JSON, root_path="/api")
        assert r.status_code == status
        assert h.reached_quart == [("POST", path)]


# -- what it answers, next to the Quart route ------------------------------------------------


async def _nothing(h: Hub) -> None:
    return None


async def _online(h: Hub) -> None:
    await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)


async def _down(h: Hub) -> None:
    h.substrate.inner.set_unavailable(True)


async def _draining(h: Hub) -> None:
    h.holder["state"].drain.active = True


def _raising(exc: Exception) -> Callable[[Hub], Awaitable[None]]:
    async def setup(h: Hub) -> None:
        async def dispatch(*args: Any, **kwargs: Any) -> Any:
            raise exc

        h.holder["bridge"].dispatch = dispatch

    return setup


def _small_body_limit(limit: int) -> Callable[[Hub], Awaitable[None]]:
    async def setup(h: Hub) -> None:
        h.app.config["MAX_CONTENT_LENGTH"] = limit

    return setup


GOOD = b'{"name": "echo", "args": {"x": 1}}'

CASES = [
    # (id, setup, user, headers, body)
    ("offline", _nothing, ONLINE, JSON, GOOD),
    ("no-key", _nothing, ONLINE, {}, GOOD),
    ("wrong-key", _nothing, ONLINE, {"Authorization": "Bearer k3"}, GOOD),
    ("basic-auth-key", _nothing, ONLINE, {"Authorization": "Basic eDprMg=="}, GOOD),
    ("first-of-two-keys-wrong", _nothing, ONLINE,
     Headers([("Authorization", "Bearer k3"), ("Authorization", "Bearer k1")]), GOOD),
    ("first-of-two-keys-right", _nothing, ONLINE,
     Headers([("Authorization", "Bearer k1"), ("Authorization", "Bearer k3")]), GOOD),
    ("no-key-bad-body", _nothing, ONLINE, {}, b"{not json"),
    ("not-json", _nothing, ONLINE, JSON, b"{not json"),
    ("empty-body", _nothing, ONLINE, JSON, b""),
    ("array-body", _nothing, ONLINE, JSON, b'["echo"]'),
    ("nan", _nothing, ONLINE, JSON, b'{"name": "echo", "args": {"x": NaN}}'),
    ("duplicate-key", _nothing, ONLINE, JSON, b'{"name": "echo", "args": {"a": 1, "a": 2}}'),
    ("missing-name", _nothing, ONLINE, JSON, b'{"args": {}}'),
    ("args-list", _nothing, ONLINE, JSON, b'{"name": "echo", "args": [1]}'),
    ("bad-timeout", _nothing, ONLINE, JSON, b'{"name": "echo", "timeout_s": 0}'),
    ("extra-field", _nothing, ONLINE, JSON, b'{"name": "echo", "nmae": 1}'),
    ("bad-name", _online, ONLINE, JSON, b'{"name": "rm -rf"}'),
    ("args-too-big", _online, ONLINE, JSON, json.dumps({"name": "e", "args": {"x": "a" * 99}})),
    ("bad-user-id", _nothing, "a%20b", JSON, GOOD),
    ("unicode-user-id", _nothing, "%C3%A9l%C3%A8ve", JSON, GOOD),
    ("dot-user-id", _nothing, ".", JSON, GOOD),
    ("dot-dot-user-id", _nothing, "..", JSON, GOOD),
    ("nul-user-id", _nothing, "%00", JSON, GOOD),
    ("query-in-user-id", _nothing, "a%3Fb", JSON, GOOD),
    ("long-user-id", _nothing, "x" * 129, JSON, GOOD),
    ("longest-user-id", _nothing, "x" * 128, JSON, GOOD),
    ("unavailable", _down, ONLINE, JSON, GOOD),
    ("draining", _draining, ONLINE, JSON, GOOD),
    ("draining-bad-body", _draining, ONLINE, JSON, b'{"nmae": 1}'),
    ("body-over-limit", _small_body_limit(16), ONLINE, JSON, GOOD),
    ("body-at-limit", _small_body_limit(len(GOOD)), ONLINE, JSON, GOOD),
    ("timeout", _online, ONLINE, JSON, b'{"name": "echo", "timeout_s": 2}'),
    ("unavailable-enqueued", _raising(SubstrateUnavailable("gone", job_id="j1")), ONLINE,
     JSON, GOOD),
    ("misconfigured", _raising(SubstrateMisconfigured("no db 9")), ONLINE, JSON, GOOD),
    ("key-reused", _raising(IdempotencyKeyReused("other args", job_id="j0")), ONLINE, JSON,
     GOOD),
    ("job-id-in-use", _raising(JobIdInUse("taken")), ONLINE, JSON, GOOD),
    ("queue-full", _raising(queue_full(ONLINE, 3, None)), ONLINE, JSON, GOOD),
    ("bad-request", _raising(BadRequest("no such tool", field="name")), ONLINE, JSON, GOOD),
    ("unexpected-error", _raising(RuntimeError("boom")), ONLINE, JSON, GOOD),
]  # fmt: skip


@pytest.mark.parametrize(
    ("setup", "user", "headers", "body"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_answers_are_the_quart_routes_byte_for_byte(
    autojump_clock, monkeypatch, caplog, setup, user, headers, body
):
    answers = []
    errors = []
    for asgi_route in (True, False):
        caplog.clear()
        async with hub(monkeypatch, asgi_route=asgi_route, max_args_bytes=64) as h:
            await setup(h)
            started = trio.current_time()
            r = await h.client.post(f"/v1/users/{user}/jobs", data=body, headers=headers)
            answers.append((await answer(r), trio.current_time() - started))
            assert (h.reached_quart == []) is asgi_route
        errors.append([(r.name, r.getMessage(), bool(r.exc_info)) for r in _errors(caplog)])
    assert answers[0] == answers[1]
    assert errors[0] == errors[1]


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_unexpected_error_is_a_logged_json_500(autojump_clock, monkeypatch, caplog):
    async with hub(monkeypatch) as h:
        await _raising(RuntimeError("boom"))(h)
        r = await h.client.post(PATH, data=GOOD, headers=JSON)
        assert r.status_code == 500
        assert await r.get_json() == {
            "error": {
                "code": "internal_server_error",
                "message": f"Internal Server Error: POST {PATH}",
            }
        }
    (record,) = _errors(caplog)
    assert record.getMessage() == f"Exception on request POST {PATH}"
    assert record.name == "deskbridge_hub" and record.exc_info is not None
    assert str(record.exc_info[1]) == "boom"


async def test_a_body_over_the_limit_without_content_length_is_413(autojump_clock, monkeypatch):
    """The limit holds for what arrives, not only for what ``Content-Length`` says."""
    for asgi_route in (True, False):
        async with hub(monkeypatch, asgi_route=asgi_route) as h:
            await _online(h)
            h.app.config["MAX_CONTENT_LENGTH"] = 20
            async with h.client.request(PATH, method="POST", headers=AUTH) as conn:
                await conn.send(b'{"name": "echo", ')
                await conn.send(b'"args": {}}')
                await conn.send_complete()
                r = await conn.as_response()
            assert r.status_code == 413, await r.get_data()
            assert (await r.get_json())["error"] == {
                "code": "request_entity_too_large",
                "message": f"request bodies are limited to 20 bytes: POST {PATH}",
            }
            assert h.substrate.entries(ONLINE) == 0


async def test_a_declared_length_over_the_limit_is_413_before_the_body(autojump_clock, monkeypatch):
    for asgi_route in (True, False):
        async with hub(monkeypatch, asgi_route=asgi_route) as h:
            headers = {**AUTH, "Content-Length": str(16 * 1024 * 1024 + 1)}
            started = trio.current_time()
            with trio.fail_after(300):
                async with h.client.request(PATH, method="POST", headers=headers) as conn:
                    r = await conn.as_response()  # no byte of the body sent
            # at once (the job route reads and drops what a client may still be sending
            # for up to DRAIN_S first, so the client can read the answer)
            assert trio.current_time() - started <= DRAIN_S
            assert r.status_code == 413
            assert (await r.get_json())["error"]["code"] == "request_entity_too_large"


async def test_a_body_that_never_ends_is_408_after_the_body_timeout(autojump_clock, monkeypatch):
    for asgi_route in (True, False):
        async with hub(monkeypatch, asgi_route=asgi_route) as h:
            h.app.config["BODY_TIMEOUT"] = 7
            started = trio.current_time()
            with trio.fail_after(300):
                async with h.client.request(PATH, method="POST", headers=AUTH) as conn:
                    await conn.send(b'{"name": ')
                    r = await conn.as_response()
            assert trio.current_time() - started == pytest.approx(7)
            assert r.status_code == 408
            assert (await r.get_json())["error"]["code"] == "request_timeout"


async def test_a_chunked_body_is_read_whole(autojump_clock, monkeypatch):
    async with hub(monkeypatch) as h:
        async with h.client.request(PATH, method="POST", headers=AUTH) as conn:
            for i in range(0, len(GOOD), 5):
                await conn.send(GOOD[i : i + 5])
            await conn.send_complete()
            r = await conn.as_response()
        assert r.status_code == 503 and (await r.get_json())["status"] == "offline"
        assert h.reached_quart == []


@pytest.mark.parametrize("asgi_route", [True, False])
async def test_a_caller_that_goes_away_cancels_its_wait(autojump_clock, monkeypatch, asgi_route):
    """A waiting call is counted (the drain waits for it) and a client that disconnects
    ends it at once, as quart-trio did: it does not hold a task for its timeout."""
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        await _online(h)
        drain = h.holder["state"].drain
        scope = h.client.request(PATH, method="POST", headers=AUTH).scope
        to_app, app_receives = trio.open_memory_channel[dict](10)
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async with trio.open_nursery() as nursery:  # the ASGI call, as Hypercorn makes it
            nursery.start_soon(h.app, scope, app_receives.receive, send)
            body = b'{"name": "echo", "timeout_s": 60}'
            await to_app.send({"type": "http.request", "body": body, "more_body": False})
            with trio.fail_after(30):
                while h.substrate.entries(ONLINE) == 0:  # noqa: ASYNC110 - mock clock
                    await trio.sleep(0.1)
            assert drain.requests == 1
            left = trio.current_time()
            await to_app.send({"type": "http.disconnect"})
        assert trio.current_time() - left < 1
        assert sent == [] and drain.requests == 0
        assert h.reached_quart == ([] if asgi_route else [("POST", PATH)])


@pytest.mark.parametrize("asgi_route", [True, False])
async def test_an_answer_nobody_reads_is_given_up_after_the_response_timeout(
    autojump_clock, monkeypatch, asgi_route
):
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        h.app.config["RESPONSE_TIMEOUT"] = 9
        scope = h.client.request(PATH, method="POST", headers=AUTH).scope
        to_app, app_receives = trio.open_memory_channel[dict](10)

        async def send(message: dict) -> None:
            await trio.sleep_forever()  # a peer that never reads

        await to_app.send({"type": "http.request", "body": GOOD, "more_body": False})
        started = trio.current_time()
        with trio.fail_after(300):
            await h.app(scope, app_receives.receive, send)
        assert trio.current_time() - started == pytest.approx(9)


async def test_the_callers_traceparent_is_current_during_the_dispatch(autojump_clock, monkeypatch):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    seen: list[str | None] = []
    async with hub(monkeypatch) as h:

        async def dispatch(*args: Any, **kwargs: Any) -> Any:
            seen.append(_tracing.current_traceparent())
            raise BadRequest("stop here", field="name")

        h.holder["bridge"].dispatch = dispatch
        r = await h.client.post(PATH, data=GOOD, headers={**JSON, "traceparent": parent})
        assert r.status_code == 400
        r = await h.client.post(PATH, data=GOOD, headers=JSON)
        assert r.status_code == 400
    assert seen == [parent, None]


async def test_the_access_log_sees_the_request(autojump_clock, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="deskbridge.hub.access")
    async with hub(monkeypatch) as h:
        r = await h.client.post(PATH, data=GOOD, headers=JSON)
        assert r.status_code == 503
    (line,) = [r for r in caplog.records if r.name == "deskbridge.hub.access"]
    assert f'"POST {PATH}" 503' in line.getMessage()


@pytest.mark.parametrize("asgi_route", [True, False])
async def test_a_call_waiting_when_the_grace_ends_is_answered_503_with_its_job(
    autojump_clock, monkeypatch, caplog, asgi_route
):
    """A graceful restart whose grace ends while a call waits answers that call 503
    ``unavailable`` naming its job and stage, counted and logged once as ``unavailable``
    (not ``abandoned``), before ``drain`` returns (was: cut when the process exited)."""
    from deskbridge_hub._shutdown import drain

    caplog.set_level(logging.DEBUG, logger="deskbridge.hub.calls")
    async with hub(monkeypatch, asgi_route=asgi_route) as h:
        await _online(h)
        state = h.holder["state"]
        scope = h.client.request(PATH, method="POST", headers=AUTH).scope
        to_app, app_receives = trio.open_memory_channel[dict](10)
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.app, scope, app_receives.receive, send)
            body = b'{"name": "echo", "timeout_s": 60}'
            await to_app.send({"type": "http.request", "body": body, "more_body": False})
            with trio.fail_after(30):
                while h.substrate.entries(ONLINE) == 0:  # noqa: ASYNC110 - mock clock
                    await trio.sleep(0.1)
            began = trio.current_time()
            await drain(state, 5.0)
            assert trio.current_time() - began < 5.0 + 2.0  # the grace, then the answer
            assert sent and sent[0]["type"] == "http.response.start"  # answered by then
            assert not sent[-1].get("more_body", False)
            nursery.cancel_scope.cancel()
        assert sent[0]["status"] == 503
        answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
        assert answer["status"] == "unavailable" and answer["error"]["code"] == "unavailable"
        assert answer["job_id"].endswith(f"~{ONLINE}")
        assert answer["detail"] == {"stage": "queued"}
        assert f"GET /v1/jobs/{answer['job_id']}" in answer["error"]["message"]
        lines = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.calls"]
        job_id = answer["job_id"]
        assert lines == [f"call for job {job_id} answered: unavailable (echo for {ONLINE})"]
        assert state.drain.requests == 0


# -- the client going away: watched lazily, in one service per process (``_disconnects``) ----


class _Request:
    """One ASGI HTTP call of the job route, driven as Hypercorn drives it: the body in
    one message, and ``http.disconnect`` queued once the response's last body message has
    been sent (``disconnect_after_response``). Records the app's ``receive`` calls and
    whether one was cancelled, and what the app sent."""

    def __init__(self, h: Hub, *, disconnect_after_response: bool = True) -> None:
        self.scope = h.client.request(PATH, method="POST", headers=AUTH).scope
        self.to_app, self._from_server = trio.open_memory_channel[dict](10)
        self.receives = 0
        self.cancelled_receives = 0
        self.sent: list[dict] = []
        self._disconnect_after_response = disconnect_after_response

    async def receive(self) -> dict:
        self.receives += 1
        try:
            return await self._from_server.receive()
        except trio.Cancelled:
            self.cancelled_receives += 1
            raise

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            if self._disconnect_after_response:
                self.to_app.send_nowait({"type": "http.disconnect"})

    async def body(self, body: bytes) -> None:
        await self.to_app.send({"type": "http.request", "body": body, "more_body": False})


async def test_a_call_answered_at_once_starts_no_watcher(autojump_clock, monkeypatch):
    """A call answered before ``WATCH_AFTER_S`` reads nothing of its request after the
    body: no watcher task is started for it (each cost a spawn, a nursery and trio's
    cancellation: issue 10, "HTTP adds")."""
    async with hub(monkeypatch) as h:
        call = _Request(h)
        await call.body(GOOD)  # the user is offline: answered at once
        await h.app(call.scope, call.receive, call.send)
        await trio.sleep(10 * WATCH_AFTER_S)
        assert call.sent[0]["status"] == 503
        assert call.receives == 1  # the body; nothing more
        assert h.holder["disconnects"].statistics() == (0, 0)


async def test_a_watched_call_answered_leaves_its_watcher_to_the_servers_disconnect(
    autojump_clock, monkeypatch
):
    """A call that waited past ``WATCH_AFTER_S`` is watched; once it is answered its
    watcher is not cancelled (trio's cancellation costs more than a task step): it ends
    on the ``http.disconnect`` the server queues after the response."""
    async with hub(monkeypatch) as h:
        await _online(h)
        call = _Request(h)
        await call.body(b'{"name": "echo", "timeout_s": 2}')  # no desktop answers
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.app, call.scope, call.receive, call.send)
            await trio.sleep(WATCH_AFTER_S * 1.5)
            assert call.receives == 2  # the body, then its watcher's read
        assert trio.current_time() - started == pytest.approx(2, abs=0.5)
        assert json.loads(call.sent[1]["body"])["status"] == "timeout"
        await trio.sleep(1)
        assert call.cancelled_receives == 0
        assert call.receives == 2  # the watcher read the disconnect and ended
        assert h.holder["disconnects"].statistics() == (0, 0)


async def test_a_client_gone_before_the_watch_starts_is_noticed_within_watch_after_s(
    autojump_clock, monkeypatch
):
    async with hub(monkeypatch) as h:
        await _online(h)
        drain = h.holder["state"].drain
        call = _Request(h)
        await call.body(b'{"name": "echo", "timeout_s": 60}')
        await call.to_app.send({"type": "http.disconnect"})  # gone right after the body
        left = trio.current_time()
        with trio.fail_after(30):
            await h.app(call.scope, call.receive, call.send)
        assert trio.current_time() - left <= WATCH_AFTER_S + 0.01
        assert call.sent == [] and drain.requests == 0


async def test_an_answer_given_up_after_the_response_timeout_leaves_no_watcher(
    autojump_clock, monkeypatch
):
    """No ``http.disconnect`` is promised for an answer never sent: its watcher is
    cancelled with the request."""
    async with hub(monkeypatch) as h:
        await _online(h)
        h.app.config["RESPONSE_TIMEOUT"] = 9
        call = _Request(h, disconnect_after_response=False)

        async def never_reads(message: dict) -> None:
            await trio.sleep_forever()

        await call.body(b'{"name": "echo", "timeout_s": 2}')
        with trio.fail_after(300):
            await h.app(call.scope, call.receive, never_reads)
        await trio.sleep(1)
        assert call.cancelled_receives == 1
        assert h.holder["disconnects"].statistics() == (0, 0)
