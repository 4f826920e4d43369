"""The codec's refusals, exactly: the close reason a peer reads, each limit at its edge.

The reason (``field: message``) is what the other end sees in the close frame and logs,
so it is pinned word for word; each limit is tried at the largest value it allows and
the smallest it refuses. Pure tests, no event loop (issue 15: these kill the codec's
mutants that the round-trip tests let through).
"""

from __future__ import annotations

import json

import pytest
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    MAX_FRAME_BYTES,
    Hello,
    Job,
    JobError,
    JobResult,
    LocalProtocolError,
    Progress,
    RawJSON,
    RemoteProtocolError,
    ToolSpec,
    Welcome,
    decode_frame,
    encode_frame,
    frame_to_dict,
)

INVALID, POLICY = CLOSE_INVALID_PAYLOAD, CLOSE_POLICY_VIOLATION


def _frame(kind: str, **fields) -> str:
    return json.dumps({"type": kind, **fields})


def _job(**over) -> str:
    body = {"id": "d1", "job_id": "j1", "name": "echo", "args": {}, "idempotency_key": "k",
            "deadline": 1.0}
    body.update(over)
    return _frame("job", **{k: v for k, v in body.items() if v is not ...})


def _hello(tools) -> str:
    return _frame("hello", protocol_version=1, sidecar_version="x", tools=tools)


def _welcome(**over) -> str:
    body = {"session_id": "s", "heartbeat_s": 1, "ping_interval_s": 1, "ping_timeout_s": 1}
    return _frame("welcome", **{**body, **over})


def _failed(error) -> str:
    return _frame("job_result", id="d1", ok=False, error=error)


@pytest.mark.parametrize(
    ("text", "reason", "code"),
    [
        # the JSON text itself
        ("not json", "$: not valid JSON (JSONDecodeError)", INVALID),
        ("[1, 2]", "$: expected a JSON object, got array", INVALID),
        ('{"type":"ping","nonce":"n","x":1e999}', "$: not valid JSON (ValueError)", INVALID),
        ('{"type":"ping","nonce":NaN}', "$: not valid JSON (ValueError)", INVALID),
        # the frame type
        ("{}", "type: missing or not a string", POLICY),
        ('{"type": 3}', "type: missing or not a string", POLICY),
        (_frame("x" * 40), "type: unknown frame type '" + "x" * 32 + "'", POLICY),
        # unexpected and missing fields
        (_job(extra=1), "extra: unexpected field", POLICY),
        (_job(idempotency_key=...), "idempotency_key: missing", POLICY),
        # what each kind of value is called
        (_frame("ping", nonce={}), "nonce: expected string, got object", INVALID),
        (_frame("ping", nonce=[]), "nonce: expected string, got array", INVALID),
        (_frame("ping", nonce=True), "nonce: expected string, got boolean", INVALID),
        (_frame("ping", nonce=None), "nonce: expected string, got null", INVALID),
        (_frame("ping", nonce=1), "nonce: expected string, got number", INVALID),
        (_job(args="x"), "args: expected object, got string", INVALID),
        (_frame("job_result", id="d", ok="yes"), "ok: expected boolean, got string", INVALID),
        (_frame("hello", protocol_version="1", sidecar_version="x"),
         "protocol_version: expected integer, got string", INVALID),
        (_job(deadline=None), "deadline: expected number, got null", INVALID),
        # strings: empty, and the id limit (200 characters)
        (_job(id=""), "id: must not be empty", INVALID),
        (_job(id="x" * 201), "id: longer than 200 characters", INVALID),
        # numbers: signs
        (_job(timeout_s=-0.5), "timeout_s: must not be negative", INVALID),
        (_welcome(heartbeat_s=0), "heartbeat_s: must be positive", INVALID),
        (_welcome(heartbeat_s="1"), "heartbeat_s: expected number, got string", INVALID),
        (_frame("progress", id="d", progress=1, total=-1), "total: must not be negative", INVALID),
        (_frame("progress", id="d", progress=1, total="1"),
         "total: expected number, got string", INVALID),
        # tools: the list, each entry, the limits
        (_hello({}), "tools: expected array, got object", INVALID),
        (_hello([{"name": "t"}] * 257), "tools: more than 256 tools", INVALID),
        (_hello([{"name": "a"}, {"name": "a"}]), "tools: duplicate tool name", INVALID),
        (_hello([5]), "tools[0]: expected object, got number", INVALID),
        (_hello([{}]), "tools[0].name: missing", POLICY),
        (_hello([{"name": ""}]), "tools[0].name: must not be empty", INVALID),
        (_hello([{"name": 1}]), "tools[0].name: expected string, got number", INVALID),
        (_hello([{"name": "n" * 65}]), "tools[0].name: longer than 64 characters", INVALID),
        (_hello([{"name": "t", "description": "d" * 4097}]),
         "tools[0].description: longer than 4096 characters", INVALID),
        (_hello([{"name": "t", "side_effects": 1}]),
         "tools[0].side_effects: expected boolean, got number", INVALID),
        # a job's error: its shape and its two fields
        (_failed(5), "error: expected object, got number", INVALID),
        (_failed({"message": "m"}), "error.code: missing", POLICY),
        (_failed({"code": "c" * 65, "message": "m"}), "error.code: longer than 64 characters",
         INVALID),
        (_failed({"code": "c", "message": 5}), "error.message: expected string, got number",
         INVALID),
        # a job_result's two halves
        ('{"type":"job_result","id":"x","ok":false}', "error: missing (ok is false)", POLICY),
        ('{"type":"job_result","id":"x","ok":true,"error":{"code":"a","message":"b"}}',
         "error: must be absent when ok is true", POLICY),
        ('{"type":"job_result","id":"x","ok":false,"result":1,"error":{"code":"a","message":"b"}}',
         "result: must be absent when ok is false", POLICY),
    ],
)
def test_a_refused_frame_gives_the_peer_its_exact_reason_and_close_code(text, reason, code):
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(text)
    assert (info.value.reason, info.value.close_code) == (reason, code)


