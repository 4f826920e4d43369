"""The sans-I/O Connection: table-driven, no event loop.

Every (role, state, frame type) is tried in both directions: what the table allows goes
through, everything else raises with its close code (LocalProtocolError when sending,
RemoteProtocolError when receiving) — every illegal transition, not a sample.
"""

from __future__ import annotations

import itertools

import pytest
from deskbridge_common import (
    CLOSE_ABNORMAL,
    CLOSE_GOING_AWAY,
    CLOSE_INVALID_PAYLOAD,
    CLOSE_PING_TIMEOUT,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    FRAME_TYPES,
    PROTOCOL_VERSION,
    Cancel,
    Connection,
    ConnectionState,
    Error,
    Hello,
    Ignored,
    Job,
    JobError,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    Progress,
    RemoteProtocolError,
    Role,
    Sleeping,
    Welcome,
    encode_frame,
)
from deskbridge_common._connection import SENDABLE

S = ConnectionState
HUB, SIDECAR = Role.HUB, Role.SIDECAR
HELLO = Hello(PROTOCOL_VERSION, "0.1.0")
WELCOME = Welcome("s1", 10.0, 10.0, 7.0)
JOB = Job("d1", "j1", "echo", {}, "k1", 1e10)

#: One valid frame of each type (delivery id "d1", outstanding where it must be).
SAMPLES = {
    "hello": HELLO,
    "welcome": WELCOME,
    "job": Job("d2", "j2", "echo", {}, "k2", 1e10),
    "job_result": JobResult("d1", True, {"x": 1}),
    "progress": Progress("d1", 1, 10, "one of ten"),
    "cancel": Cancel("d1"),
    "sleeping": Sleeping(),
    "ping": Ping("n8"),
    "pong": Pong("n9"),
    "error": Error("bye", "going away"),
}


def test_samples_cover_every_frame_type():
    assert set(SAMPLES) == FRAME_TYPES


def pair() -> tuple[Connection, Connection]:
    return Connection(HUB), Connection(SIDECAR)


def shuttle(sender: Connection, receiver: Connection, frame):
    return receiver.receive(sender.send(frame, now_s=0.0))


def in_state(role: Role, state: ConnectionState) -> Connection:
    """A connection of ``role`` driven to ``state`` the legal way; when open, delivery d1
    is outstanding and the peer's ping n9 is not (so pong n9 tests only direction)."""
    hub, sidecar = pair()
    if state is not S.AWAIT_HELLO:
        shuttle(sidecar, hub, HELLO)
    if state in (S.OPEN, S.CLOSING):
        shuttle(hub, sidecar, WELCOME)
        shuttle(hub, sidecar, JOB)
    conn = hub if role is HUB else sidecar
    if state is S.CLOSING:
        conn.close(CLOSE_GOING_AWAY, "stopping")
    if role is HUB and state is S.OPEN:
        conn.send(Ping("n9"), now_s=0.0)  # so the sidecar's pong n9 is an answer
    if role is SIDECAR and state is S.OPEN:
        conn.send(Ping("n9"), now_s=0.0)
    assert conn.state is state
    return conn


STATES = [S.AWAIT_HELLO, S.AWAIT_WELCOME, S.OPEN, S.CLOSING]
CASES = list(itertools.product([HUB, SIDECAR], STATES, sorted(FRAME_TYPES)))


def _id(case):
    role, state, kind = case
    return f"{role.value}-{state.value}-{kind}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_send_follows_the_table(case):
    role, state, kind = case
    conn = in_state(role, state)
    frame = SAMPLES[kind]
    if role is SIDECAR and kind == "pong":
        frame = Pong("from-hub")  # a pong may answer any ping of the peer
    if kind in SENDABLE[(role, state)]:
        text = conn.send(frame, now_s=0.0)
        assert text == encode_frame(frame)
    else:
        before = (conn.state, conn.outstanding, conn.pending_pings)
        with pytest.raises(LocalProtocolError) as info:
            conn.send(frame, now_s=0.0)
        assert info.value.field == "type"
        assert (conn.state, conn.outstanding, conn.pending_pings) == before


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_receive_holds_the_peer_to_the_table(case):
    role, state, kind = case
    conn = in_state(role, state)
    text = encode_frame(SAMPLES[kind])
    if state is S.CLOSING:
        assert conn.receive(text) == []  # dropped once a close is decided
        assert conn.close_code == CLOSE_GOING_AWAY
    elif kind in SENDABLE[(role.peer, state)]:
        events = conn.receive(text)
        assert len(events) == 1
        assert conn.close_code is None
    else:
        with pytest.raises(RemoteProtocolError) as info:
            conn.receive(text)
        assert info.value.close_code == CLOSE_POLICY_VIOLATION
        assert info.value.field == "type"
        assert conn.state is S.CLOSING
        assert conn.close_code == CLOSE_POLICY_VIOLATION


