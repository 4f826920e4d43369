"""Review: documents fetched by the browser route (``_navigation``, ``route.fetch``) are sent
by Playwright's API request context, not by Chromium's network stack: a cross-site form
POST between two allowed origins carries the target's ``SameSite=Strict`` / ``Lax``
cookies and no ``Sec-Fetch-Site``. Chromium itself sends neither cookie on that request,
so a page of one allowed origin (any content it shows) can forge signed-in requests to
another allowed origin that SameSite or Fetch Metadata protected before."""

from __future__ import annotations

import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trio
from deskbridge_sidecar import ToolRegistry, invoke
from deskbridge_sidecar.toolsets import BrowserToolset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
POSTS: list[tuple[str | None, str | None]] = []


class _Handler(BaseHTTPRequestHandler):
    def _page(self, body: str, *cookies: str) -> None:
        data = f"<html><head><title>t</title></head><body>{body}</body></html>".encode()
        self.send_response(200)
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        port = self.server.server_address[1]
        if self.path == "/signin":
            self._page("in", "lax=1; Path=/; SameSite=Lax", "strict=1; Path=/; SameSite=Strict")
        elif self.path == "/form":  # on the other origin: a form posting across sites
            action = f"http://localhost:{port}/transfer"
            self._page(f"<form method=post action='{action}'><input name=a value=1>"
                       "<button id=go>go</button></form>")  # fmt: skip
        else:
            self._page("x")

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        POSTS.append((self.headers.get("Cookie"), self.headers.get("Sec-Fetch-Site")))
        self._page("done")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_a_cross_site_form_post_carries_no_samesite_cookies(port, tmp_path):
    """Found by review: a route that fetched documents itself (for redirects) sent them
    from Playwright's HTTP client with every cookie, whatever its SameSite; reverted."""
    if CHROMIUM is None:
        pytest.skip("no chromium")
    here, other = f"http://127.0.0.1:{port}", f"http://localhost:{port}"
    toolset = BrowserToolset(
        [here, other], profile_dir=str(tmp_path / "p"), executable_path=CHROMIUM, headless=True
    )
    tools = ToolRegistry(toolset.tools(), builtins=False)
    try:
        with trio.fail_after(60):
            assert (await invoke(tools.get("browser_open"), {"url": f"{other}/signin"})).ok
            assert (await invoke(tools.get("browser_open"), {"url": f"{here}/form"})).ok
            assert (await invoke(tools.get("browser_click"), {"selector": "#go"})).ok
    finally:
        toolset.close()
    assert len(POSTS) == 1
    cookie, site = POSTS[0]
    assert cookie is None, f"a cross-site POST carried {cookie!r} (Sec-Fetch-Site: {site})"
