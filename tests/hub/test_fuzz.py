"""Fuzzing with Hypothesis: the codec, a hub session, and the dispatch HTTP API.

(a) ``decode_frame`` on arbitrary input only returns a frame or raises
    ``RemoteProtocolError`` with a documented close code.
(b) A hub session fed malformed, truncated, type-confused or oversized frames closes
    that socket with the code the codec names (1007/1008/1009) or keeps serving it
    (frames the protocol allows), never crashes, and another user's session on the same
    ``HubState`` keeps completing echo jobs meanwhile.
(c) Random bodies to ``POST /v1/users/{user}/jobs`` never get a 5xx other than the
    documented 503, and a 400 never enqueues anything.

Async examples run in their own ``trio.run`` on a ``MockClock`` with autojump (one
run per example: nothing leaks between examples, and no real time passes). Example
counts are modest and ``deadline=None`` (a trio run per example has a variable cost).
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    FRAME_TYPES,
    MAX_FRAME_BYTES,
    Cancel,
    Error,
    Frame,
    Hello,
    Job,
    JobError,
    JobResult,
    LocalProtocolError,
    Ping,
    Pong,
    Progress,
    RemoteProtocolError,
    Sleeping,
    Timings,
    ToolSpec,
    Welcome,
    decode_frame,
    encode_frame,
)
from deskbridge_common._codec import frame_to_dict
from deskbridge_hub import Bridge, HubConfig, create_app
from deskbridge_hub._inbound import FRAMES_PER_S
from deskbridge_hub._jobs import JobEnvelope
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState, serve_sidecar
from deskbridge_hub.testing import MemoryPeer, socket_pair
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

CLOSE_CODES = {CLOSE_INVALID_PAYLOAD, CLOSE_POLICY_VIOLATION, CLOSE_MESSAGE_TOO_BIG}
FRAME_CLASSES = (Hello, Welcome, Job, JobResult, Cancel, Progress, Sleeping, Ping, Pong, Error)
EPOCH = 1_700_000_000.0
#: Placeholder that the session fuzz replaces with the delivery id of a real in-flight job.
DELIVERED = "<delivered-id>"

# -- strategies --------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELD_NAMES = sorted(
    {
        *(a.name for cls in FRAME_CLASSES for a in attrs.fields(cls)),
        *(a.name for a in attrs.fields(ToolSpec)),
        "type",
        "extra",
    }
)
frame_types = st.sampled_from(sorted(FRAME_TYPES)) | st.text(max_size=10) | json_scalars
# Objects that look like frames: a plausible type and a random subset of real field
# names with values of any JSON type (type confusion, missing and extra fields).
frame_like = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    frame_types,
    st.dictionaries(st.sampled_from(FIELD_NAMES), json_values | st.just(DELIVERED), max_size=6),
)

ids = st.text(min_size=1, max_size=20)
tool_specs = st.builds(
    ToolSpec,
    name=st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True),
    description=st.text(max_size=20),
    side_effects=st.booleans(),
)
valid_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Hello,
        protocol_version=st.integers(0, 3),
        sidecar_version=st.text(min_size=1, max_size=10),
        tools=st.lists(tool_specs, max_size=3, unique_by=lambda t: t.name).map(tuple),
    ),
    st.builds(
        Welcome,
        session_id=ids,
        heartbeat_s=st.floats(0.1, 100),
        ping_interval_s=st.floats(0.1, 100),
        ping_timeout_s=st.floats(0.1, 100),
    ),
    st.builds(
        Job,
        id=ids,
        job_id=ids,
        name=st.text(min_size=1, max_size=10),
        args=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        idempotency_key=ids,
        deadline=st.floats(0, 2e9),
    ),
    st.builds(JobResult, id=ids | st.just(DELIVERED), ok=st.just(True), result=json_values),
    st.builds(
        JobResult,
        id=ids | st.just(DELIVERED),
        ok=st.just(False),
        error=st.builds(JobError, code=st.text(min_size=1, max_size=10), message=st.text()),
    ),
    st.builds(Cancel, id=ids),
    st.builds(Ping, nonce=ids),
    st.builds(Pong, nonce=ids),
    st.builds(Error, code=st.text(min_size=1, max_size=10), message=st.text(max_size=30)),
)


@st.composite
def mutated_frames(draw: st.DrawFn) -> dict[str, Any]:
    """A valid frame's JSON object with one thing wrong: a field dropped, retyped or
    added, or the type swapped for another frame's."""
    obj = frame_to_dict(draw(valid_frames))
    keys = sorted(obj)
    how = draw(st.sampled_from(["drop", "retype", "add", "swap-type", "none"]))
    if how == "drop":
        del obj[draw(st.sampled_from(keys))]
    elif how == "retype":
        obj[draw(st.sampled_from(keys))] = draw(json_values)
    elif how == "add":
        obj[draw(st.text(max_size=8))] = draw(json_values)
    elif how == "swap-type":
        obj["type"] = draw(st.sampled_from(sorted(FRAME_TYPES)))
    return obj


