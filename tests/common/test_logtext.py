"""The text log formatter (hub and sidecar): client-controlled text in a message cannot
start a line of its own, nor run on for pages."""

from __future__ import annotations

import logging
import sys

from deskbridge_common import MAX_MESSAGE_CHARS, MAX_VALUE_CHARS, TextFormatter, safe_text

FORMAT = "%(levelname)s %(name)s: %(message)s"


def record(msg: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord(
        "deskbridge.hub.access", logging.INFO, __file__, 1, msg, args, exc_info
    )  # type: ignore[arg-type]


def test_a_newline_in_an_argument_is_escaped_on_one_line() -> None:
    path = "/v1/users/x\n2026-12-03 15:00:00,000 ERROR deskbridge.hub[1]: forged\r/presence"
    rec = record('%s - "%s %s" %s %.1f ms', "127.0.0.1", "GET", path, 401, 1.2)
    line = TextFormatter(FORMAT).format(rec)
    assert line == (
        'INFO deskbridge.hub.access: 127.0.0.1 - "GET /v1/users/x\\n2026-12-03 15:00:00,000 '
        'ERROR deskbridge.hub[1]: forged\\r/presence" 401 1.2 ms'
    )
    assert rec.args[2] == path  # the record itself is untouched (caplog, other handlers)


def test_every_control_character_is_escaped() -> None:
    text = "".join(chr(c) for c in [*range(0x20), 0x7F, 0x85, 0x9B, 0x2028, 0x2029]) + "ok"
    line = TextFormatter("%(message)s").format(record("%s", text))
    assert line.isprintable() and line.endswith("ok")
    assert "\\x00" in line and "\\t" in line and "\\x1b" in line and "\\u2028" in line
    assert safe_text("a\nb") == "a\\nb"


def test_a_long_argument_is_capped_and_the_rest_of_the_line_kept() -> None:
    path = "/" + "a" * 4999
    line = TextFormatter("%(message)s").format(record('"GET %s" %s', path, 404))
    assert (
        line == f'"GET /{"a" * (MAX_VALUE_CHARS - 1)}...[{5000 - MAX_VALUE_CHARS} more chars]" 404'
    )


def test_a_long_message_is_capped() -> None:
    line = TextFormatter("%(message)s").format(record("x" * (MAX_MESSAGE_CHARS + 10)))
    assert line == "x" * MAX_MESSAGE_CHARS + "...[10 more chars]"


def test_a_traceback_keeps_its_lines_each_indented() -> None:
    try:
        raise ValueError("bad id x\n2026-12-03 15:00:00,000 ERROR deskbridge.hub[1]: forged")
    except ValueError:
        rec = record("request failed", exc_info=sys.exc_info())
    lines = TextFormatter(FORMAT).format(rec).split("\n")
    assert lines[0] == "INFO deskbridge.hub.access: request failed"
    assert len(lines) > 3
    assert all(line.startswith("  ") for line in lines[1:])
    assert lines[1] == "  Traceback (most recent call last):"
    assert lines[-1] == "  2026-12-03 15:00:00,000 ERROR deskbridge.hub[1]: forged"
