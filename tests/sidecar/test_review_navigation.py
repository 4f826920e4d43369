"""Review: a redirect chain against Debian's Chromium and a site served here: a first hop
on the same origin, then one to another origin, which must be refused at that hop (the
allow-list proxy, ``toolsets/_socks.py``; a route that fetched documents itself let the
second hop escape and was reverted)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
import trio
from deskbridge_sidecar import ToolRegistry, invoke

from tests.sites import serve

from ._browser import headless_toolset

HOSTS: list[str] = []  # the Host of every request the site answered


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        HOSTS.append(self.headers.get("Host", ""))
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


@pytest.fixture(scope="module")
def site():
    with serve(_Handler) as url:
        yield url


@pytest.fixture(scope="module")
def tools(site, tmp_path_factory):
    toolset = headless_toolset([site], tmp_path_factory.mktemp("p"))
    yield ToolRegistry(toolset.tools(), builtins=False)
    toolset.close()


async def _open_and_tabs(tools, url):
    with trio.fail_after(60):
        opened = await invoke(tools.get("browser_open"), {"url": url})
        tabs = (await invoke(tools.get("browser_tabs"), {})).result["tabs"]
    return opened, [t["url"] for t in tabs]


async def test_a_second_redirect_to_another_origin_is_blocked(tools, site):
    opened, urls = await _open_and_tabs(tools, f"{site}/twice")
    assert not any(u.startswith("http://localhost") for u in urls), (opened, urls)
    assert not opened.ok, opened  # the navigation failed at the refused hop
    assert not any(h.startswith("localhost") for h in HOSTS), HOSTS  # nothing reached it