def test_handshake_in_order():
    hub, sidecar = pair()
    assert (hub.state, sidecar.state) == (S.AWAIT_HELLO, S.AWAIT_HELLO)
    assert shuttle(sidecar, hub, HELLO) == [HELLO]
    assert (hub.state, sidecar.state) == (S.AWAIT_WELCOME, S.AWAIT_WELCOME)
    assert hub.hello == HELLO
    assert shuttle(hub, sidecar, WELCOME) == [WELCOME]
    assert (hub.state, sidecar.state) == (S.OPEN, S.OPEN)
    assert hub.ping_timeout_s == sidecar.ping_timeout_s == 7.0


def test_hub_expects_hello_first_with_its_message():
    hub = Connection(HUB)
    with pytest.raises(RemoteProtocolError) as info:
        hub.receive(encode_frame(Ping("n1")))
    assert info.value.reason == "type: expected hello, got ping"


def test_sidecar_expects_welcome_with_its_message():
    sidecar = in_state(SIDECAR, S.AWAIT_WELCOME)
    with pytest.raises(RemoteProtocolError) as info:
        sidecar.receive(encode_frame(JOB))
    assert info.value.reason == "type: expected welcome, got job"


def test_unsupported_protocol_version_is_refused_both_ways():
    hub, sidecar = pair()
    with pytest.raises(LocalProtocolError):
        sidecar.send(Hello(PROTOCOL_VERSION + 1, "9"))
    assert sidecar.state is S.AWAIT_HELLO
    with pytest.raises(RemoteProtocolError) as info:
        hub.receive(encode_frame(Hello(PROTOCOL_VERSION + 1, "9")))
    assert info.value.close_code == CLOSE_POLICY_VIOLATION
    assert info.value.field == "protocol_version"
    assert "hub speaks 1" in info.value.reason


def test_binary_messages_close_1003():
    hub = Connection(HUB)
    with pytest.raises(RemoteProtocolError) as info:
        hub.receive(encode_frame(HELLO).encode())
    assert info.value.close_code == CLOSE_UNSUPPORTED_DATA
    assert hub.close_code == CLOSE_UNSUPPORTED_DATA


def test_bad_json_closes_with_the_codecs_code():
    hub = Connection(HUB)
    with pytest.raises(RemoteProtocolError) as info:
        hub.receive("{not json")
    assert info.value.close_code == CLOSE_INVALID_PAYLOAD
    assert hub.state is S.CLOSING


def open_pair() -> tuple[Connection, Connection]:
    hub, sidecar = pair()
    shuttle(sidecar, hub, HELLO)
    shuttle(hub, sidecar, WELCOME)
    return hub, sidecar


def test_delivery_ids_are_tracked_on_both_ends():
    hub, sidecar = open_pair()
    assert shuttle(hub, sidecar, JOB) == [JOB]
    assert hub.outstanding == sidecar.outstanding == {"d1"}
    progress = Progress("d1", 0.5)
    assert shuttle(sidecar, hub, progress) == [progress]
    assert shuttle(hub, sidecar, Cancel("d1")) == [Cancel("d1")]
    result = JobResult("d1", False, error=JobError("cancelled", "cancelled by the hub"))
    assert shuttle(sidecar, hub, result) == [result]
    assert hub.outstanding == sidecar.outstanding == set()


def test_hub_may_not_reuse_an_outstanding_delivery_id():
    hub, sidecar = open_pair()
    shuttle(hub, sidecar, JOB)
    with pytest.raises(LocalProtocolError):
        hub.send(JOB)
    with pytest.raises(RemoteProtocolError) as info:
        sidecar.receive(encode_frame(JOB))
    assert info.value.close_code == CLOSE_POLICY_VIOLATION


