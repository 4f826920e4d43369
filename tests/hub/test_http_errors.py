"""Errors outside the routes answer JSON like the rest of the API (issue 11 item 6):
an unmatched route is a JSON 404, a wrong method a JSON 405 with ``Allow``."""

from __future__ import annotations

from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate


async def test_unmatched_route_and_wrong_method_answer_json(autojump_clock) -> None:
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        r = await client.get("/no/such/route")
        assert r.status_code == 404
        assert r.content_type == "application/json"
        assert await r.get_json() == {
            "error": {"code": "not_found", "message": "Not Found: GET /no/such/route"}
        }
        r = await client.delete("/livez")
        assert r.status_code == 405
        assert (await r.get_json())["error"]["code"] == "method_not_allowed"
        assert "GET" in r.headers["Allow"]
        r = await client.get("/v1/users/u1/jobs")  # POST-only route
        assert r.status_code == 405
        assert r.content_type == "application/json"


async def test_a_websocket_upgrade_to_an_unknown_path_is_a_json_404(autojump_clock, caplog) -> None:
    # ws://hub/wrong (a newcomer's path typo) was a 500 with two ERROR tracebacks per
    # attempt, and the sidecar retries for ever: the JSON error handler read ``request``,
    # which a WebSocket scope does not have
    from quart.testing import WebsocketResponseError

    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        refused: list[WebsocketResponseError] = []
        try:
            async with client.websocket("/wrong") as ws:
                await ws.send("{}")
                await ws.receive()
        except* WebsocketResponseError as group:  # raised through the client's nurseries
            refused = _leaves(group)
        (refusal,) = refused
        response = refusal.response
        assert response.status_code == 404
        assert await response.get_json() == {
            "error": {"code": "not_found", "message": "Not Found: WebSocket /wrong"}
        }
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_websocket_upgrade_to_an_http_route_is_the_same_json_404(autojump_clock) -> None:
    # ws://hub/healthz or ws://hub/admin/ (a --hub pointed at a page of the hub) was a
    # 400 "Bad Request" (Werkzeug's WebSocketMismatch): the sidecar retried it for ever
    # without the "check --hub" hint it gives a 404, though no WebSocket is served there
    from quart.testing import WebsocketResponseError

    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=MemorySubstrate())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for path in ("/healthz", "/admin/", "/v1/users/u1/presence"):
            refused: list[WebsocketResponseError] = []
            try:
                async with client.websocket(path) as ws:
                    await ws.send("{}")
                    await ws.receive()
            except* WebsocketResponseError as group:
                refused = _leaves(group)
            (refusal,) = refused
            assert refusal.response.status_code == 404, path
            assert await refusal.response.get_json() == {
                "error": {"code": "not_found", "message": f"Not Found: WebSocket {path}"}
            }


def _leaves(group: BaseExceptionGroup) -> list:
    out = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


async def test_a_plain_request_to_the_sidecar_endpoint_is_426_not_an_api_key_error(
    autojump_clock,
) -> None:
    # it answered "missing or wrong API key", which sent a newcomer looking for a key
    app = create_app(
        HubConfig(secrets=("s" * 40,), api_keys=("k1",)), substrate=MemorySubstrate()
    )
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for method in (client.get, client.post):
            r = await method("/v1/sidecar")
            assert r.status_code == 426
            assert r.headers["Upgrade"] == "websocket"
            assert (await r.get_json())["error"]["code"] == "upgrade_required"
