"""Log setup for hub processes: one line per record, level from ``DESKBRIDGE_LOG_LEVEL``,
format from ``DESKBRIDGE_LOG_FORMAT`` (``text``, the default, or ``json``).

JSON lines come from python-json-logger: ``time``, ``level``, ``logger``, ``process``,
``message`` and every field a call passes with ``extra=`` (``user_id``, ``job_id``,
``session_id``, ``tool``, ``outcome``, ``answer``, ``elapsed_ms``; the access log adds
``method``, ``path``, ``status``, ``client``). :func:`fields` builds those ``extra`` mappings so the
names are the same everywhere.

Text lines escape control characters and cap long values (``deskbridge_common``'s
``TextFormatter``): a URL path, a user id or a sidecar's error message cannot start a
line of its own.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from deskbridge_common import TextFormatter

#: Values of ``DESKBRIDGE_LOG_FORMAT``.
FORMATS = ("text", "json")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


def make_formatter(fmt: str) -> logging.Formatter:
    """A formatter for ``fmt`` (``text`` or ``json``).

    Raises:
        ValueError: an unknown format (the message names the variable and the choices).
    """
    if fmt == "text":
        return TextFormatter(TEXT_FORMAT)  # one line per record, client text escaped
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    raise ValueError(f"DESKBRIDGE_LOG_FORMAT={fmt!r}: expected one of {', '.join(FORMATS)}")


def setup_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Configure the root logger once per process (later calls change nothing).

    An unknown ``DESKBRIDGE_LOG_FORMAT`` falls back to text, an unknown level (argument or
    ``DESKBRIDGE_LOG_LEVEL``) to INFO, each with one WARNING naming it (an unknown level
    was a traceback from ``logging``).
    """
    level = (level or os.environ.get("DESKBRIDGE_LOG_LEVEL", "") or "INFO").strip().upper()
    problems = []
    if level not in logging.getLevelNamesMapping():
        problems.append(
            f"DESKBRIDGE_LOG_LEVEL={level.lower()!r}: expected one of DEBUG, INFO, WARNING, "
            "ERROR; using INFO"
        )
        level = "INFO"
    fmt = (fmt or os.environ.get("DESKBRIDGE_LOG_FORMAT", "text")).strip().lower()
    root = logging.getLogger()
    if root.handlers:  # configured already (the CLI, then the ASGI entry in-process)
        return
    try:
        formatter = make_formatter(fmt)
    except ValueError as exc:
        problems.append(f"{exc}; using text")
        formatter = make_formatter("text")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    # Neither format prints the caller's file and line, the thread or the multiprocessing
    # process name: do not compute them for every record (the logging HOWTO's
    # "Optimization" switches; the holder writes one INFO line per job).
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    root.setLevel(level)
    for problem in problems:
        logging.getLogger("deskbridge.hub").warning("%s", problem)
    # coredis logs a traceback at ERROR when a connection attempt is cancelled (shutdown,
    # a cancelled blocking read); the substrate maps every real failure itself.
    logging.getLogger("coredis").setLevel(logging.CRITICAL)


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the given fields, without the ones that are None.
    ``elapsed_s`` is turned into ``elapsed_ms`` (rounded to microseconds)."""
    elapsed_s = values.pop("elapsed_s", None)
    if elapsed_s is not None:
        values["elapsed_ms"] = round(elapsed_s * 1000, 3)
    return {k: v for k, v in values.items() if v is not None}
