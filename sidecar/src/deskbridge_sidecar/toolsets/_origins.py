"""Where the browser toolset may go, and which browser it drives: origins
(``scheme://host[:port]``), the allow-list, and the installed Chrome/Chromium on ``PATH``."""

from __future__ import annotations

import fnmatch
import shutil
from collections.abc import Iterable
from urllib.parse import urlsplit

import attrs

#: Browser executables looked up on ``PATH``, in order.
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url`` (default ports dropped), or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port
    default = {"http": 80, "https": 443}[parts.scheme]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    """attrs converter: a tuple of the strings (typed, unlike ``tuple`` itself)."""
    return tuple(values)


@attrs.frozen
class OriginPolicy:
    """Which origins the browser may navigate to.

    Args:
        allowed: origins like ``https://portal.example.com`` or ``http://127.0.0.1:8123``;
            ``https://*.example.com`` allows every subdomain (not the bare domain).
    """

    allowed: tuple[str, ...] = attrs.field(converter=_str_tuple)

    def allows(self, url: str) -> bool:
        if url in ("about:blank", "about:srcdoc") or url.startswith("data:"):
            return True
        origin = origin_of(url)
        if origin is None:
            return False
        return any(
            origin == pattern or ("*" in pattern and fnmatch.fnmatchcase(origin, pattern))
            for pattern in self.allowed
        )


def find_browser() -> str | None:
    """The first of :data:`EXECUTABLES` found on ``PATH``, or None."""
    for name in EXECUTABLES:
        found = shutil.which(name)
        if found:
            return found
    return None


__all__ = ["EXECUTABLES", "OriginPolicy", "find_browser", "origin_of"]
