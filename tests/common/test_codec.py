"""Protocol codec: pure tests, no event loop."""

from __future__ import annotations

import json

import pytest
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    MAX_FRAME_BYTES,
    Cancel,
    Error,
    Hello,
    Job,
    JobError,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    RemoteProtocolError,
    ToolSpec,
    Welcome,
    decode_frame,
    encode_frame,
)

FRAMES = [
    Hello(1, "0.1.0", (ToolSpec("echo", "returns args", {"type": "object"}, False),)),
    Hello(1, "0.1.0"),
    Welcome("s1", 10.0, 10.0, 10.0),
    Job("d1", "j1", "echo", {"a": [1, 2, {"b": None}]}, "k1", 1700000000.5),
    Job("d1", "j1", "echo", {}, "k1", 1700000000.5, timeout_s=29.5),
    JobResult("d1", True, {"x": 1}),
    JobResult("d1", True, None),
    JobResult("d1", False, error=JobError("tool_error", "boom")),
    Cancel("d1"),
    Ping("n1"),
    Pong("n1"),
    Error("bye", "going away"),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_round_trip(frame):
    assert decode_frame(encode_frame(frame)) == frame


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_bytes_input_is_accepted(frame):
    assert decode_frame(encode_frame(frame).encode()) == frame


def _job(**over):
    body = {
        "type": "job",
        "id": "d1",
        "job_id": "j1",
        "name": "echo",
        "args": {},
        "idempotency_key": "k",
        "deadline": 1.0,
    }
    body.update(over)
    return json.dumps({k: v for k, v in body.items() if v is not ...})


@pytest.mark.parametrize(
    ("text", "field", "code"),
    [
        ("not json", "$", CLOSE_INVALID_PAYLOAD),
        ("[1, 2]", "$", CLOSE_INVALID_PAYLOAD),
        ('"hello"', "$", CLOSE_INVALID_PAYLOAD),
        ("{}", "type", CLOSE_POLICY_VIOLATION),
        ('{"type": 3}', "type", CLOSE_POLICY_VIOLATION),
        ('{"type": "bogus"}', "type", CLOSE_POLICY_VIOLATION),
        (_job(extra=1), "extra", CLOSE_POLICY_VIOLATION),
        (_job(idempotency_key=...), "idempotency_key", CLOSE_POLICY_VIOLATION),
        (_job(args=[1]), "args", CLOSE_INVALID_PAYLOAD),
        (_job(deadline="soon"), "deadline", CLOSE_INVALID_PAYLOAD),
        (_job(deadline=True), "deadline", CLOSE_INVALID_PAYLOAD),
        (_job(timeout_s=-0.5), "timeout_s", CLOSE_INVALID_PAYLOAD),
        (_job(timeout_s="30"), "timeout_s", CLOSE_INVALID_PAYLOAD),
        (_job(id=""), "id", CLOSE_INVALID_PAYLOAD),
        (_job(id=7), "id", CLOSE_INVALID_PAYLOAD),
        ('{"type":"job","deadline":NaN}', "$", CLOSE_INVALID_PAYLOAD),
        # the same key twice: readers keeping the first or the last value would disagree
        ('{"type":"ping","nonce":"a","nonce":"b"}', "nonce", CLOSE_INVALID_PAYLOAD),
        ('{"type":"ping","type":"pong","nonce":"a"}', "type", CLOSE_INVALID_PAYLOAD),
        (
            '{"type":"job_result","id":"x","ok":true,"result":{"k":[{"a":1,"a":1}]}}',
            "result",
            CLOSE_INVALID_PAYLOAD,
        ),
        (
            '{"type":"hello","protocol_version":1.5,"sidecar_version":"x"}',
            "protocol_version",
            CLOSE_INVALID_PAYLOAD,
        ),
        (
            '{"type":"hello","protocol_version":1,"sidecar_version":"x","tools":[{"name":1}]}',
            "tools[0].name",
            CLOSE_INVALID_PAYLOAD,
        ),
        (
            '{"type":"hello","protocol_version":1,"sidecar_version":"x",'
            '"tools":[{"name":"a"},{"name":"a"}]}',
            "tools",
            CLOSE_INVALID_PAYLOAD,
        ),
        ('{"type":"job_result","id":"x","ok":false}', "error", CLOSE_POLICY_VIOLATION),
        (
            '{"type":"job_result","id":"x","ok":true,"error":{"code":"a","message":"b"}}',
            "error",
            CLOSE_POLICY_VIOLATION,
        ),
        (
            '{"type":"job_result","id":"x","ok":false,"error":{"code":"a"}}',
            "error.message",
            CLOSE_POLICY_VIOLATION,
        ),
        ('{"type":"ping"}', "nonce", CLOSE_POLICY_VIOLATION),
        (b"\xff\xfe", "$", CLOSE_INVALID_PAYLOAD),
    ],
)
def test_malformed_frames_name_the_field_and_close_code(text, field, code):
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(text)
    assert info.value.field == field
    assert info.value.close_code == code
    assert field in info.value.reason
    assert len(info.value.reason.encode()) <= 123


def test_oversize_frame_is_refused_with_1009_before_parsing():
    text = _job(args={"blob": "x" * MAX_FRAME_BYTES})
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(text)
    assert info.value.close_code == CLOSE_MESSAGE_TOO_BIG
    assert info.value.field == "$"


def test_frame_just_under_the_limit_is_accepted():
    base = len(_job(args={"blob": ""}).encode())
    text = _job(args={"blob": "x" * (MAX_FRAME_BYTES - base)})
    assert len(text.encode()) == MAX_FRAME_BYTES
    assert decode_frame(text).args["blob"].startswith("x")


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(LocalProtocolError) as info:
        encode_frame(Job("", "j", "echo", {}, "k", 1.0))
    assert info.value.field == "id"
    with pytest.raises(LocalProtocolError):
        encode_frame(JobResult("d", True, {"x": object()}))
    with pytest.raises(LocalProtocolError):
        encode_frame(Job("d", "j", "echo", {"x": float("nan")}, "k", 1.0))


def test_job_timeout_s_is_optional_on_the_wire():
    """``timeout_s`` (the time left, a duration) is left out when unset, so a frame of a
    hub that does not send it still decodes."""
    assert "timeout_s" not in encode_frame(Job("d1", "j1", "echo", {}, "k1", 1.0))
    assert decode_frame(_job()).timeout_s is None
    assert decode_frame(_job(timeout_s=0)).timeout_s == 0.0


def test_job_result_wire_shape_omits_the_unused_half():
    ok = json.loads(encode_frame(JobResult("d", True, 5)))
    assert ok == {"type": "job_result", "id": "d", "ok": True, "result": 5}
    bad = json.loads(encode_frame(JobResult("d", False, error=JobError("c", "m"))))
    assert bad == {
        "type": "job_result",
        "id": "d",
        "ok": False,
        "error": {"code": "c", "message": "m"},
    }


def test_deeply_nested_json_is_a_protocol_error_not_a_crash():
    text = '{"type":"ping","nonce":' + "[" * 100000 + "]" * 100000 + "}"
    with pytest.raises(RemoteProtocolError):
        decode_frame(text)


def test_progress_round_trips_and_checks_its_fields():
    from deskbridge_common import Progress

    for frame in (Progress("d1", 3, 10, "three of ten"), Progress("d1", 0.5)):
        assert decode_frame(encode_frame(frame)) == frame
    assert "total" not in encode_frame(Progress("d1", 1))
    for bad in ({"progress": "1"}, {"progress": 1, "total": -1}, {"progress": 1, "message": 5}):
        with pytest.raises(RemoteProtocolError):
            decode_frame(json.dumps({"type": "progress", "id": "d1", **bad}))
    with pytest.raises(LocalProtocolError):
        encode_frame(Progress("d1", float("nan")))


class _CountingJson:
    """Stands in for the ``json`` module inside the codec, counting encodes and parses."""

    def __init__(self):
        self.dumps_calls = 0
        self.loads_calls = 0

    def dumps(self, *args, **kwargs):
        self.dumps_calls += 1
        return json.dumps(*args, **kwargs)

    def loads(self, *args, **kwargs):
        self.loads_calls += 1
        return json.loads(*args, **kwargs)


def test_encoding_serialises_once_and_never_parses(monkeypatch):
    import deskbridge_common._codec as codec

    counting = _CountingJson()
    monkeypatch.setattr(codec, "json", counting)
    big = {"rows": ["x" * 1000] * 1000}  # ~1 MB
    text = encode_frame(JobResult("d1", True, big))
    assert (counting.dumps_calls, counting.loads_calls) == (1, 0)
    monkeypatch.undo()
    assert decode_frame(text).result == big


def test_raw_json_result_is_spliced_not_reencoded(monkeypatch):
    import deskbridge_common._codec as codec
    from deskbridge_common import RawJSON

    raw = json.dumps({"rows": ["x" * 1000] * 1000}, separators=(",", ":"))
    counting = _CountingJson()
    monkeypatch.setattr(codec, "json", counting)
    text = encode_frame(JobResult("d1", True, RawJSON(raw)))
    assert counting.loads_calls == 0
    assert counting.dumps_calls == 1 and len(text) < len(raw) + 60  # the envelope only
    monkeypatch.undo()
    assert text == encode_frame(JobResult("d1", True, json.loads(raw)))
    with pytest.raises(LocalProtocolError) as info:
        encode_frame(JobResult("d1", True, RawJSON('"' + "x" * MAX_FRAME_BYTES + '"')))
    assert info.value.close_code == CLOSE_MESSAGE_TOO_BIG


def test_a_repeated_key_is_named_with_the_top_level_field_holding_it():
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame('{"type":"job_result","id":"x","ok":true,"result":{"a":{"b":1,"b":2}}}')
    assert info.value.field == "result"
    assert info.value.reason == "result: duplicate key 'b' in result"
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame('{"type":"ping","nonce":"a","nonce":"a"}')  # even with equal values
    assert info.value.reason == "nonce: duplicate key 'nonce' in the top-level object"
    # distinct keys in sibling and nested objects are fine
    text = '{"type":"job_result","id":"x","ok":true,"result":[{"a":1},{"a":{"a":2}}]}'
    frame = decode_frame(text)
    assert frame.result == [{"a": 1}, {"a": {"a": 2}}]


# -- the canonical ping/pong shortcut (issue 10: an idle desktop is a ping and a pong) --

import json as _json  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _general_decode(text: str):
    """What the general path makes of ``text`` (the shortcut defeated by a space)."""
    obj = _json.loads(text)
    return decode_frame(_json.dumps(obj, separators=(", ", ": ")))


@given(
    kind=st.sampled_from([Ping, Pong]),
    nonce=st.one_of(
        st.text(min_size=0, max_size=210),
        st.from_regex(r"[A-Za-z0-9_.:\-]{1,200}", fullmatch=True),  # the shortcut's own
    ),
)
def test_a_ping_or_pong_decodes_and_encodes_as_the_general_path_does(kind, nonce):
    frame = kind(nonce)
    try:
        text = encode_frame(frame)
    except LocalProtocolError:
        assert not nonce or len(nonce) > 200  # refused as the general path refuses it
        return
    # the text is what the JSON encoder writes, shortcut or not
    assert text == _json.dumps({"type": frame.type, "nonce": nonce}, separators=(",", ":"))
    assert decode_frame(text) == frame == _general_decode(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"ping","nonce":""}',  # empty nonce: refused
        '{"type":"ping","nonce":"' + "n" * 201 + '"}',  # too long: refused
        '{"type":"ping","nonce":"a","x":1}',  # extra field: refused
        '{"type":"ping","nonce":"a"} ',  # trailing space: the general path decides
        '{"type":"ping","nonce":"a\\u0041"}',  # an escape: the general path
    ],
)
def test_texts_near_the_canonical_form_get_the_general_paths_answer(text):
    try:
        expected = _general_decode(text)
    except (RemoteProtocolError, ValueError) as exc:
        expected = type(exc)
    try:
        got = decode_frame(text)
    except RemoteProtocolError as exc:
        got = type(exc)
    assert got == expected
