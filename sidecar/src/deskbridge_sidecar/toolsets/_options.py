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

        for tool in FilesToolset(roots).tools():
            registry.add(tool)
    origins = list(args.browser_origin) or [
        o.strip() for o in env.get(ENV_BROWSER_ORIGINS, "").split(",") if o.strip()
    ]
    if origins:
        from .browser import DEFAULT_PROFILE, BrowserToolset

        headless = args.browser_headless
        if headless is None:
            headless = env.get(ENV_BROWSER_HEADLESS, "").lower() in ("1", "true", "yes")
        browser = BrowserToolset(
            origins,
            profile_dir=args.browser_profile or env.get(ENV_BROWSER_PROFILE) or DEFAULT_PROFILE,
            executable_path=args.browser_executable or env.get(ENV_BROWSER_EXECUTABLE) or None,
            headless=headless,
        )
        for tool in browser.tools():
            registry.add(tool)
        closers.append(browser.close)
    return closers


__all__ = ["add_arguments", "add_toolsets"]
