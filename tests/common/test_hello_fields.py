"""The optional ``hello`` fields of issue 12 (``daemon_id``, ``slept_s``) and the
``sleeping`` frame: pure codec and Connection tests, no event loop."""

from __future__ import annotations

import json

import pytest
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY_VIOLATION,
    PROTOCOL_VERSION,
    Connection,
    Hello,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
    Sleeping,
    Welcome,
    decode_frame,
    encode_frame,
)


def test_hello_round_trips_daemon_id_and_slept_s():
    hello = Hello(PROTOCOL_VERSION, "0.1.0", daemon_id="d-1", slept_s=12.5)
    text = encode_frame(hello)
    assert json.loads(text)["daemon_id"] == "d-1"
    assert json.loads(text)["slept_s"] == 12.5
    assert decode_frame(text) == hello


def test_hello_leaves_unset_optional_fields_out():
    text = encode_frame(Hello(PROTOCOL_VERSION, "0.1.0"))
    assert set(json.loads(text)) == {"type", "protocol_version", "sidecar_version", "tools"}
    assert decode_frame(text) == Hello(PROTOCOL_VERSION, "0.1.0")


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"daemon_id": 7}, "daemon_id", CLOSE_INVALID_PAYLOAD),
        ({"daemon_id": ""}, "daemon_id", CLOSE_INVALID_PAYLOAD),
        ({"daemon_id": "x" * 201}, "daemon_id", CLOSE_INVALID_PAYLOAD),
        ({"slept_s": -0.5}, "slept_s", CLOSE_INVALID_PAYLOAD),
        ({"slept_s": "5"}, "slept_s", CLOSE_INVALID_PAYLOAD),
        ({"slept_s": True}, "slept_s", CLOSE_INVALID_PAYLOAD),
    ],
)
def test_hello_refuses_bad_optional_fields(body, field, code):
    text = json.dumps({"type": "hello", "protocol_version": 1, "sidecar_version": "x", **body})
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(text)
    assert info.value.field == field
    assert info.value.close_code == code
    with pytest.raises(LocalProtocolError):
        encode_frame(Hello(1, "x", **body))


def test_slept_s_zero_is_allowed():
    assert decode_frame(encode_frame(Hello(1, "x", slept_s=0))) == Hello(1, "x", slept_s=0.0)


def test_sleeping_frame_has_no_fields():
    assert encode_frame(Sleeping()) == '{"type":"sleeping"}'
    assert decode_frame('{"type":"sleeping"}') == Sleeping()
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame('{"type":"sleeping","for_s":3}')
    assert (info.value.field, info.value.close_code) == ("for_s", CLOSE_POLICY_VIOLATION)


def _open_pair() -> tuple[Connection, Connection]:
    hub, sidecar = Connection(Role.HUB), Connection(Role.SIDECAR)
    hub.receive(sidecar.send(Hello(PROTOCOL_VERSION, "0.1.0", daemon_id="d")))
    sidecar.receive(hub.send(Welcome("s", 10.0, 10.0, 10.0)))
    return hub, sidecar


def test_only_an_open_sidecar_may_say_it_is_going_to_sleep():
    hub, sidecar = _open_pair()
    assert hub.receive(sidecar.send(Sleeping())) == [Sleeping()]
    with pytest.raises(LocalProtocolError):
        hub.send(Sleeping())  # hub -> sidecar: not in the table
    fresh = Connection(Role.SIDECAR)
    with pytest.raises(LocalProtocolError):
        fresh.send(Sleeping())  # before hello