@pytest.mark.parametrize(
    "text",
    [
        _job(id="x" * 200),
        _hello([{"name": "n" * 64}]),
        _hello([{"name": f"t{i}"} for i in range(256)]),
        _hello([{"name": "t", "description": ""}]),
        _hello([{"name": "t", "description": "d" * 4096}]),
        _failed({"code": "c" * 64, "message": ""}),
        _failed({"code": "c", "message": "m" * 5000}),
        _welcome(heartbeat_s=0.5, ping_interval_s=0.001),
        _frame("progress", id="d", progress=1, total=0),
        _frame("progress", id="d", progress=1, total=0.5),
        _job(timeout_s=0),
    ],
)
def test_values_at_the_edge_of_each_limit_are_accepted(text):
    assert decode_frame(text).type == json.loads(text)["type"]


def test_the_size_limit_counts_utf8_bytes_not_characters():
    """A message of fewer characters than the limit but more bytes is refused (1009)."""
    text = _job(args={"blob": "x"}).replace('"x"', '"' + "é" * (MAX_FRAME_BYTES // 2 + 10) + '"')
    assert len(text) < MAX_FRAME_BYTES < len(text.encode())
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(text)
    assert (info.value.field, info.value.close_code) == ("$", CLOSE_MESSAGE_TOO_BIG)


def test_a_number_too_large_for_a_float_is_refused_wherever_it_is():
    """1e999 parses to infinity: refused like ``Infinity``, even inside ``args``."""
    for text in (_job(args={"x": 1}).replace("1}", "1e999}"), _job().replace("1.0", "1e999")):
        assert "1e999" in text
        with pytest.raises(RemoteProtocolError) as info:
            decode_frame(text)
        assert info.value.field == "$"


# -- encoding ------------------------------------------------------------------------


def _encode_error(frame) -> LocalProtocolError:
    with pytest.raises(LocalProtocolError) as info:
        encode_frame(frame)
    return info.value


def test_an_unsendable_frame_names_the_field_and_the_close_code_the_peer_would_use():
    error = _encode_error(Job("", "j", "echo", {}, "k", 1.0))
    assert (error.reason, error.close_code) == ("id: must not be empty", CLOSE_INVALID_PAYLOAD)
    error = _encode_error(JobResult("d", False))
    assert (error.reason, error.close_code) == ("error: missing (ok is false)", POLICY)
    error = _encode_error(Job("d", "j", "echo", {}, "k", float("inf")))
    assert (error.reason, error.close_code) == ("deadline: must be finite", INVALID)


def test_a_value_json_cannot_hold_is_refused_on_the_frame_as_a_whole():
    assert _encode_error(JobResult("d", True, {"x": object()})).field == "$"
    assert _encode_error(JobResult("d", True, JobError("c", "m"))).field == "$"
    assert _encode_error(Job("d", "j", "echo", JobError("c", "m"), "k", 1.0)).field == "args"


def test_a_result_nested_too_deeply_is_refused_not_a_crash():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    error = _encode_error(JobResult("d", True, deep))
    assert error.reason == "$: nested too deeply to encode"
    schema: dict = {}
    for _ in range(100_000):
        schema = {"a": schema}
    assert _encode_error(Hello(1, "x", (ToolSpec("t", "", schema),))).field == "$"


def test_encoding_drops_the_half_of_a_job_result_its_ok_does_not_use():
    ok = JobResult("d", True, 5, error=JobError("c", "m"))
    assert json.loads(encode_frame(ok)) == {"type": "job_result", "id": "d", "ok": True,
                                            "result": 5}
    failed = JobResult("d", False, 5, error=JobError("c", "m"))
    assert json.loads(encode_frame(failed)) == {
        "type": "job_result", "id": "d", "ok": False, "error": {"code": "c", "message": "m"}}


def test_the_encoded_size_limit_is_inclusive_and_counts_utf8_bytes():
    envelope = len(encode_frame(JobResult("d", True, RawJSON('""'))))
    exact = RawJSON('"' + "x" * (MAX_FRAME_BYTES - envelope) + '"')
    assert len(encode_frame(JobResult("d", True, exact))) == MAX_FRAME_BYTES
    wide = RawJSON('"' + "é" * (MAX_FRAME_BYTES // 2 + 10) + '"')
    error = _encode_error(JobResult("d", True, wide))
    assert (error.field, error.close_code) == ("$", CLOSE_MESSAGE_TOO_BIG)


def test_frame_to_dict_gives_the_wire_object():
    assert frame_to_dict(JobResult("d", True, RawJSON('{"a":[1,2]}'))) == {
        "type": "job_result", "id": "d", "ok": True, "result": {"a": [1, 2]}}
    tool = ToolSpec("t", "d", {"type": "object"}, True)
    assert frame_to_dict(Hello(1, "v", (tool,))) == {
        "type": "hello", "protocol_version": 1, "sidecar_version": "v",
        "tools": [{"name": "t", "description": "d", "args_schema": {"type": "object"},
                   "side_effects": True}]}
    assert frame_to_dict(Progress("d", 1.0)) == {"type": "progress", "id": "d", "progress": 1.0}
    assert frame_to_dict(Welcome("s", 1.0, 2.0, 3.0))["ping_timeout_s"] == 3.0
