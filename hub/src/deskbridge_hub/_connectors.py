"""The connectors page: ``/admin/``, a small live view of the desktops (issue 14 item 4).

One static HTML file and one script (``web/``), no build step, no CDN: the script
polls ``/admin/api/desktops`` (the admin API, under the page's path so the browser
sends its credentials) once a second with the browser's credentials for this origin
and renders online/offline with since-when, tools, queue depth and the jobs in flight
(``/admin/api/users/{id}`` for desktops with pending entries).

Authentication: the API key, as a bearer token or as the password of HTTP Basic (any user
name), which is what a browser can send: an unauthenticated request to ``/admin/`` gets
``401`` with ``WWW-Authenticate: Basic`` and the browser asks once, then sends the same
credentials with the page's API requests (same origin). The page's Content-Security-Policy
allows only its own script and nothing from elsewhere.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from quart import Response, redirect

#: Sent with the page and its script: nothing loads from anywhere but this origin.
CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'"
)


def _static(name: str) -> bytes:
    return resources.files("deskbridge_hub").joinpath("web", name).read_bytes()


def register(app: Any) -> None:
    """Add ``/admin``, ``/admin/`` and ``/admin/connectors.js`` to ``app``."""

    def _file(name: str, content_type: str) -> Response:
        response = Response(_static(name), status=200, content_type=content_type)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/admin")
    async def admin_root():  # type: ignore[no-untyped-def]
        return redirect("/admin/", 308)

    @app.get("/admin/")
    async def connectors_page():  # type: ignore[no-untyped-def]
        return _file("connectors.html", "text/html; charset=utf-8")

    @app.get("/admin/connectors.js")
    async def connectors_script():  # type: ignore[no-untyped-def]
        return _file("connectors.js", "text/javascript; charset=utf-8")
