"""Text that is not valid Unicode never leaves the sidecar (found by fault injection: a
file name that is not UTF-8, listed by ``files_list``, reached callers as a JSON
``"\\udce9"`` escape: the MCP endpoint could not serialise it and its caller got no
answer at all; strict JSON parsers refuse such text, and the hub refuses it in ``args``).

A result holding a lone surrogate is a ``bad_result`` (the tool ran; its value cannot be
sent as text), as a NaN is; an error or progress message has each lone surrogate
replaced with U+FFFD (it is text for a person)."""

from __future__ import annotations

import json

from deskbridge_common import BAD_RESULT
from deskbridge_sidecar import Outcome
from deskbridge_sidecar._progress import Progress, ProgressState


def test_a_result_with_a_lone_surrogate_is_a_bad_result():
    outcome = Outcome.success({"entries": [{"name": "caf\udce9.txt"}]})
    assert not outcome.ok and outcome.code == BAD_RESULT, outcome
    assert outcome.error is not None and "Unicode" in outcome.error.message
    outcome.error.message.encode("utf-8")  # the refusal itself is sendable text


def test_a_lone_surrogate_in_a_key_is_a_bad_result_too():
    assert Outcome.success({"\ud800": 1}).code == BAD_RESULT


def test_text_outside_the_basic_plane_and_escaped_backslashes_are_kept():
    assert Outcome.success("caf\u00e9 \U0001f600").result == "caf\u00e9 \U0001f600"
    assert Outcome.success("\ud83d\ude00").result == "\U0001f600"  # a pair, as two chars
    assert Outcome.success("\\ud800").result == "\\ud800"  # a backslash, then text


def test_an_error_message_with_a_lone_surrogate_is_sendable_text():
    outcome = Outcome.failure("tool_error", "file caf\udce9.txt not found")
    assert outcome.error is not None
    assert outcome.error.message == "file caf\ufffd.txt not found"


async def test_a_progress_message_with_a_lone_surrogate_is_sendable_text():
    state = ProgressState()
    Progress(state)(1, total=2, message="reading caf\udce9.txt")
    assert state.latest is not None and state.latest.message == "reading caf\ufffd.txt"
    json.dumps(state.latest.message, ensure_ascii=False).encode("utf-8")
