"""Command-line and environment options that turn the toolsets on (``deskbridge-sidecar
run``). Nothing is on by default: the files toolset needs a root, the browser toolset an
allowed origin."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping

from .._tools import ToolRegistry

ENV_FILES_ROOTS = "DESKBRIDGE_FILES_ROOTS"  # os.pathsep-separated
ENV_BROWSER_ORIGINS = "DESKBRIDGE_BROWSER_ORIGINS"  # comma-separated
ENV_BROWSER_PROFILE = "DESKBRIDGE_BROWSER_PROFILE"
ENV_BROWSER_EXECUTABLE = "DESKBRIDGE_BROWSER_EXECUTABLE"
ENV_BROWSER_HEADLESS = "DESKBRIDGE_BROWSER_HEADLESS"  # 1/true/yes

HELP = """\
toolsets (opt-in):
  --files-root PATH       offer files_list/files_read/files_write inside PATH (repeatable;
                          $DESKBRIDGE_FILES_ROOTS, separated by the OS path separator)
  --browser-origin ORIGIN offer the browser_* tools, allowed to visit ORIGIN, e.g.
                          https://portal.example.com or https://*.example.com (repeatable;
                          $DESKBRIDGE_BROWSER_ORIGINS, comma-separated)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the toolset options to ``deskbridge-sidecar run``."""
    group = parser.add_argument_group("toolsets (opt-in)")
    group.add_argument(
        "--files-root",
        metavar="PATH",
        action="append",
        default=[],
        help="offer the files tools, confined to PATH (repeatable; $" + ENV_FILES_ROOTS + ")",
    )
    group.add_argument(
        "--browser-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="offer the browser tools, allowed to visit ORIGIN (repeatable; $"
        + ENV_BROWSER_ORIGINS
        + ")",
    )
    group.add_argument(
        "--browser-profile",
        metavar="DIR",
        help="browser profile directory (default ~/.deskbridge/browser-profile; $"
        + ENV_BROWSER_PROFILE
        + ")",
    )
    group.add_argument(
        "--browser-executable",
        metavar="PATH",
        help="Chrome/Chromium binary (default: chromium or google-chrome on PATH; $"
        + ENV_BROWSER_EXECUTABLE
        + ")",
    )
    group.add_argument(
        "--browser-headless",
        action="store_true",
        default=None,
        help="run the browser without a window ($" + ENV_BROWSER_HEADLESS + "=1)",
    )


def add_toolsets(
    args: argparse.Namespace, registry: ToolRegistry, env: Mapping[str, str] = os.environ
) -> list[Callable[[], None]]:
    """Add the configured toolsets' tools to ``registry``.

    Returns:
        Functions to call once the daemon has stopped (closing the browser).

    Raises:
        ValueError: a toolset's configuration is unusable (the message says why).
    """
    closers: list[Callable[[], None]] = []
    roots = list(args.files_root) or [
        p for p in env.get(ENV_FILES_ROOTS, "").split(os.pathsep) if p
    ]
    if roots:
        from .files import FilesToolset

        named = "--files-root" if args.files_root else ENV_FILES_ROOTS
        try:  # the error names where the value came from (it named neither)
            files = FilesToolset(roots)
        except ValueError as exc:
            raise ValueError(f"{named}: {exc}") from None
        for tool in files.tools():
            registry.add(tool)
    origins = list(args.browser_origin) or [
        o.strip() for o in env.get(ENV_BROWSER_ORIGINS, "").split(",") if o.strip()
    ]
    if origins:
        from .browser import DEFAULT_PROFILE, BrowserToolset

        headless = args.browser_headless
        if headless is None:
            headless = _flag(env, ENV_BROWSER_HEADLESS)
        try:
            browser = BrowserToolset(
                origins,
                profile_dir=args.browser_profile or env.get(ENV_BROWSER_PROFILE) or DEFAULT_PROFILE,
                executable_path=args.browser_executable or env.get(ENV_BROWSER_EXECUTABLE) or None,
                headless=headless,
            )
        except ValueError as exc:
            if not str(exc).startswith("allowed origin"):
                raise
            named = "--browser-origin" if args.browser_origin else ENV_BROWSER_ORIGINS
            raise ValueError(f"{named}: {exc}") from None
        for tool in browser.tools():
            registry.add(tool)
        closers.append(browser.close)
    return closers


def _flag(env: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: 1/true/yes or 0/false/no (any case) or empty; anything else is
    refused naming it (``DESKBRIDGE_BROWSER_HEADLESS=on`` was "no" without a word)."""
    raw = env.get(name, "").strip().lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("", "0", "false", "no"):
        return False
    raise ValueError(f"{name}={env[name]!r}: expected 1, true or yes (or 0, false, no)")


__all__ = ["add_arguments", "add_toolsets"]
