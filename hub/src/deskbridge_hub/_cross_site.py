"""Refuse what a browser sends on behalf of another site (CSRF) to every route behind the
API key.

Why: the connectors page (``/admin/``) is authenticated with HTTP Basic, which a browser
caches and attaches by itself to later requests of that protection space; the challenge
of ``/admin`` covers the whole origin (its directory is ``/``). A page of any other site
the operator visits could then submit a ``text/plain`` form whose body is valid JSON to
``POST /v1/users/{id}/jobs`` (or the MCP endpoint, or ``DELETE /v1/jobs/{id}``) and run
any tool on any desktop. Browsers say where a request comes from: ``Sec-Fetch-Site``
(``cross-site``, ``same-site``, ``same-origin``, ``none``) and ``Origin``; API clients
(curl, httpx, the MCP SDK) send neither, and are not affected.

Rule, on HTTP requests to paths that need the key (``_http._needs_key``): refused with
**403** ``cross_site_request`` when ``Sec-Fetch-Site`` is present and neither
``same-origin`` nor ``none`` (except a top-level ``GET``/``HEAD`` navigation, whose
answer only the operator's own window sees: a link to the page from a wiki), or when
``Origin`` is present and is ``null`` or names another host than ``Host``; and, on a
hub with no API key (loopback), when ``Host`` is not a loopback name (DNS rebinding).
Checked before the key and before the body is read.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from deskbridge_common import _codes

from ._http import _needs_key, asgi_headers
from ._mcp_answers import MCP_PATH, error_body, send_body

CODE = _codes.CROSS_SITE_REQUEST
_SAFE_SITES = frozenset({"same-origin", "none"})


def refusal(method: str, path: str, headers: dict[str, str], *, keyed: bool = True) -> str | None:
    """Why this request is refused as cross-site, or None.

    Args:
        method: the HTTP method.
        path: the request path.
        headers: header names in lower case -> value (the first of each).
        keyed: an API key is configured; without one only loopback host names are
            served (DNS rebinding: a page whose name now resolves to 127.0.0.1 is
            same-origin to the browser).
    """
    if not _needs_key(path):
        return None
    if not keyed and not _loopback_name(headers.get("host", "")):
        return (
            f"Host {headers.get('host', '')[:100]!r} is not a loopback name, and this hub has "
            "no API key (DNS rebinding)"
        )
    site = headers.get("sec-fetch-site")
    navigation = method in ("GET", "HEAD") and headers.get("sec-fetch-mode") == "navigate"
    if site is not None and site not in _SAFE_SITES and not navigation:
        return f"a browser request from another site (Sec-Fetch-Site: {site[:32]})"
    origin = headers.get("origin")
    if origin is not None:
        if origin == "null" or urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return f"a browser request from another origin (Origin: {origin[:100]})"
    return None


def _loopback_name(host: str) -> bool:
    """``localhost`` (or a name under it) or a loopback address, with or without a port."""
    name = urlsplit(f"//{host}").hostname or ""
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def guard(asgi_app: Any, api_keys: tuple[str, ...] = ("",)) -> Any:
    """ASGI middleware: answers 403 ``cross_site_request`` (:func:`refusal`) before
    ``asgi_app`` sees the request.

    Args:
        asgi_app: the app.
        api_keys: the configured keys; none: only loopback host names are served.
    """
    keyed = bool(api_keys)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = asgi_headers(scope)
            why = refusal(scope.get("method", ""), scope.get("path", ""), headers, keyed=keyed)
            if why is not None and MCP_PATH.match(scope.get("path", "")):
                # as every refusal on the MCP endpoint: a JSON-RPC error an MCP client reads
                message = f"refused: {why}; the MCP endpoint is for backends"
                await send_body(send, 403, error_body(403, CODE, message))
                return
            if why is not None:
                body = json.dumps(
                    {"error": {"code": CODE, "message": f"refused: {why}; the API is for "
                               "backends, the connectors page for same-origin use"}}
                ).encode()  # fmt: skip
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body)),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await asgi_app(scope, receive, send)

    return app


__all__ = ["CODE", "guard", "refusal"]
