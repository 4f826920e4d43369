"""The browser toolset, headless, against Debian's Chromium and pages served by the test
on loopback: a form, a slow page, pages that navigate away mid-click, a link to an origin
that is not allowed. One browser for the module (launching takes seconds)."""

from __future__ import annotations

import base64
import time

import pytest
import trio
from deskbridge_sidecar import ToolError, ToolRegistry, invoke
from deskbridge_sidecar.toolsets import BrowserToolset
from deskbridge_sidecar.toolsets.browser import OriginPolicy, origin_of

from tests.sites import serve_site

from ._browser import headless_toolset


@pytest.fixture(scope="module")
def site():
    with serve_site() as url:
        yield url


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    toolset = headless_toolset([site], tmp_path_factory.mktemp("profile"))
    yield toolset
    toolset.close()


@pytest.fixture
def tools(browser):
    return ToolRegistry(browser.tools(), builtins=False)


async def call(tools, name, **args):
    with trio.fail_after(60):
        return await invoke(tools.get(name), args)


async def test_fill_and_submit_a_form(tools, site):
    opened = await call(tools, "browser_open", url=f"{site}/form")
    assert opened.ok, opened.error
    assert opened.result["title"] == "Form" and opened.result["status"] == 200
    filled = await call(tools, "browser_fill", selector="#name", value="Ada")
    assert filled.ok, filled.error
    clicked = await call(tools, "browser_click", selector="#send")
    assert clicked.ok and clicked.result["url"] == f"{site}/submitted?name=Ada"
    text = await call(tools, "browser_text", selector="#r")
    assert text.result["text"] == "Hello Ada"
    page = await call(tools, "browser_text", max_chars=5)
    assert page.result["text"] == "Hello" and page.result["truncated"]