def _oversized(kind: str, extra: int) -> str:
    return json.dumps({"type": kind, "nonce": "a" * (MAX_FRAME_BYTES + extra)})


@st.composite
def wire_texts(draw: st.DrawFn) -> str | bytes:
    """What a sidecar could put in one WebSocket message."""
    obj = draw(frame_like | mutated_frames() | json_values)
    text = json.dumps(obj, allow_nan=draw(st.booleans()), ensure_ascii=draw(st.booleans()))
    shape = draw(st.sampled_from(["as-is", "truncated", "bytes", "garbage-tail", "nested"]))
    if shape == "truncated" and text:
        return text[: draw(st.integers(0, len(text) - 1))]
    if shape == "bytes":
        return text.encode(draw(st.sampled_from(["utf-8", "utf-16", "latin-1"])), "replace")
    if shape == "garbage-tail":
        return text + draw(st.text(min_size=1, max_size=5))
    if shape == "nested":
        depth = draw(st.integers(1, 3000))
        return '{"type":"job_result","id":"x","ok":true,"result":' + "[" * depth + "]" * depth + "}"
    return text


raw_inputs = (
    wire_texts()
    | st.text(max_size=200)
    | st.binary(max_size=200)
    | st.sampled_from(
        [
            "",
            "null",
            "[]",
            "{}",
            '{"type":null}',
            '{"type":"ping","nonce":NaN}',
            '{"type":"job_result","id":"a","ok":true,"result":Infinity}',
            '{"type":"job_result","id":"a","ok":true,"result":1e999}',
            '{"type":"job_result","id":"a","ok":1}',
            '{"type":"ping","nonce":"\\ud800"}',
            b"\xff\xfe\x00",
            _oversized("ping", 0),
            _oversized("ping", 1),
            _oversized("job_result", 1000),
            ("\u00e9" * (MAX_FRAME_BYTES // 2 + 1)),
        ]
    )
)


def expected_close(raw: str | bytes) -> int | None:
    """The close code a hub session must use after ``raw``, or None if it keeps the
    socket open (docs/protocol.md): what the codec says, and 1008 for a well-formed
    frame a sidecar may not send; 1003 for any binary message (the protocol is text)."""
    if isinstance(raw, bytes):
        return CLOSE_UNSUPPORTED_DATA
    try:
        frame = decode_frame(raw)
    except RemoteProtocolError as exc:
        return exc.close_code
    if isinstance(frame, Hello | Welcome | Job | Cancel):
        return CLOSE_POLICY_VIOLATION
    return None


# -- (a) the codec, pure -----------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(raw_inputs)
@example(_oversized("ping", 1))
@example("[" * 100_000)
@example(b'{"type": "ping", "nonce": "\xc3"}')
def test_decode_frame_returns_a_frame_or_a_remote_protocol_error(raw):
    try:
        frame = decode_frame(raw)
    except RemoteProtocolError as exc:
        assert exc.close_code in CLOSE_CODES
        assert isinstance(exc.field, str)  # may be "" (an empty key is a key)
        assert len(exc.reason.encode("utf-8")) <= 123  # fits a close frame
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        assert (exc.close_code == CLOSE_MESSAGE_TOO_BIG) == (size > MAX_FRAME_BYTES)
        return
    assert isinstance(frame, FRAME_CLASSES)


@settings(max_examples=300, deadline=None)
@given(valid_frames)
def test_valid_frames_round_trip(frame):
    assert decode_frame(encode_frame(frame)) == frame


def _finite_and_depth(value: Any) -> tuple[bool, int]:
    """(no inf/nan anywhere, nesting depth) of ``value``; iterative, since decoded
    frames can nest ~1000 deep."""
    finite, deepest = True, 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, float) and not math.isfinite(item):
            finite = False
        if attrs.has(type(item)):
            stack.extend((getattr(item, a.name), depth) for a in attrs.fields(type(item)))
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return finite, deepest


@settings(max_examples=300, deadline=None)
@given(raw_inputs)
def test_whatever_decode_accepts_encodes_again(raw):
    """A frame the hub accepted can be re-sent (the hub re-encodes results)."""
    try:
        frame = decode_frame(raw)
    except RemoteProtocolError:
        return
    finite, depth = _finite_and_depth(frame)
    assume(finite and depth <= 100)  # 1e999 and deep lists: see the tests below
    assert decode_frame(encode_frame(frame)) == frame


def test_overflowing_float_is_refused_like_infinity():
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame('{"type":"job_result","id":"a","ok":true,"result":1e999}')
    assert info.value.close_code == CLOSE_INVALID_PAYLOAD


def test_deeply_nested_result_is_refused_as_a_local_protocol_error():
    frame = decode_frame(
        '{"type":"job_result","id":"a","ok":true,"result":' + "[" * 900 + "]" * 900 + "}"
    )
    try:
        encode_frame(frame)
    except LocalProtocolError:
        pass


# -- (b) a hub session under fuzz --------------------------------------------------------


def _wall() -> float:
    return EPOCH + trio.current_time()


def _run(afn: Any, *args: Any) -> Any:
    return trio.run(afn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


async def _connect(nursery: trio.Nursery, state: HubState, user: str) -> MemoryPeer:
    hub_side, peer = socket_pair()
    if not state.reader.running:  # the process reader (the app runs it in production)
        await nursery.start(state.reader.run)
    nursery.start_soon(serve_sidecar, state, hub_side, user)  # a crash fails the test
    await peer.send(Hello(protocol_version=1, sidecar_version="fuzz"))
    assert isinstance(await peer.receive(), Welcome)
    return peer


async def _echo_sidecar(peer: MemoryPeer, executed: list[Job]) -> None:
    """A well-behaved sidecar: pongs at once, echoes every job's args."""
    async for raw in peer._inbox:
        frame = decode_frame(raw)
        if isinstance(frame, Ping):
            await peer.send(Pong(frame.nonce))
        elif isinstance(frame, Job):
            executed.append(frame)
            await peer.send(JobResult(frame.id, True, frame.args))


async def _next_job(peer: MemoryPeer) -> Job:
    while True:
        frame = await peer.receive()
        if isinstance(frame, Ping):
            await peer.send(Pong(frame.nonce))
        elif isinstance(frame, Job):
            return frame


def _substitute(raw: str | bytes, delivered_id: str) -> str | bytes:
    if isinstance(raw, str):
        return raw.replace(json.dumps(DELIVERED)[1:-1], delivered_id)
    return raw


async def _session_under_fuzz(messages: list[str | bytes]) -> None:
    state = HubState(
        substrate=MemorySubstrate(clock=_wall),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=_wall,
    )
    bridge = Bridge(state.substrate, state.timings, wall_clock=_wall)
    outcomes: dict[str, Any] = {}
    answered = {"bad": trio.Event(), "during": trio.Event()}

    async def call(tag: str, user: str, args: dict[str, Any]) -> None:
        outcomes[tag] = await bridge.dispatch(user, "echo", args, timeout_s=30)
        answered[tag].set()

    async with trio.open_nursery() as nursery:
        good = await _connect(nursery, state, "good")
        executed: list[Job] = []
        nursery.start_soon(_echo_sidecar, good, executed)
        bad = await _connect(nursery, state, "bad")
        # the bad sidecar holds a real delivery, so fuzzed results can name its id
        nursery.start_soon(call, "bad", "bad", {"victim": True})
        job = await _next_job(bad)
        nursery.start_soon(call, "during", "good", {"n": 1})  # in flight during the fuzz

        expected = None
        for raw in messages:
            raw = _substitute(raw, job.id)
            expected = expected_close(raw)
            await bad.send_raw(raw)
            if expected is not None:
                break
        event(f"hub closes with {expected}" if expected else "hub keeps the socket")
        if expected is None:
            await trio.testing.wait_all_tasks_blocked()
            assert not bad.closed.is_set(), (bad.close_code, bad.close_reason)
        else:
            with trio.fail_after(1):
                await bad.closed.wait()
            assert bad.close_code == expected, bad.close_reason
            await trio.testing.wait_all_tasks_blocked()
            assert await state.substrate.get_presence("bad") is None  # cleared with the socket

        # the other user was served all along, and still is
        after = await bridge.dispatch("good", "echo", {"n": 2}, timeout_s=30)
        assert after.status == "completed" and after.result == {"n": 2}
        with trio.fail_after(30):
            await answered["during"].wait()
        assert outcomes["during"].status == "completed"
        assert outcomes["during"].result == {"n": 1}
        assert [j.args for j in executed] == [{"n": 1}, {"n": 2}]
        assert await state.substrate.get_presence("good") is not None

        # the bad user's own caller gets a terminal answer, whatever it sent
        with trio.fail_after(60):
            await answered["bad"].wait()
        assert outcomes["bad"].status in {"completed", "failed", "expired", "cancelled", "timeout"}
        nursery.cancel_scope.cancel()


# Frames a sidecar may send (the hub must keep the socket), so that sequences mix
# allowed traffic with the one frame that ends the session.
allowed_sidecar_frames = valid_frames.filter(
    lambda f: isinstance(f, JobResult | Ping | Pong | Error)
).map(encode_frame)
session_messages = st.lists(
    raw_inputs | allowed_sidecar_frames | mutated_frames().map(json.dumps),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(session_messages)
@example(["{not json"])
@example([_oversized("ping", 1)])
@example(['{"type":"job_result","id":"' + DELIVERED + '","ok":"yes"}'])
@example(['{"type":"job_result","id":"' + DELIVERED + '","ok":true,"result":1e999}'])
@example(
    [
        '{"type":"job_result","id":"'
        + DELIVERED
        + '","ok":false,"error":{"code":"expired","message":""}}'
    ]
)
@example([encode_frame(Hello(protocol_version=1, sidecar_version="again"))])
@example([encode_frame(Cancel(DELIVERED))])
@example([encode_frame(Job(DELIVERED, "j", "echo", {}, "k", 1.0))])
@example([encode_frame(Welcome("s", 1.0, 1.0, 1.0))])
@example(['{"type":"ping","nonce":"n"}', '{"type":"pong","nonce":"n"}', "[1]"])
@example(['{"type":"job_result","id":"forged","ok":true}', '{"type":"ping"}'])
@example(['{"type":"job_result","id":"x","ok":true,"result":' + "[" * 3000 + "]" * 3000 + "}"])
def test_hub_session_survives_bad_frames_and_other_users_keep_working(messages):
    _run(_session_under_fuzz, messages)


def test_result_for_another_sessions_delivery_completes_nothing():
    """A sidecar cannot answer a job delivered to another user's socket: delivery ids
    are per socket, so replaying or guessing one is refused and logged."""

    async def scenario() -> None:
        state = HubState(
            substrate=MemorySubstrate(clock=_wall),
            timings=Timings(),
            consumer="hub-1",
            wall_clock=_wall,
        )
        bridge = Bridge(state.substrate, state.timings, wall_clock=_wall)
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            alice = await _connect(nursery, state, "alice")
            mallory = await _connect(nursery, state, "mallory")

            async def call() -> None:
                outcomes["alice"] = await bridge.dispatch("alice", "echo", {"v": 1}, timeout_s=30)

            nursery.start_soon(call)
            job = await _next_job(alice)
            await mallory.send(JobResult(job.id, True, {"v": "forged"}))  # a stolen id
            await mallory.send(JobResult(job.id, True, {"v": "forged"}))  # replayed
            await trio.sleep(5)
            assert "alice" not in outcomes
            await alice.send(JobResult(job.id, True, {"v": 1}))
            await alice.send(JobResult(job.id, True, {"v": "replay"}))  # a replay after done
            await trio.sleep(1)
            assert outcomes["alice"].result == {"v": 1}
            assert not alice.closed.is_set() and not mallory.closed.is_set()
            nursery.cancel_scope.cancel()

    _run(scenario)


# -- (c) the HTTP API under fuzz ---------------------------------------------------------

API_KEY = "fuzz-key"
SECRET = "fuzz-secret-0123456789abcdef0123456789"
job_bodies = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["echo", "sleep", "a.b-c_1", ""]) | json_values,
        "args": st.dictionaries(st.text(max_size=6), json_values, max_size=3) | json_values,
        "idempotency_key": st.sampled_from(["k-1", "order:42"]) | json_values,
        "timeout_s": st.sampled_from([0.5, 1, 30, 86400, 86401, -1, 0]) | json_values,
    },
)
good_job_bodies = st.fixed_dictionaries(
    {"name": st.sampled_from(["echo", "sleep", "a.b-c_1"])},
    optional={
        "args": st.dictionaries(st.text(max_size=6), json_values, max_size=3),
        "idempotency_key": st.sampled_from(["k-1", "order:42", "~!@#"]),
        "timeout_s": st.sampled_from([0.5, 1, 30, 86400]),
    },
)
http_bodies = (
    good_job_bodies.map(json.dumps)
    | job_bodies.map(json.dumps)
    | st.builds(lambda body, key, value: json.dumps({**body, key: value}), job_bodies,
                st.text(max_size=8), json_values)
    | json_values.map(lambda v: json.dumps(v, allow_nan=True))
    | st.text(max_size=50)
    | st.binary(max_size=50)
)  # fmt: skip


