"""Argument types and checks of ``deskbridge-hub``'s options: a value out of range or
malformed is a usage error (exit 2, one line naming the option), never the hub's 400
(exit 1) nor a traceback."""

from __future__ import annotations

import argparse
import math
import os
import urllib.parse
from collections.abc import Callable

from deskbridge_common._envnames import misspelling_hint

#: Where ``call``, ``inspect`` and ``cancel`` look for the hub without ``--hub`` and
#: ``$DESKBRIDGE_HUB_HTTP``.
DEFAULT_HUB_HTTP = "http://127.0.0.1:8080"


def add_hub_option(parser: argparse.ArgumentParser) -> None:
    """``--hub URL``, by default ``$DESKBRIDGE_HUB_HTTP`` or :data:`DEFAULT_HUB_HTTP`."""
    parser.add_argument(
        "--hub",
        default=os.environ.get("DESKBRIDGE_HUB_HTTP", DEFAULT_HUB_HTTP),
        help=f"hub base URL (default $DESKBRIDGE_HUB_HTTP or {DEFAULT_HUB_HTTP})",
    )


def unreachable_hint(hub: str) -> str:
    """What to add to "cannot reach hub at ``hub``" when ``hub`` is the default taken for
    want of ``$DESKBRIDGE_HUB_HTTP``: a misspelling of it in the environment, or
    ``$DESKBRIDGE_HUB_URL``, the sidecar's variable (a ws:// URL), set instead; else ""."""
    if "DESKBRIDGE_HUB_HTTP" in os.environ or hub != DEFAULT_HUB_HTTP:
        return ""
    hint = misspelling_hint("DESKBRIDGE_HUB_HTTP")
    if os.environ.get("DESKBRIDGE_HUB_URL"):
        hint += (
            " (DESKBRIDGE_HUB_URL is the sidecar's: this command reads --hub or "
            "DESKBRIDGE_HUB_HTTP, the hub's http:// address)"
        )
    return hint


def key_not_set(command: str) -> str:
    """The line saying ``$DESKBRIDGE_API_KEY`` is not set (after a 401 to a request sent
    without a key), naming a misspelt variable that stands in for it."""
    hint = misspelling_hint("DESKBRIDGE_API_KEY")
    return f"deskbridge-hub {command}: DESKBRIDGE_API_KEY is not set{hint}"


def seconds(most_s: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds in (0, ``most_s``].

    Raises (from the returned function):
        argparse.ArgumentTypeError: not a number, or out of range (argparse names the option).
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= most_s):
            raise argparse.ArgumentTypeError(
                f"must be a number of seconds in (0, {most_s:g}], got {text!r}"
            )
        return value

    return parse


def integer(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [``least``, ``most``] (no upper bound: None).

    Raises (from the returned function):
        argparse.ArgumentTypeError: not an integer, or out of range.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < least or (most is not None and value > most):
            bound = f"in {least}-{most}" if most is not None else f"at least {least}"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {text!r}")
        return value

    return parse


def hub_url_problem(hub: str) -> str | None:
    """Why ``hub`` (a ``--hub`` value) is not an http(s) base URL, or None when it is
    (a path prefix is one: a hub behind a reverse proxy; a path holding ``/v1`` is not).

    Without this, urllib answers ``127.0.0.1:8080`` with "unknown url type", and an
    unclosed ``[`` or a port that is not a number in 1-65535 with a traceback."""
    example = "expected an http:// or https:// URL, e.g. http://127.0.0.1:8080"
    try:
        parts = urllib.parse.urlsplit(hub)
        port = parts.port  # ValueError: not a number, or out of 0-65535
    except ValueError as exc:
        return f"--hub {hub!r}: {exc}; {example}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--hub {hub!r}: {example}"
    if port == 0:
        return f"--hub {hub!r}: port 0; {example}"
    if "v1" in parts.path.split("/"):
        # the commands add /v1/...: this one would ask for /v1/v1/... and get a 404
        return (
            f"--hub {hub!r}: the hub's base URL, without /v1 (the command adds the API's "
            "path), e.g. http://127.0.0.1:8080"
        )
    return None


def checked(validator: Callable[[str, str], str]) -> Callable[[str], str]:
    """An argparse ``type`` from one of ``_validate``'s checks (the hub's own rule, said
    before anything is sent); argparse names the option, the message says the rule.

    Raises (from the returned function):
        argparse.ArgumentTypeError: the check refused the value.
    """

    def parse(text: str) -> str:
        try:
            return validator(text, "it")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None

    return parse
