"""Mounting the MCP endpoint on the hub's ASGI app: ``/v1/users/{user_id}/mcp``.

An ASGI middleware in front of the Quart app (``app.asgi_app = mount_mcp(...)``, the
Flask/Quart middleware pattern): requests to an MCP path go to that user's
:class:`~deskbridge_hub._mcp.UserEndpoint` (the SDK's Streamable HTTP session manager,
a plain ASGI app), everything else to Quart unchanged. The endpoint is authenticated like
the rest of ``/v1/``: ``Authorization: Bearer <DESKBRIDGE_API_KEY>``.

Running the SDK under the hub's trio worker: the SDK is written against anyio, so it runs
on trio as is. What had to be adapted is only the lifetime: the SDK's session manager
wants ``async with manager.run()`` held open by one task for the app's whole life (its
task group owns the sessions); quart-trio offers that as ``app.nursery`` (the lifespan
nursery), so each user endpoint's ``run`` is started there on first use and ends when the
app stops serving.
"""

from __future__ import annotations

import hmac
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._bridge import Bridge
from ._validate import validate_user_id

if TYPE_CHECKING:
    from ._mcp import UserEndpoint

log = logging.getLogger("deskbridge.hub.mcp")

_PATH = re.compile(r"/v1/users/([^/]+)/mcp/?\Z")


@attrs.define(eq=False)
class McpEndpoints:
    """Every user's MCP endpoint in this process, created on first use.

    Args:
        get_nursery: the nursery endpoints run in (quart-trio's ``app.nursery``).
        get_bridge: the dispatch API (available while the app serves).
        is_draining: True while this replica is shutting down.
    """

    get_nursery: Callable[[], Any]
    get_bridge: Callable[[], Bridge | None]
    is_draining: Callable[[], bool]
    _endpoints: dict[str, UserEndpoint] = attrs.field(factory=dict)
    _lock: anyio.Lock = attrs.field(factory=anyio.Lock)

    async def endpoint(self, user_id: str) -> UserEndpoint | None:
        """The running endpoint for ``user_id`` (started if new), or None while the app
        is not serving."""
        found = self._endpoints.get(user_id)
        if found is not None:
            return found
        bridge = self.get_bridge()
        if bridge is None:
            return None
        async with self._lock:
            found = self._endpoints.get(user_id)
            if found is None:
                mcp = await _mcp_module()
                found = mcp.UserEndpoint(user_id, bridge, is_draining=self.is_draining)
                await self.get_nursery().start(self._run, found)
            return found

    async def _run(self, endpoint: UserEndpoint, *, task_status: Any) -> None:
        self._endpoints[endpoint.user_id] = endpoint
        try:
            await endpoint.run(task_status=task_status)
        finally:
            self._endpoints.pop(endpoint.user_id, None)


async def _mcp_module() -> Any:
    """``deskbridge_hub._mcp`` (and the MCP SDK), imported on the first MCP request, in a
    worker thread so the event loop keeps serving sockets meanwhile (issue 16). The SDK
    and its pydantic models are about 40 % of the hub's import time (``python -X
    importtime``: 2.6 of 6.7 s on the loaded 2-core machine; a pod's start cost about 3 s
    of CPU): a pod restarted under churn is ready sooner, and spends no CPU on MCP unless
    it is used. The first MCP request of a process waits for the import (about 1 s)."""
    name = f"{__package__}._mcp"
    module = sys.modules.get(name)
    if module is None:
        module = await anyio.to_thread.run_sync(importlib.import_module, name)
    return module


def mount_mcp(
    asgi_app: Any, app: Any, holder: dict[str, Any], api_keys: tuple[str, ...]
) -> Callable[..., Any]:
    """Wrap ``asgi_app`` so ``/v1/users/{user_id}/mcp`` is served by the MCP endpoint.

    Args:
        asgi_app: the app's ASGI callable (Quart's ``app.asgi_app``).
        app: the QuartTrio app (its ``nursery`` hosts the endpoints).
        holder: the app's shared dict (``bridge`` and ``state`` while serving).
        api_keys: accepted bearer keys; empty means no authentication (loopback dev).

    Returns:
        The wrapping ASGI callable.
    """
    endpoints = McpEndpoints(
        get_nursery=lambda: app.nursery,
        get_bridge=lambda: holder.get("bridge"),
        is_draining=lambda: _draining(holder),
    )
    holder["mcp"] = endpoints

    async def mcp_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        match = _PATH.match(scope.get("path", ""))
        if match is None:
            await asgi_app(scope, receive, send)
            return
        user_id = match.group(1)
        if not _authorised(scope, api_keys):
            await _send_json(
                send, 401, "unauthorized", "missing or wrong API key (Authorization: Bearer <key>)"
            )
            return
        try:
            validate_user_id(user_id)
        except ValueError as exc:
            await _send_json(send, 400, "bad_request", str(exc), field="user_id")
            return
        endpoint = await endpoints.endpoint(user_id)
        if endpoint is None:
            await _send_json(send, 503, "unavailable", "the hub is not serving yet")
            return
        await endpoint.manager.handle_request(scope, receive, send)

    return mcp_app


def _draining(holder: dict[str, Any]) -> bool:
    state = holder.get("state")
    return state is not None and bool(state.drain.active)


def _authorised(scope: Any, api_keys: tuple[str, ...]) -> bool:
    if not api_keys:
        return True
    header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
    scheme, _, given = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    ok = False
    for key in api_keys:  # compare with every key: constant time overall
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


async def _send_json(send: Any, status: int, code: str, message: str, **extra: Any) -> None:
    body = json.dumps({"error": {"code": code, "message": message, **extra}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["McpEndpoints", "mount_mcp"]