async def _post_fuzz_body(body: str | bytes, user: str) -> None:
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=(SECRET,), api_keys=(API_KEY,)), substrate=substrate)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        await substrate.set_presence("online", "sess-1", 10 * 86400.0)
        r = await client.post(
            f"/v1/users/{user}/jobs",
            data=body if isinstance(body, bytes) else body.encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        payload = await r.get_json()
        event(f"HTTP {r.status_code}")
        stream = substrate._streams.get(user)
        entries = [] if stream is None else list(stream.entries.values())
        enqueued = len(entries)
    for fields in entries:  # what the API accepts, a session can deliver
        envelope = JobEnvelope.from_fields(fields)
        job = Job("d-1", envelope.job_id, envelope.name, envelope.args,
                  envelope.idempotency_key, envelope.deadline)  # fmt: skip
        assert decode_frame(encode_frame(job)) == job
    assert r.status_code in (400, 503, 504), (r.status_code, payload)
    if r.status_code == 400:
        assert payload["error"]["code"] == "bad_request"
        assert isinstance(payload["error"]["field"], str)
        assert enqueued == 0
    elif r.status_code == 503:
        assert payload["status"] == "offline" and user == "offline"
        assert enqueued == 0
    else:
        assert payload["status"] == "timeout" and user == "online"
        assert enqueued == 1
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict) or set(parsed) - {
        "name",
        "args",
        "idempotency_key",
        "timeout_s",
    }:
        assert r.status_code == 400


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(http_bodies, st.sampled_from(["online", "offline"]))
@example('{"name": "echo", "args": {"x": NaN}}', "online")
@example('{"name": "echo", "timeout_s": 1' + "0" * 400 + "}", "online")
@example('{"name": "echo", "args": ' + "[" * 50_000 + "]" * 50_000 + "}", "online")
@example('{"name": "echo", "args": {"x": 1}, "timeout_s": 1}', "online")
def test_random_job_bodies_get_only_documented_answers(body, user):
    _run(_post_fuzz_body, body, user)


