"""The *browser* toolset: Playwright driving the user's installed Chrome/Chromium over a
persistent profile directory, so the user's signed-in sessions stay on the laptop.

Opt-in: offered only when the user names the origins it may visit
(``deskbridge-sidecar run --browser-origin https://portal.example.com``). Nothing may reach
any other origin: ``browser_open`` refuses it up front (``origin_not_allowed``); a request
route aborts a page's navigation (a link, a script, a frame, a popup) or http(s)
sub-resource to it, its URL reported in the tool's ``blocked`` list; and the browser's only
way out is a SOCKS5 proxy on loopback (:mod:`._socks`) that refuses a connection to a host
and port off the list, for what the route never sees (the requests a redirect makes, at any
hop; WebSockets; workers), reported as ``host:port``. Cookies, ``SameSite`` and TLS stay the
browser's own: nothing is fetched on its behalf.

Never downloads a browser: ``executable_path`` is the installed Chromium or Chrome (found
on ``PATH`` unless configured). One browser per daemon, started on the first browser tool
and closed with the daemon; its operations run on one asyncio thread
(:mod:`._asyncio_host`), after the daemon's tool lock. Tabs have small integer ids; a tool
without ``tab`` acts on the current tab (the last one opened or used).

A malformed URL argument (a port that is not a number in 0-65535, an unclosed ``[``, a
backslash or a control character) is refused ``bad_args`` by the argument check, before
the tool runs; a direct call gets ``origin_not_allowed`` (:meth:`OriginPolicy.allows` and
:func:`origin_of` never raise, so the request route denies such a URL too).

Error codes (``ToolError.code``): ``origin_not_allowed``, ``no_tab``, ``timeout``,
``browser_error`` (Playwright's message: element not found, detached mid-click,
navigation failed...), ``too_large`` (a screenshot over ``MAX_SCREENSHOT_BYTES``),
``not_installed``.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import logging
import os
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import attrs
from pydantic import AfterValidator

from .._tools import Tool, ToolError
from ._asyncio_host import AsyncioHost
from ._origins import EXECUTABLES, OriginPolicy, check_url, find_browser, origin_of
from ._socks import AllowListSocks, blocked_report, proxy_args

log = logging.getLogger("deskbridge.sidecar.browser")

#: Largest PNG a screenshot returns, bytes: base64 adds a third, and a result frame holds
#: at most 1 MiB (``MAX_FRAME_BYTES``).
MAX_SCREENSHOT_BYTES = 700_000
#: Longest page text returned by default, characters.
MAX_TEXT_CHARS = 100_000
#: Flags always passed (no first-run UI, no background traffic of the browser's own).
BASE_ARGS = ("--no-first-run", "--disable-background-networking", "--disable-component-update")
#: Default profile directory.
DEFAULT_PROFILE = os.path.join("~", ".deskbridge", "browser-profile")

WaitUntil = Literal["load", "domcontentloaded", "networkidle", "commit"]
#: A tool's URL argument: a malformed one (:func:`._origins.url_problem`) is refused
#: ``bad_args`` by the sidecar's argument check, before the tool (or the browser) runs.
Url = Annotated[str, AfterValidator(check_url)]


def _png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return (0, 0)
    width, height = struct.unpack(">II", data[16:24])
    return (width, height)


@attrs.define(eq=False, slots=False)  # Playwright tags handler callables with attributes
class BrowserToolset:
    """The browser tools, bound to one browser.

    Args:
        allowed_origins: see :class:`OriginPolicy` (at least one).
        profile_dir: the persistent profile (cookies, signed-in sessions).
        executable_path: the browser binary (default: :func:`find_browser`).
        headless: run without a window (servers, tests); default False on a desktop.
        extra_args: more browser flags.

    Raises:
        ValueError: no origins, no browser found, or the ``playwright`` package missing.
    """

    allowed_origins: Sequence[str] = attrs.field(converter=tuple)
    profile_dir: str = DEFAULT_PROFILE
    executable_path: str | None = None
    headless: bool = False
    extra_args: Sequence[str] = attrs.field(default=(), converter=tuple)
    policy: OriginPolicy = attrs.field(init=False)
    host: AsyncioHost = attrs.field(init=False, factory=lambda: AsyncioHost("deskbridge-browser"))
    _playwright: Any = attrs.field(init=False, default=None)
    _context: Any = attrs.field(init=False, default=None)
    _tabs: dict[int, Any] = attrs.field(init=False, factory=dict)
    _current: int | None = attrs.field(init=False, default=None)
    _next_id: int = attrs.field(init=False, default=1)
    _blocked: list[str] = attrs.field(init=False, factory=list)
    _proxy: AllowListSocks | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if not self.allowed_origins:
            raise ValueError("the browser toolset needs at least one allowed origin")
        for pattern in self.allowed_origins:
            if origin_of(pattern.replace("*.", "x.")) != pattern.replace("*.", "x."):
                raise ValueError(
                    f"allowed origin {pattern!r} must look like https://host[:port] "
                    "(or https://*.domain), without a path"
                )
        self.policy = OriginPolicy(self.allowed_origins)
        self.profile_dir = os.path.expanduser(self.profile_dir)
        if importlib.util.find_spec("playwright") is None:
            raise ValueError(
                "the browser toolset needs Playwright: pip install 'deskbridge-sidecar[browser]'"
            )
        if self.executable_path is not None and not (
            os.path.isfile(self.executable_path) and os.access(self.executable_path, os.X_OK)
        ):
            raise ValueError(
                f"--browser-executable {self.executable_path}: not an executable file"
            )
        if self.executable_path is None:
            self.executable_path = find_browser()
        if self.executable_path is None:
            raise ValueError(
                f"no Chrome/Chromium found on PATH (looked for {', '.join(EXECUTABLES)}); "
                "install one or pass --browser-executable"
            )

    def tools(self) -> list[Tool]:
        """The toolset's tools, for :meth:`ToolRegistry.add`."""
        effects = {"browser_click", "browser_fill", "browser_close_tab"}
        # Part of each tool's fingerprint (a queued call meets the configuration it was
        # validated against, docs/tools.md): where it may go and whose signed-in
        # sessions it acts with. Not the binary or the window: they change how the
        # browser runs, not what a call does.
        config = json.dumps(
            [sorted(set(self.allowed_origins)), os.path.realpath(self.profile_dir)]
        )
        return [
            attrs.evolve(
                Tool.from_function(fn, name=fn.__name__, side_effects=fn.__name__ in effects),
                config=config,
            )
            for fn in (
                self.browser_open,
                self.browser_text,
                self.browser_click,
                self.browser_fill,
                self.browser_wait_for,
                self.browser_screenshot,
                self.browser_tabs,
                self.browser_close_tab,
            )
        ]

    def close(self) -> None:
        """Close the browser and its thread (blocking; call once the daemon has stopped)."""
        if self._context is not None:
            try:
                self.host.run_sync(self._shutdown)
            except Exception as exc:  # noqa: BLE001 - closing anyway
                log.warning("browser did not close cleanly: %r", exc)
        self.host.close()

    # -- tools (run in trio; each operation runs on the browser's asyncio thread) ----------

    async def browser_open(
        self, url: Url, new_tab: bool = False, wait_until: WaitUntil = "load", timeout_s: float = 30
    ) -> dict[str, Any]:
        """Open a URL (an allowed origin) in the current tab or a new one.

        Args:
            url: http(s) URL whose origin is on the allow-list (a malformed one is
                refused bad_args).
            new_tab: open in a new tab instead of the current one.
            wait_until: which load event to wait for.
            timeout_s: give up after this many seconds.
        """
        if not self.policy.allows(url):
            raise ToolError(
                f"{url!r} is not on the allowed origins {list(self.allowed_origins)}",
                code="origin_not_allowed",
            )
        return await self._run(self._open, url, new_tab, wait_until, timeout_s)

    async def browser_text(
        self, selector: str | None = None, tab: int | None = None, max_chars: int = MAX_TEXT_CHARS
    ) -> dict[str, Any]:
        """Read the visible text of the page, or of the first element matching a selector.

        Args:
            selector: a Playwright selector (CSS, ``text=...``); omit for the whole page.
            tab: tab id (default: the current tab).
            max_chars: cut the text at this many characters.
        """
        return await self._run(self._text, selector, tab, max_chars)

    async def browser_click(
        self, selector: str, tab: int | None = None, timeout_s: float = 10
    ) -> dict[str, Any]:
        """Click the element matching a selector; returns where the tab is afterwards.

        Args:
            selector: a Playwright selector.
            tab: tab id (default: the current tab).
            timeout_s: how long to wait for the element to be clickable.
        """
        return await self._run(self._click, selector, tab, timeout_s)

    async def browser_fill(
        self, selector: str, value: str, tab: int | None = None, timeout_s: float = 10
    ) -> dict[str, Any]:
        """Fill a form field (input, textarea, contenteditable) with a value.

        Args:
            selector: a Playwright selector for the field.
            value: the text to put in it (replaces what is there).
            tab: tab id (default: the current tab).
            timeout_s: how long to wait for the field.
        """
        return await self._run(self._fill, selector, value, tab, timeout_s)

    async def browser_wait_for(
        self,
        selector: str,
        state: Literal["attached", "detached", "visible", "hidden"] = "visible",
        tab: int | None = None,
        timeout_s: float = 10,
    ) -> dict[str, Any]:
        """Wait until an element matching a selector reaches a state.

        Args:
            selector: a Playwright selector.
            state: what to wait for.
            tab: tab id (default: the current tab).
            timeout_s: give up after this many seconds.
        """
        return await self._run(self._wait_for, selector, state, tab, timeout_s)

    async def browser_screenshot(
        self, selector: str | None = None, full_page: bool = False, tab: int | None = None
    ) -> dict[str, Any]:
        """Take a PNG screenshot of the tab (or of one element), returned base64-encoded.

        Args:
            selector: screenshot only this element.
            full_page: the whole scrollable page instead of the viewport.
            tab: tab id (default: the current tab).
        """
        return await self._run(self._screenshot, selector, full_page, tab)

    async def browser_tabs(self) -> dict[str, Any]:
        """List the open tabs: id, URL, title, and which one is current."""
        return await self._run(self._list_tabs)

    async def browser_close_tab(self, tab: int) -> dict[str, Any]:
        """Close a tab.

        Args:
            tab: tab id (from browser_tabs or browser_open).
        """
        return await self._run(self._close_tab, tab)

    # -- the asyncio side ------------------------------------------------------------------

    async def _run(self, fn: Any, *args: Any) -> dict[str, Any]:
        return await self.host.run(self._guarded, fn, *args)

    async def _guarded(self, fn: Any, *args: Any) -> dict[str, Any]:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        await self._ensure()
        self._blocked.clear()
        try:
            result: dict[str, Any] = await fn(*args)
        except PlaywrightTimeout as exc:
            raise ToolError(_first_line(exc), code="timeout") from None
        except PlaywrightError as exc:
            raise ToolError(_first_line(exc), code="browser_error") from None
        if self._blocked:
            result["blocked"] = blocked_report(self._blocked)
        return result

    async def _ensure(self) -> None:
        if self._context is not None:
            return
        from playwright.async_api import async_playwright

        args = [*BASE_ARGS, *self.extra_args]
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        if self.headless:
            args.append("--disable-gpu")
        if root:
            args.append("--no-sandbox")  # Chromium refuses to sandbox as root
        profile = self.profile_dir
        os.makedirs(profile, exist_ok=True)
        self._proxy = AllowListSocks(self.policy, self._blocked.append)
        args += proxy_args(await self._proxy.start())
        self._playwright = await async_playwright().start()
        try:
            self._context = await self._playwright.chromium.launch_persistent_context(
                profile,
                executable_path=self.executable_path,
                headless=self.headless,
                args=args,
                chromium_sandbox=not root,
                service_workers="block",  # every document request goes through the route
            )
        except BaseException:
            await self._playwright.stop()
            self._playwright = None
            await self._proxy.close()
            raise
        await self._context.route("**/*", self._route)
        self._context.on("page", self._adopt)
        for page in self._context.pages:
            self._adopt(page)
        log.info("browser started: %s (profile %s)", self.executable_path, profile)

    async def _shutdown(self) -> None:
        try:
            if self._context is not None:
                await self._context.close()
        finally:
            self._context = None
            self._tabs.clear()
            if self._playwright is not None:
                await self._playwright.stop()
                self._playwright = None
            if self._proxy is not None:
                await self._proxy.close()

    async def _route(self, route: Any) -> None:
        """Abort a request to an origin off the list that Playwright lets us see: a
        navigation (any scheme) or an http(s) sub-resource, with its whole URL in
        ``blocked``. Playwright does not route the requests a redirect makes, nor
        WebSockets: the proxy (:mod:`._socks`) refuses those connections."""
        request = route.request
        url = request.url
        network = url.startswith(("http:", "https:"))
        if (request.is_navigation_request() or network) and not self.policy.allows(url):
            self._blocked.append(url)
            log.warning("browser: blocked a request to %s (not an allowed origin)", url)
            await route.abort("aborted")  # like a cancelled navigation: the page stays
        else:
            await route.continue_()

    def _adopt(self, page: Any) -> None:
        if any(p is page for p in self._tabs.values()):
            return
        tab = self._next_id
        self._next_id += 1
        self._tabs[tab] = page
        self._current = tab
        page.on("close", lambda _: self._forget(tab))

    def _forget(self, tab: int) -> None:
        self._tabs.pop(tab, None)
        if self._current == tab:
            self._current = max(self._tabs) if self._tabs else None

    def _page(self, tab: int | None) -> tuple[int, Any]:
        chosen = self._current if tab is None else tab
        if chosen is None or chosen not in self._tabs:
            raise ToolError(
                "no tab open; call browser_open first"
                if tab is None
                else f"no tab {tab}; open tabs: {sorted(self._tabs)}",
                code="no_tab",
            )
        self._current = chosen
        return chosen, self._tabs[chosen]

    async def _describe(self, tab: int, page: Any) -> dict[str, Any]:
        try:
            title = await page.title()
        except Exception:  # noqa: BLE001 - navigating: the old document is gone
            await asyncio.sleep(0.1)
            title = await page.title()
        return {"tab": tab, "url": page.url, "title": title}

    async def _open(
        self, url: str, new_tab: bool, wait_until: str, timeout_s: float
    ) -> dict[str, Any]:
        if new_tab or self._current is None or self._current not in self._tabs:
            page = await self._context.new_page()
            self._adopt(page)
        tab, page = self._page(None)
        try:
            response = await page.goto(url, wait_until=wait_until, timeout=timeout_s * 1000)
        except Exception as exc:
            # A navigation that started before this one committed it: the error page of an
            # earlier navigation the proxy refused (a redirect off the list, maybe started
            # by a script after its tool answered). Once more, on the settled tab.
            if "is interrupted by another navigation to" not in str(exc):
                raise
            await self._settle(page, timeout_s)
            response = await page.goto(url, wait_until=wait_until, timeout=timeout_s * 1000)
        return {**await self._describe(tab, page), "status": response.status if response else None}

    async def _text(self, selector: str | None, tab: int | None, max_chars: int) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        text = await page.inner_text(selector or "body", timeout=10_000)
        return {
            **await self._describe(tab_id, page),
            "text": text[:max_chars],
            "truncated": len(text) > max_chars,
        }

    async def _click(self, selector: str, tab: int | None, timeout_s: float) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        await page.click(selector, timeout=timeout_s * 1000)
        await self._settle(page, timeout_s)
        return await self._describe(tab_id, page)

    async def _settle(self, page: Any, timeout_s: float) -> None:
        """After an action that may navigate, let a navigation it started commit and load
        (a click on a submit button, a link, a script that sets ``location``)."""
        await asyncio.sleep(0.05)
        try:
            await page.wait_for_load_state("load", timeout=timeout_s * 1000)
        except Exception as exc:  # noqa: BLE001 - the action itself succeeded
            log.debug("page did not settle after the action: %r", exc)

    async def _fill(
        self, selector: str, value: str, tab: int | None, timeout_s: float
    ) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        await page.fill(selector, value, timeout=timeout_s * 1000)
        return {**await self._describe(tab_id, page), "selector": selector}

    async def _wait_for(
        self, selector: str, state: str, tab: int | None, timeout_s: float
    ) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        await page.wait_for_selector(selector, state=state, timeout=timeout_s * 1000)
        return {**await self._describe(tab_id, page), "selector": selector, "state": state}

    async def _screenshot(
        self, selector: str | None, full_page: bool, tab: int | None
    ) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        if selector:
            data = await page.locator(selector).first.screenshot(type="png", timeout=10_000)
        else:
            data = await page.screenshot(type="png", full_page=full_page, timeout=10_000)
        if len(data) > MAX_SCREENSHOT_BYTES:
            raise ToolError(
                f"screenshot is {len(data)} bytes, over {MAX_SCREENSHOT_BYTES}; "
                "use a selector or full_page: false",
                code="too_large",
            )
        width, height = _png_size(data)
        return {
            **await self._describe(tab_id, page),
            "png_base64": base64.b64encode(data).decode("ascii"),
            "width": width,
            "height": height,
            "bytes": len(data),
        }

    async def _list_tabs(self) -> dict[str, Any]:
        tabs = []
        for tab, page in sorted(self._tabs.items()):
            tabs.append({**await self._describe(tab, page), "current": tab == self._current})
        return {"tabs": tabs}

    async def _close_tab(self, tab: int) -> dict[str, Any]:
        tab_id, page = self._page(tab)
        await page.close()
        self._forget(tab_id)
        return {"closed": tab_id, "current": self._current}


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("=")]
    return " ".join(lines[:3])[:500] or type(exc).__name__


__all__ = ["BrowserToolset", "OriginPolicy", "find_browser", "origin_of"]