@pytest.mark.parametrize(
    "frame", [JobResult("d7", True, 1), Progress("d7", 1.0)], ids=["job_result", "progress"]
)
def test_sidecar_may_answer_only_outstanding_deliveries(frame):
    hub, sidecar = open_pair()
    with pytest.raises(LocalProtocolError) as info:
        sidecar.send(frame)
    assert info.value.field == "id"


def test_hub_may_cancel_only_outstanding_deliveries():
    hub, _ = open_pair()
    with pytest.raises(LocalProtocolError):
        hub.send(Cancel("d7"))


def test_progress_for_no_outstanding_delivery_closes_1008():
    hub, _ = open_pair()
    with pytest.raises(RemoteProtocolError) as info:
        hub.receive(encode_frame(Progress("d7", 1.0)))
    assert info.value.close_code == CLOSE_POLICY_VIOLATION
    assert hub.state is S.CLOSING


def test_stray_result_cancel_and_pong_are_ignored_not_fatal():
    hub, sidecar = open_pair()
    [event] = hub.receive(encode_frame(JobResult("d7", True, 1)))
    assert isinstance(event, Ignored) and "not outstanding" in event.reason
    [event] = sidecar.receive(encode_frame(Cancel("d7")))
    assert isinstance(event, Ignored)
    [event] = hub.receive(encode_frame(Pong("nobody")))
    assert isinstance(event, Ignored)
    assert hub.state is sidecar.state is S.OPEN


def test_a_result_answered_twice_is_ignored_the_second_time():
    hub, sidecar = open_pair()
    shuttle(hub, sidecar, JOB)
    text = sidecar.send(JobResult("d1", True, 1))
    assert hub.receive(text) == [JobResult("d1", True, 1)]
    assert isinstance(hub.receive(text)[0], Ignored)


@pytest.mark.parametrize("role", [HUB, SIDECAR])
def test_ping_deadline(role):
    hub, sidecar = open_pair()
    me, peer = (hub, sidecar) if role is HUB else (sidecar, hub)
    text = me.send(Ping("n1"), now_s=100.0)
    assert me.deadline_s == 107.0
    me.check_deadlines(106.9)
    [ping] = peer.receive(text)
    assert me.receive(peer.send(Pong(ping.nonce))) == [Pong("n1")]
    assert me.deadline_s is None
    me.send(Ping("n2"), now_s=200.0)
    with pytest.raises(RemoteProtocolError) as info:
        me.check_deadlines(207.0)
    assert (info.value.close_code, info.value.reason) == (CLOSE_PING_TIMEOUT, "no pong within 7 s")
    assert me.state is S.CLOSING


@pytest.mark.parametrize("role", [HUB, SIDECAR])
def test_a_pings_deadline_counts_from_its_write_and_waits_for_the_write_ahead(role):
    """Timeout 7 s. A ping queued behind a large frame is judged from its own write, not
    its queueing; while the frame ahead is being written the ping waits for it, up to
    ``ping_timeout_s + size / min_write_bytes_s`` from that write's start (the peer then
    counts as having stopped reading); a dropped ping keeps its deadline from ``send``."""
    hub, sidecar = open_pair()
    me, peer = (hub, sidecar) if role is HUB else (sidecar, hub)
    me.min_write_bytes_s = 1_000.0
    big = "x" * 20_000  # 20 s at the floor rate
    me.writing(big, 100.0)  # a large frame goes out (any text: only its size counts)
    ping = me.send(Ping("n1"), now_s=101.0)
    assert me.queued_pings == {"n1"}
    assert me.write_deadline_s == 100.0 + 7.0 + 20.0
    assert me.deadline_s == 127.0
    me.check_deadlines(126.9)  # 25.9 s after the queueing: not the peer's silence
    assert me.wrote(big, 126.0)  # the frame ahead is written: the ping counts from here
    assert me.deadline_s == 133.0
    me.writing(ping, 126.0)
    assert me.wrote(ping, 130.0)  # written: its own 7 s from now
    assert me.queued_pings == frozenset() and me.deadline_s == 137.0
    me.check_deadlines(136.9)
    assert me.receive(peer.send(Pong(peer.receive(ping)[0].nonce))) == [Pong("n1")]
    assert me.deadline_s is None
    assert not me.wrote(big, 140.0)  # no ping queued: nothing moved

    # a write that stalls with a ping behind it ends the connection at its bound
    me.writing(big, 200.0)
    me.send(Ping("n2"), now_s=200.5)
    me.check_deadlines(226.9)
    with pytest.raises(RemoteProtocolError) as info:
        me.check_deadlines(227.0)
    assert info.value.close_code == CLOSE_PING_TIMEOUT
    assert "a frame of 20000 bytes not written within 27 s" in info.value.reason
    assert me.state is S.CLOSING