# -- flooding ----------------------------------------------------------------------------


async def _flood_scenario(report: dict[str, Any]) -> None:
    """``bad`` floods pings and never reads; ``good`` keeps working."""
    state = HubState(
        substrate=MemorySubstrate(clock=_wall),
        timings=Timings(),
        consumer="hub-1",
        wall_clock=_wall,
    )
    bridge = Bridge(state.substrate, state.timings, wall_clock=_wall)
    async with trio.open_nursery() as nursery:
        good = await _connect(nursery, state, "good")
        executed: list[Job] = []
        nursery.start_soon(_echo_sidecar, good, executed)
        bad = await _connect(nursery, state, "bad")
        report["sent"] = 0

        async def flood() -> None:
            try:
                while True:
                    await bad.send(Ping(f"n{report['sent']}"))
                    report["sent"] += 1
            except trio.BrokenResourceError:
                pass  # the hub closed the socket (4002): the blocked send fails, as on TCP

        nursery.start_soon(flood)
        await trio.testing.wait_all_tasks_blocked()
        report["sent_when_blocked"] = report["sent"]
        for n in range(20):
            outcome = await bridge.dispatch("good", "echo", {"n": n}, timeout_s=30)
            assert outcome.status == "completed" and outcome.result == {"n": n}
        started = trio.current_time()
        with trio.move_on_after(120):
            await bad.closed.wait()
        report["closed_after_s"] = trio.current_time() - started if bad.closed.is_set() else None
        report["close_code"] = bad.close_code
        nursery.cancel_scope.cancel()


def test_a_ping_flood_is_backpressured_and_other_users_keep_working():
    """Pongs go through the session's bounded send queue: a sidecar that floods pings
    and never reads stalls its own session (its sends block), not the hub."""
    report: dict[str, Any] = {}
    _run(_flood_scenario, report)
    # bounded: socket buffer to the peer (1000) + send queue (256) + socket buffer to
    # the hub (1000) + a few in hand; a hub that buffered without limit would take all.
    # The hub reads the peer at its inbound budget (``_inbound``): the bound is reached
    # over seconds, not at once, and then holds until the socket is closed.
    assert report["sent_when_blocked"] <= 1000 + 256 + 1000 + 10
    assert report["sent"] <= 1000 + 256 + 1000 + 10


def test_a_flooding_sidecar_that_never_reads_is_dropped_by_the_ping_deadline():
    report: dict[str, Any] = {}
    _run(_flood_scenario, report)
    t = Timings()
    assert report["close_code"] == 4002
    # plus the time the inbound budget takes to read enough pings to fill the send queue
    # and the peer's buffer with pongs
    fill_s = (1000 + 256) / FRAMES_PER_S
    assert report["closed_after_s"] <= t.ping_interval_s + t.ping_timeout_s + fill_s + 1