async def test_screenshot_is_a_base64_png_with_its_size(tools, site):
    assert (await call(tools, "browser_open", url=f"{site}/landing")).ok
    shot = await call(tools, "browser_screenshot")
    assert shot.ok, shot.error
    png = base64.b64decode(shot.result["png_base64"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) == shot.result["bytes"]
    assert shot.result["width"] > 100 and shot.result["height"] > 100
    element = await call(tools, "browser_screenshot", selector="h1")
    assert element.ok and element.result["width"] < shot.result["width"]


async def test_a_slow_page_times_out_cleanly_and_cancellation_reaches_the_browser(tools, site):
    timed_out = await call(tools, "browser_open", url=f"{site}/slow", timeout_s=0.5)
    assert timed_out.code == "timeout"
    assert (await call(tools, "browser_open", url=f"{site}/landing", new_tab=True)).ok
    # A call cancelled from trio (the hub's cancel) cancels the Playwright operation.
    outcome = None
    with trio.move_on_after(0.5) as scope:
        outcome = await invoke(tools.get("browser_open"), {"url": f"{site}/slow", "timeout_s": 30})
    assert scope.cancelled_caught, outcome
    t0 = time.monotonic()
    after = await call(tools, "browser_open", url=f"{site}/landing")
    assert after.ok and after.result["title"] == "Landing"
    assert time.monotonic() - t0 < 2.5  # not queued behind the abandoned 3 s load


async def test_pages_that_navigate_away_mid_click(tools, site):
    assert (await call(tools, "browser_open", url=f"{site}/away")).ok
    went = await call(tools, "browser_click", selector="#go")
    assert went.ok and went.result["url"] == f"{site}/landing"
    assert went.result["title"] == "Landing"
    # The page leaves on mousedown, before the click completes: the tool answers
    # (success or a clean browser error), never hangs, and the browser stays usable.
    assert (await call(tools, "browser_open", url=f"{site}/away")).ok
    early = await call(tools, "browser_click", selector="#early", timeout_s=5)
    assert early.ok or early.code in ("browser_error", "timeout"), early
    where = await call(tools, "browser_text")
    assert where.ok and where.result["url"] == f"{site}/landing"


async def test_wait_for_tabs_and_close(tools, site):
    assert (await call(tools, "browser_open", url=f"{site}/late")).ok
    waited = await call(tools, "browser_wait_for", selector="#late")
    assert waited.ok and waited.result["state"] == "visible"
    missing = await call(tools, "browser_wait_for", selector="#never", timeout_s=0.3)
    assert missing.code == "timeout"
    second = await call(tools, "browser_open", url=f"{site}/landing", new_tab=True)
    listed = (await call(tools, "browser_tabs")).result["tabs"]
    assert listed[-1]["tab"] == second.result["tab"] and listed[-1]["current"]
    assert len(listed) >= 2
    closed = await call(tools, "browser_close_tab", tab=second.result["tab"])
    assert closed.ok
    left = (await call(tools, "browser_tabs")).result["tabs"]
    assert second.result["tab"] not in [t["tab"] for t in left]
    gone = await call(tools, "browser_text", tab=second.result["tab"])
    assert gone.code == "no_tab"
    assert (await call(tools, "browser_click", selector="#nothing-here", timeout_s=0.3)).code == (
        "timeout"
    )


async def test_origins_outside_the_list_are_denied(tools, site):
    port = site.rsplit(":", 1)[1]
    refused = await call(tools, "browser_open", url=f"http://127.0.0.2:{port}/landing")
    assert refused.code == "origin_not_allowed"
    assert (await call(tools, "browser_open", url="file:///etc/passwd")).code == (
        "origin_not_allowed"
    )
    assert (await call(tools, "browser_open", url=f"{site}/outlink")).ok
    clicked = await call(tools, "browser_click", selector="#out")
    assert clicked.ok, clicked
    # the browser's own background requests (docs/tools.md: e.g. Chrome's autofill
    # service, content-autofill.googleapis.com:443) may be refused and listed too; of the
    # test's hosts only the off-list landing is
    ours = [b for b in clicked.result["blocked"] if "127.0.0." in b]
    assert ours == [f"http://127.0.0.2:{port}/landing"], clicked.result["blocked"]
    assert clicked.result["url"] == f"{site}/outlink"  # still there


def test_origin_policy():
    policy = OriginPolicy(["https://portal.example.com", "https://*.corp.example", "http://h:81"])
    assert policy.allows("https://portal.example.com/a?b")
    assert policy.allows("https://portal.example.com:443/")
    assert not policy.allows("http://portal.example.com/")
    assert not policy.allows("https://portal.example.com.evil.test/")
    assert policy.allows("https://a.corp.example/x") and not policy.allows("https://corp.example/")
    assert policy.allows("http://h:81/") and not policy.allows("http://h/")
    assert policy.allows("about:blank") and not policy.allows("file:///etc/passwd")
    assert origin_of("HTTPS://Portal.Example.com/x") == "https://portal.example.com"
    with pytest.raises(ValueError, match="without a path"):
        BrowserToolset(["https://portal.example.com/login"], executable_path="/bin/true")
    with pytest.raises(ValueError, match="at least one"):
        BrowserToolset([], executable_path="/bin/true")


#: URLs that used to crash browser_open (``crashed``, a ValueError and a traceback in the
#: log): no browser is needed, they are refused before the tool runs.
MALFORMED_URLS = [
    "http://127.0.0.1:18123.evil.com/",  # a port that is not a number
    "http://[::1",  # an unclosed bracket
    "http://127.0.0.1:99999/",  # a port out of range
    "http://127.0.0.1:18123:1/",  # two ports
    "http://evil.test\\@127.0.0.1:18123/",  # evil.test to a browser, 127.0.0.1 to urllib
    "http://127.0.0.1:18123\t.evil.test/",  # a browser drops the tab
    "http:///landing",  # no host
]


@pytest.fixture
def offline_tools():
    """The browser tools with no browser behind them: any launch would fail."""
    toolset = BrowserToolset(["http://127.0.0.1:18123"], executable_path="/bin/false")
    yield toolset, ToolRegistry(toolset.tools(), builtins=False)
    toolset.close()


@pytest.mark.parametrize("url", MALFORMED_URLS)
async def test_a_malformed_url_is_refused_bad_args_before_anything_runs(offline_tools, url):
    toolset, tools = offline_tools
    tool = tools.get("browser_open")
    problem = tool.check_args({"url": url})  # the daemon's check before queueing the job
    assert problem is not None and "url: Value error, not a valid URL: " in problem
    outcome = await call(tools, "browser_open", url=url)
    assert outcome.code == "bad_args" and "not a valid URL" in outcome.error.message
    assert toolset._context is None  # no browser was started
    # Called directly (no argument check), it is not an allowed origin: never a crash.
    with pytest.raises(ToolError) as refused:
        await toolset.browser_open(url)
    assert refused.value.code == "origin_not_allowed"
    assert not toolset.policy.allows(url) and origin_of(url) is None


def test_the_published_url_schema_is_still_a_plain_string(offline_tools):
    _, tools = offline_tools
    schema = tools.get("browser_open").args_schema
    assert schema["properties"]["url"]["type"] == "string"
    assert "allow-list" in schema["properties"]["url"]["description"]
    assert tools.get("browser_open").check_args({"url": "http://127.0.0.1:18123/x y"}) is None


async def test_the_route_blocks_a_malformed_navigation_instead_of_failing():
    toolset = BrowserToolset(["http://127.0.0.1:18123"], executable_path="/bin/false")

    class Route:
        aborted: str | None = None

        class request:  # noqa: N801 - Playwright's shape
            url = "http://127.0.0.1:99999/"

            @staticmethod
            def is_navigation_request() -> bool:
                return True

        async def abort(self, reason: str) -> None:
            self.aborted = reason

    route = Route()
    await toolset._route(route)
    assert route.aborted == "aborted" and toolset._blocked == ["http://127.0.0.1:99999/"]


def test_a_malformed_allowed_origin_is_a_one_line_configuration_error():
    for bad in ("http://h:99999", "http://[::1", "http://h:1:2"):
        with pytest.raises(ValueError, match="must look like https://host"):
            BrowserToolset([bad], executable_path="/bin/true")
    assert origin_of("http://h:0/") == "http://h:0"  # port 0 is not the default port


#: URLs with no origin on any allow-list: each would put a page the agent wrote (its own
#: script, a fake sign-in form) into the user's signed-in browser, or read local files.
ORIGINLESS_URLS = [
    "data:text/html,<script>fetch('http://192.168.1.1/')</script>",
    "data:text/html;base64,PGgxPlNpZ24gaW48L2gxPg==",
    "DATA:text/html,<h1>x</h1>",
    "javascript:alert(document.cookie)",
    "file:///etc/passwd",
    "blob:http://127.0.0.1:18123/0b1d",
    "view-source:http://127.0.0.1:18123/",
    "filesystem:http://127.0.0.1:18123/temporary/x",
    "about:settings",
]


@pytest.mark.parametrize("url", ORIGINLESS_URLS)
async def test_a_url_without_an_allowed_origin_is_refused_before_any_browser(offline_tools, url):
    """``data:`` was allowed (``OriginPolicy.allows``): ``browser_open`` showed an agent's
    own HTML and script in the user's browser, outside every allowed origin."""
    toolset, tools = offline_tools
    outcome = await call(tools, "browser_open", url=url)
    assert outcome.code == "origin_not_allowed", outcome
    assert toolset._context is None  # no browser was started
    assert not toolset.policy.allows(url)


async def _nowhere_else(tools, site):
    """No tab is on another origin (``localhost`` is the test site under another name)."""
    tabs = (await call(tools, "browser_tabs")).result["tabs"]
    assert all(not t["url"].startswith("http://localhost") for t in tabs), tabs
    assert all(t["title"] != "Landing" or t["url"].startswith(site) for t in tabs), tabs


async def test_a_redirect_to_another_origin_is_blocked(tools, site):
    """Playwright routes a request, not the requests its redirects make: a 302 from an
    allowed page to another origin was followed (the tab ended on that origin). The
    allow-list proxy refuses the connection the redirect needs."""
    hop = await call(tools, "browser_open", url=f"{site}/hop")  # same origin: followed
    assert hop.ok and hop.result["url"] == f"{site}/landing", hop
    opened = await call(tools, "browser_open", url=f"{site}/redirect")
    assert not opened.ok, opened  # the navigation was aborted
    await _nowhere_else(tools, site)
    assert (await call(tools, "browser_open", url=f"{site}/jump")).ok
    clicked = await call(tools, "browser_click", selector="#go")
    assert clicked.ok and any("localhost" in u for u in clicked.result["blocked"]), clicked
    await _nowhere_else(tools, site)


async def test_a_popup_or_a_meta_refresh_to_another_origin_is_blocked(tools, site):
    assert (await call(tools, "browser_open", url=f"{site}/popup")).ok
    popped = await call(tools, "browser_click", selector="#pop")
    assert popped.ok, popped
    await trio.sleep(1)  # the popup's navigation is asynchronous to the click
    await _nowhere_else(tools, site)
    assert (await call(tools, "browser_open", url=f"{site}/refresh")).ok
    await trio.sleep(1)  # a 0 s refresh
    await _nowhere_else(tools, site)


async def test_a_form_post_still_carries_its_body(tools, site):
    """Through the allow-list proxy (it relays bytes) a POST keeps its body."""
    assert (await call(tools, "browser_open", url=f"{site}/postform")).ok
    assert (await call(tools, "browser_fill", selector="#name", value="Ada")).ok
    clicked = await call(tools, "browser_click", selector="#send")
    assert clicked.ok and clicked.result["url"] == f"{site}/posted", clicked
    assert (await call(tools, "browser_text", selector="#r")).result["text"] == "Got Ada"
