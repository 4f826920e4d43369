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

#: A folder name as ``os.fsdecode`` gives ``b"caf\xe9"`` (not UTF-8), and a catalogue
#: schema naming it in a description, a key and an ``enum`` value.
ODD = "caf\udce9"
ODD_SCHEMA = {
    "type": "object",
    "properties": {"folder": {"type": "string", "description": f"under {ODD}"},
                   ODD: {"enum": [ODD, "plain"]}},
}  # fmt: skip


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


def test_a_catalogue_entry_with_a_lone_surrogate_is_sent_as_valid_text():
    """A description or schema text built from a name that is not UTF-8 (``os.fsdecode``)
    made MCP ``tools/list`` fail for the user and ``GET .../tools`` answer the escape:
    the hello now carries U+FFFD in its place, in strings and keys alike."""
    from deskbridge_common import Hello, encode_frame
    from deskbridge_sidecar import Tool

    def pick(folder: str) -> dict:
        return {}

    tool = Tool.from_function(pick, description=f"Pick a file in {ODD}", args_schema=ODD_SCHEMA)
    spec = tool.spec()
    assert spec.description == "Pick a file in caf\ufffd"
    props = spec.args_schema["properties"]
    assert props["folder"]["description"] == "under caf\ufffd"
    assert props["caf\ufffd"] == {"enum": ["caf\ufffd", "plain"]}
    frame = encode_frame(Hello(protocol_version=1, sidecar_version="t", tools=(spec,)))
    assert "\\ud" not in frame.lower()
    assert tool.fingerprint() == tool.fingerprint()  # stable
