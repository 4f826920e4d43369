"""Review: the browser route's redirect check (``_navigation.route_request``) against
Debian's Chromium and a site served here: the Location the route checks must be the URL
the browser goes to, and a redirect it hands over must still be checked when followed."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trio
from deskbridge_sidecar import ToolRegistry, invoke
from deskbridge_sidecar.toolsets import BrowserToolset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        port = self.server.server_address[1]
        hops = {
            "/twice": "/away",  # same origin first (handed over), then off the list
            "/away": f"http://localhost:{port}/landing",
        }
        if self.path in hops:
            self.send_response(302)
            self.send_header("Location", hops[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = b"<html><head><title>Landing</title></head><body>here</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site():
    with _site() as url:
        yield url


@pytest.fixture(scope="module")
def tools(site, tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("no chromium")
    toolset = BrowserToolset(
        [site],
        profile_dir=str(tmp_path_factory.mktemp("p")),
        executable_path=CHROMIUM,
        headless=True,
    )
    yield ToolRegistry(toolset.tools(), builtins=False)
    toolset.close()


async def _open_and_tabs(tools, url):
    with trio.fail_after(60):
        opened = await invoke(tools.get("browser_open"), {"url": url})
        tabs = (await invoke(tools.get("browser_tabs"), {})).result["tabs"]
    return opened, [t["url"] for t in tabs]


@pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/security.md): a redirect to another origin is followed; the "
    "route that fetched documents itself (reverted) let the second hop escape too",
)
async def test_a_second_redirect_to_another_origin_is_blocked(tools, site):
    opened, urls = await _open_and_tabs(tools, f"{site}/twice")
    assert not any(u.startswith("http://localhost") for u in urls), (opened, urls)
