"""Every way a page of an allowed origin can make the browser reach another origin, against
Debian's Chromium: redirects at any hop (documents, frames, popups, fetch, XHR, images, a
307 form POST), meta refresh, script navigation, frames, popups, fetch, images, beacons,
prefetch, form posts, workers and WebSockets. The site answers on 127.0.0.1 (allowed) and
is reachable as ``localhost`` (not allowed); it records the Host of every request, so a
request that got through is seen, not guessed. Playwright's route sees none of the
redirected requests nor WebSockets: the allow-list proxy (``toolsets/_socks.py``) refuses
their connections."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

import pytest
import trio
from deskbridge_sidecar import ToolRegistry, invoke
from deskbridge_sidecar.toolsets._origins import OriginPolicy
from deskbridge_sidecar.toolsets._socks import authority_allowed, blocked_report

from tests.sites import serve

from ._browser import headless_toolset

HOSTS: list[str] = []  # "Host METHOD path" of every request the site received

#: A page of the allowed origin ({other}: the same site under a name off the list,
#: {here}: the allowed origin) doing one thing on load, or when #go is clicked.
PAGES = {
    "/multi-hop": None,  # a redirect to /hop2 (same origin), then to {other}
    "/meta-refresh": '<meta http-equiv="refresh" content="0;url=/hop2">',
    "/js-location": "<script>location.href = '/hop2'</script>",
    "/popup": "<button id=go onclick=\"window.open('/hop2')\">go</button>",
    "/popup-off": "<button id=go onclick=\"window.open('{other}/landing')\">go</button>",
    "/iframe": "<iframe src='/hop2'></iframe>",
    "/iframe-off": "<iframe src='{other}/landing'></iframe>",
    "/fetch": "<script>fetch('/hop2').catch(() => {})</script>",
    "/fetch-off": "<script>fetch('{other}/x', {mode: 'no-cors'}).catch(() => {})</script>",
    "/xhr": "<script>const x = new XMLHttpRequest(); x.open('GET', '/hop2'); x.send()</script>",
    "/img": "<img src='/hop2'><img src='{other}/pixel'>",
    "/beacon": "<script>navigator.sendBeacon('{other}/beacon', 'data')</script>",
    "/prefetch": "<link rel=prefetch href='{other}/prefetched'>",
    "/form-post-off": "<form method=post action='{other}/transfer'><input name=a value=1>"
    "<button id=go>go</button></form>",
    "/form-post-307": "<form method=post action='/307'><input name=a value=1>"
    "<button id=go>go</button></form>",
    "/websocket": "<script>new WebSocket('ws://localhost:{port}/socket')</script>",
    "/worker": "<script>new Worker(URL.createObjectURL(new Blob(["
    "\"fetch('{here}/hop2').catch(() => {}); fetch('{other}/w').catch(() => {})\"])))</script>",
}


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        HOSTS.append(f"{self.headers.get('Host')} {self.command} {self.path}")
        port = self.server.server_address[1]
        here, other = f"http://127.0.0.1:{port}", f"http://localhost:{port}"
        hops = {"/multi-hop": "/hop2", "/hop2": f"{other}/landing", "/307": f"{other}/transfer"}
        if self.path in hops:
            self.send_response(307 if self.path == "/307" else 302)
            self.send_header("Location", hops[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = PAGES.get(self.path) or "<h1>Landed</h1>"
        body = body.replace("{other}", other).replace("{here}", here).replace("{port}", str(port))
        data = f"<html><head><title>t</title></head><body>{body}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args) -> None:
        pass


class _Blocked(list):
    """The toolset's ``blocked`` list, with an event for an entry naming ``localhost``
    (appended on the browser's asyncio thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.other = threading.Event()

    def append(self, item: str) -> None:
        super().append(item)
        if "localhost" in item:
            self.other.set()


@pytest.fixture(scope="module")
def site():
    with serve(_Handler) as url:
        yield url


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    toolset = headless_toolset([site], tmp_path_factory.mktemp("p"))
    toolset._blocked = _Blocked()  # before the browser starts: the proxy appends to it
    yield toolset, ToolRegistry(toolset.tools(), builtins=False)
    toolset.close()


def _reached_other() -> list[str]:
    return [h for h in HOSTS if h.startswith("localhost")]


@pytest.mark.parametrize("path", sorted(PAGES))
async def test_no_way_off_the_allowed_origin_reaches_another_origin(browser, site, path):
    toolset, tools = browser
    HOSTS.clear()
    toolset._blocked.other.clear()
    with trio.fail_after(60):
        opened = await invoke(tools.get("browser_open"), {"url": f"{site}{path}", "new_tab": True})
        if "id=go" in (PAGES[path] or ""):
            assert opened.ok, opened
            click = {"selector": "#go", "tab": opened.result["tab"]}
            assert (await invoke(tools.get("browser_click"), click)).ok
    # The block itself may come after the tool answered (a popup, a frame, a worker).
    assert await trio.to_thread.run_sync(toolset._blocked.other.wait, 10), "never blocked"
    assert not _reached_other(), _reached_other()
    tabs = (await invoke(tools.get("browser_tabs"), {})).result["tabs"]
    assert not any(t["url"].startswith("http://localhost") for t in tabs), tabs
    for tab in tabs:  # each case opens its own tab
        await invoke(tools.get("browser_close_tab"), {"tab": tab["tab"]})


def test_a_connection_is_allowed_only_to_a_host_and_port_of_an_allowed_origin():
    policy = OriginPolicy(["https://portal.example", "http://127.0.0.1:8123", "http://[::1]:81"])
    assert authority_allowed(policy, "portal.example", 443)
    assert authority_allowed(policy, "PORTAL.example", 443)  # names are case-blind
    assert not authority_allowed(policy, "portal.example", 80)  # http://portal.example: no
    assert authority_allowed(policy, "127.0.0.1", 8123) and authority_allowed(policy, "::1", 81)
    assert not authority_allowed(policy, "localhost", 8123)  # a name is not its address
    hostile = ["evil.test/x@portal.example", "evil.test\\@portal.example", "portal.example:1"]
    hostile += ["evil.test#portal.example", "portal.example.", "", "portal.example\t"]
    for host in hostile:
        assert not authority_allowed(policy, host, 443), host


def test_blocked_names_each_destination_once_with_its_url_when_the_route_saw_it():
    report = blocked_report(
        ["127.0.0.2:80", "http://127.0.0.2/landing", "127.0.0.2:80", "localhost:81",
         "localhost:81", "https://[::2]/x", "[::2]:443"]
    )  # fmt: skip
    assert report == ["http://127.0.0.2/landing", "localhost:81", "https://[::2]/x"]
