"""Log format of the sidecar: ``DESKBRIDGE_LOG_FORMAT`` = ``text`` (default) or ``json``.

JSON lines come from python-json-logger: ``time``, ``level``, ``logger``, ``message`` and
the fields a call passes with ``extra=`` (``job_id``, ``tool``, ``outcome``,
``elapsed_ms``, ``session_id``), the same names as the hub's (deskbridge_hub._logging).
Text lines escape control characters and cap long values (``deskbridge_common``'s
``TextFormatter``): a close reason or error message the hub sent cannot start a line
of its own.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from deskbridge_common import TextFormatter

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def make_formatter(fmt: str | None = None) -> logging.Formatter:
    """A formatter for ``fmt`` (default ``DESKBRIDGE_LOG_FORMAT``, else ``text``); an
    unknown format gets one warning on stderr naming it, and text."""
    fmt = (fmt or os.environ.get("DESKBRIDGE_LOG_FORMAT") or "text").strip().lower()
    if fmt == "text":
        return TextFormatter(TEXT_FORMAT)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    print(
        f"deskbridge-sidecar: DESKBRIDGE_LOG_FORMAT={fmt!r}: expected one of "
        f"{', '.join(FORMATS)}; using text",
        file=sys.stderr,
    )
    return TextFormatter(TEXT_FORMAT)


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call, without None values; ``elapsed_s`` becomes
    ``elapsed_ms``."""
    elapsed_s = values.pop("elapsed_s", None)
    if elapsed_s is not None:
        values["elapsed_ms"] = round(elapsed_s * 1000, 3)
    return {k: v for k, v in values.items() if v is not None}
