"""The browser toolset's request route: every document request (a link, a form, a script
setting ``location``, a popup, a frame) to an origin off the allow-list is aborted, and so
is a redirect to one.

Why document requests are fetched here: Playwright calls a route for a request, not for
the requests its redirects make (Chromium follows a ``302`` on its own, past the route).
So a navigation is performed by the route itself without following redirects
(``route.fetch(max_redirects=0)``); a redirect whose target is allowed is handed to the
browser as it is (it follows it with a new document request, routed again), one whose
target is not is aborted before anything is sent there. Sub-resources are continued
untouched (not a content filter). Runs on the browser's asyncio thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

from ._origins import OriginPolicy

log = logging.getLogger("deskbridge.sidecar.browser")

#: How long the route waits for a document's response, ms (the tool's own timeout is
#: usually shorter and ends the wait first).
FETCH_TIMEOUT_MS = 120_000


async def route_request(route: Any, policy: OriginPolicy, blocked: Callable[[str], None]) -> None:
    """Continue, abort or perform one routed request.

    Args:
        route: Playwright's ``Route``.
        policy: the allowed origins.
        blocked: called with each URL refused (the tool reports them).
    """
    request = route.request
    if not request.is_navigation_request():
        await route.continue_()
        return
    if not policy.allows(request.url):
        await _abort(route, request.url, blocked)
        return
    if not request.url.startswith(("http://", "https://")):
        await route.continue_()  # about:blank and the like: nothing to fetch
        return
    try:
        response = await route.fetch(max_redirects=0, timeout=FETCH_TIMEOUT_MS)
    except Exception as exc:  # noqa: BLE001 - the navigation fails, as it would have
        log.info("browser: navigation to %s failed: %s", request.url, exc)
        await route.abort("failed")
        return
    location = response.headers.get("location")
    if 300 <= response.status < 400 and location:
        target = urljoin(request.url, location)
        if not policy.allows(target):
            await response.dispose()
            await _abort(route, target, blocked)
            return
    await route.fulfill(response=response)


async def _abort(route: Any, url: str, blocked: Callable[[str], None]) -> None:
    blocked(url)
    log.warning("browser: blocked navigation to %s (not an allowed origin)", url)
    await route.abort("aborted")  # like a cancelled navigation: the page stays


__all__ = ["FETCH_TIMEOUT_MS", "route_request"]