def test_a_dropped_ping_keeps_its_deadline_from_send():
    hub, _ = open_pair()
    hub.writing("x" * 50_000, 0.0)
    text = hub.send(Ping("n1"), now_s=1.0)
    hub.dropped(text)  # never queued: writes no longer hold or restart it
    assert hub.queued_pings == frozenset()
    assert hub.deadline_s == 8.0
    hub.wrote("x" * 50_000, 5.0)
    assert hub.deadline_s == 8.0
    with pytest.raises(RemoteProtocolError):
        hub.check_deadlines(8.0)


def test_ping_needs_now_and_a_fresh_nonce():
    hub, _ = open_pair()
    with pytest.raises(LocalProtocolError):
        hub.send(Ping("n1"))
    hub.send(Ping("n1"), now_s=0.0)
    with pytest.raises(LocalProtocolError):
        hub.send(Ping("n1"), now_s=1.0)


def test_handshake_deadlines_name_what_was_missing():
    hub = Connection(HUB, now_s=50.0, handshake_timeout_s=10.0)
    assert hub.deadline_s == 60.0
    hub.check_deadlines(59.0)
    with pytest.raises(RemoteProtocolError) as info:
        hub.check_deadlines(60.0)
    assert (info.value.close_code, info.value.reason) == (
        CLOSE_POLICY_VIOLATION,
        "no hello within 10 s",
    )
    sidecar = Connection(SIDECAR, now_s=0.0, handshake_timeout_s=10.0)
    sidecar.send(HELLO)
    with pytest.raises(RemoteProtocolError) as info:
        sidecar.check_deadlines(10.0)
    assert (info.value.close_code, info.value.reason) == (
        CLOSE_PING_TIMEOUT,
        "no welcome within 10 s",
    )


def test_handshake_deadline_ends_with_the_handshake():
    hub = Connection(HUB, now_s=0.0, handshake_timeout_s=10.0)
    sidecar = Connection(SIDECAR)
    shuttle(sidecar, hub, HELLO)
    shuttle(hub, sidecar, WELCOME)
    assert hub.deadline_s is None
    hub.check_deadlines(1e9)


def test_close_keeps_the_first_code_and_allows_only_error():
    hub, _ = open_pair()
    hub.close(CLOSE_GOING_AWAY, "x" * 300)
    assert hub.close_code == CLOSE_GOING_AWAY
    assert len(hub.close_reason.encode()) <= 123
    hub.send(Error("bye", "shutting down"))
    with pytest.raises(LocalProtocolError):
        hub.send(Ping("n1"), now_s=0.0)
    hub.closed(CLOSE_ABNORMAL)
    assert (hub.state, hub.close_code) == (S.CLOSED, CLOSE_GOING_AWAY)


def test_closed_connection_refuses_everything():
    hub, _ = open_pair()
    hub.closed(CLOSE_ABNORMAL, "connection lost")
    assert hub.close_code == CLOSE_ABNORMAL
    with pytest.raises(LocalProtocolError):
        hub.receive(encode_frame(Ping("n1")))
    for frame in SAMPLES.values():
        with pytest.raises(LocalProtocolError):
            hub.send(frame, now_s=0.0)


def test_unencodable_frame_leaves_the_connection_unchanged():
    hub, sidecar = open_pair()
    shuttle(hub, sidecar, JOB)
    with pytest.raises(LocalProtocolError):
        sidecar.send(JobResult("d1", True, {1j}))
    assert sidecar.outstanding == {"d1"}
    sidecar.send(JobResult("d1", True, "fine"))
    assert sidecar.outstanding == set()
