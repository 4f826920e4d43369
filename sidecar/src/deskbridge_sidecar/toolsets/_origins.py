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


#: Characters a browser reads differently from ``urllib.parse`` in an http(s) URL: it reads
#: a backslash as ``/`` (``http://evil.test<backslash>@allowed/`` is evil.test to it and
#: ``allowed`` to urllib) and drops tabs and newlines; other control characters have no
#: place in a URL either.
_AMBIGUOUS = frozenset("\\") | frozenset(map(chr, range(0x20))) | {"\x7f"}


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be read the way the browser would read it, or None.

    A URL is malformed when ``urllib.parse`` cannot parse it (an unclosed ``[``), its port
    is not a number in 0-65535 (``http://127.0.0.1:8123.evil.test/``,
    ``http://h:99999/``, ``http://h:1:2/``), an http(s) URL has no host, or an http(s)
    URL holds a backslash or a control character (see ``_AMBIGUOUS``). Only an origin
    read from a well-formed URL is compared with the allow-list.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        return str(exc)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            return "no host"
        bad = sorted({c for c in url if c in _AMBIGUOUS})
        if bad:
            return f"holds {', '.join(map(repr, bad))} (a backslash or a control character)"
    return None


def check_url(url: str) -> str:
    """``url`` unchanged if well formed (:func:`url_problem`); a pydantic validator, so a
    tool's ``url`` argument that is not is refused ``bad_args`` before the tool runs.

    Raises:
        ValueError: ``not a valid URL: <why>``.
    """
    problem = url_problem(url)
    if problem is not None:
        raise ValueError(f"not a valid URL: {problem}")
    return url


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url`` (default ports dropped), or None: not http(s),
    or malformed (:func:`url_problem`). Never raises."""
    if url_problem(url) is not None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port
    default = {"http": 80, "https": 443}[parts.scheme]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


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
        """True for an http(s) URL whose origin is allowed, and for ``about:blank`` /
        ``about:srcdoc`` (empty documents). Everything else is refused: ``data:``,
        ``javascript:``, ``blob:``, ``file:``... have no origin on the list, and a ``data:``
        page would be the caller's own HTML and script in the user's browser."""
        if url in ("about:blank", "about:srcdoc"):
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


__all__ = ["EXECUTABLES", "OriginPolicy", "check_url", "find_browser", "origin_of", "url_problem"]
