"""Plain-text log lines that a client cannot forge: the text formatter of the hub and
the sidecar (``DESKBRIDGE_LOG_FORMAT=text``, the default).

Log messages carry text that neither process chose: URL paths, user ids, tool names,
header values (``traceparent``), close reasons and error messages a sidecar or a hub
sent. Written as is, a ``%0a`` in a path started a new line that read like a record of
its own (``... ERROR deskbridge.hub[1]: forged``), and a 5,000-character path was logged
in full. One place handles it, for every call site:

* a record's message has every control character backslash-escaped (``\\n``, ``\\r``,
  ``\\t``, ``\\x1b``; also DEL, the C1 controls and U+2028/U+2029, which some viewers
  break lines at): one record is one line;
* every string argument is capped at :data:`MAX_VALUE_CHARS`, the whole message at
  :data:`MAX_MESSAGE_CHARS`, with how much was cut said in the line;
* a traceback or stack keeps its lines, each continuation line indented, its other
  control characters escaped: every line at column 0 is the start of a record.

JSON lines (python-json-logger) escape in JSON already and are left as they are.
Backslashes are not doubled (Windows paths stay readable), so a literal ``\\n`` typed
by a client reads like an escaped newline; it can never be one.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

MAX_VALUE_CHARS = 512
"""Characters of one string argument of a log call kept in a text line (a URL path, a
user id, an error message); the rest is replaced by ``...[N more chars]``."""

MAX_MESSAGE_CHARS = 8192
"""Characters of a whole message kept in a text line: rsyslog's default maximum message
size (``$MaxMessageSize``, 8 KiB), past which a syslog relay cuts or splits it anyway."""

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_of(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ESCAPES = {code: _escape_of(code) for code in _CONTROLS}
_ESCAPES_BUT_NEWLINE = {code: e for code, e in _ESCAPES.items() if code != ord("\n")}


def escape_controls(text: str) -> str:
    """``text`` with every control character backslash-escaped (``\\n``, ``\\x1b``, ...):
    it cannot start a line or move a terminal's cursor."""
    return text.translate(_ESCAPES)


def cap_text(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"


def safe_text(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` capped and escaped: fit for one line of a log or an error message."""
    return escape_controls(cap_text(text, limit))


class TextFormatter(logging.Formatter):
    """``logging.Formatter`` whose every record is one line a client cannot forge (the
    module's rules). The record itself is not changed (other handlers, ``caplog``, see
    the original arguments)."""

    def format(self, record: logging.LogRecord) -> str:
        if not (record.exc_info or record.exc_text or record.stack_info):
            message = record.getMessage()
            if len(message) <= MAX_VALUE_CHARS and message.isprintable():
                # nothing to cap or escape (the usual line, e.g. one per job): as is
                return super().format(record)
        safe = copy.copy(record)
        args = record.args
        if isinstance(args, tuple):
            safe.args = tuple(cap_text(a) if isinstance(a, str) else a for a in args)
        elif isinstance(args, Mapping):
            safe.args = {k: cap_text(v) if isinstance(v, str) else v for k, v in args.items()}
        safe.msg = escape_controls(cap_text(safe.getMessage(), MAX_MESSAGE_CHARS))
        safe.args = ()
        safe.exc_text = None  # another handler's formatter may have cached it unescaped
        return super().format(safe)

    def formatException(self, ei: Any) -> str:
        return _continuation(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _continuation(super().formatStack(stack_info))


def _continuation(text: str) -> str:
    """A traceback's lines after a record's first: control characters other than the
    line breaks escaped, every line indented so none reads as a record."""
    return "\n".join("  " + line for line in text.translate(_ESCAPES_BUT_NEWLINE).split("\n"))
