"""The sans-I/O Connection's refusals and ignored frames, exactly (issue 15).

The close reason is what the peer reads; an :class:`Ignored` event is what the I/O
layer logs. Both are pinned word for word here, with the close code each refusal
carries, so a changed reason or a lost frame in an event turns a test red.
"""

from __future__ import annotations

import pytest
from deskbridge_common import (
    CLOSE_ABNORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    PROTOCOL_VERSION,
    Cancel,
    Connection,
    Hello,
    Ignored,
    Job,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    Progress,
    RemoteProtocolError,
    Role,
    Welcome,
    encode_frame,
)

HUB, SIDECAR = Role.HUB, Role.SIDECAR
HELLO = Hello(PROTOCOL_VERSION, "0.1.0")
WELCOME = Welcome("s1", 10.0, 10.0, 7.0)
JOB = Job("d1", "j1", "echo", {}, "k1", 1e10)


def open_pair() -> tuple[Connection, Connection]:
    hub, sidecar = Connection(HUB), Connection(SIDECAR)
    hub.receive(sidecar.send(HELLO))
    sidecar.receive(hub.send(WELCOME))
    return hub, sidecar


def _refused(conn: Connection, text: str | bytes) -> tuple[str, int]:
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive(text)
    assert (conn.close_code, conn.close_reason) == (info.value.close_code, info.value.reason)
    return info.value.reason, info.value.close_code


def _unsendable(conn: Connection, frame, **kw) -> tuple[str, int]:
    with pytest.raises(LocalProtocolError) as info:
        conn.send(frame, **kw)
    return info.value.reason, info.value.close_code


def test_both_ends_keep_the_welcome_that_opened_the_socket():
    hub, sidecar = open_pair()
    assert hub.welcome == sidecar.welcome == WELCOME
    assert hub.hello == sidecar.hello == HELLO


def test_received_refusals_give_the_peer_their_exact_reason():
    hub, sidecar = open_pair()
    assert _refused(hub, encode_frame(JOB)) == (
        "type: unexpected job frame from sidecar", CLOSE_POLICY_VIOLATION)
    hub, sidecar = open_pair()
    sidecar.receive(hub.send(JOB))
    assert _refused(sidecar, encode_frame(JOB)) == (
        "id: delivery id is already outstanding", CLOSE_POLICY_VIOLATION)
    hub, _ = open_pair()
    assert _refused(hub, encode_frame(Progress("d7", 1.0))) == (
        "id: progress for a delivery that is not outstanding", CLOSE_POLICY_VIOLATION)
    assert _refused(Connection(HUB), encode_frame(HELLO).encode()) == (
        "$: binary frames are not part of the protocol", CLOSE_UNSUPPORTED_DATA)


def test_receive_after_the_socket_is_gone_is_a_bug_here():
    hub, _ = open_pair()
    hub.closed(CLOSE_ABNORMAL)
    with pytest.raises(LocalProtocolError) as info:
        hub.receive(encode_frame(Ping("n1")))
    assert info.value.reason == "$: receive() on a closed connection"


def test_ignored_frames_carry_the_frame_and_say_why():
    hub, sidecar = open_pair()
    stray = JobResult("d7", True, 1)
    assert hub.receive(encode_frame(stray)) == [
        Ignored(stray, "job_result for a delivery id not outstanding on this socket")]
    assert sidecar.receive(encode_frame(Cancel("d7"))) == [
        Ignored(Cancel("d7"), "cancel for a delivery not outstanding (answered already?)")]
    assert hub.receive(encode_frame(Pong("nobody"))) == [
        Ignored(Pong("nobody"), "pong for no outstanding ping")]


def test_unsendable_frames_name_the_field_and_the_close_code():
    hub, sidecar = open_pair()
    assert _unsendable(sidecar, JOB) == (
        "type: sidecar may not send job in state open", CLOSE_POLICY_VIOLATION)
    fresh = Connection(SIDECAR)
    assert _unsendable(fresh, Hello(PROTOCOL_VERSION + 1, "9"))[0] == (
        f"protocol_version: this end speaks {PROTOCOL_VERSION}")
    sidecar.receive(hub.send(JOB))
    assert _unsendable(hub, JOB)[0] == "id: delivery id is already outstanding"
    assert _unsendable(sidecar, Progress("d7", 1.0))[0] == (
        "id: progress for a delivery that is not outstanding")
    assert _unsendable(hub, Cancel("d7"))[0] == "id: cancel for a delivery that is not outstanding"
    hub.send(Ping("n1"), now_s=0.0)
    assert _unsendable(hub, Ping("n1"), now_s=1.0)[0] == (
        "nonce: a ping with this nonce is outstanding")
    assert _unsendable(hub, Ping("n2"))[0] == "$: send(Ping) needs now_s to start its deadline"


def test_a_ping_sent_before_any_timeout_is_known_has_no_deadline():
    hub = Connection(HUB)
    hub.receive(Connection(SIDECAR).send(HELLO))
    hub.send(Ping("n1"))  # no ping timeout yet: now_s is not needed
    assert hub.pending_pings == {"n1": None}
    assert hub.deadline_s is None
    hub.check_deadlines(1e12)


def test_a_socket_gone_without_a_reason_records_an_empty_reason():
    hub, _ = open_pair()
    hub.closed(CLOSE_ABNORMAL)
    assert (hub.close_code, hub.close_reason) == (CLOSE_ABNORMAL, "")
