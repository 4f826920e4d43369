"""Every RedisSubstrate operation of the caller's path, the finishing step, the job
stream and the job commands names itself when Redis is unreachable: in the
SubstrateUnavailable message (``... unavailable (<operation>): ...``) and as the
``operation`` label of ``deskbridge_redis_errors_total`` (docs/operations.md), which is
how an operator tells a failing submit from a failing heartbeat. No Redis needed: the
port is closed, or a fake server answers some commands and drops the connection."""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._idempotency import IndexRecord
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import JobOwner, Submission
from prometheus_client import REGISTRY

STATE = JobState(Stage.DELIVERED, "u1", at=1.0, session_id="s1")
SUBMISSION = Submission(
    job_id="j1",
    fields={"job_id": "j1", "name": "echo"},
    start_within_s=30.0,
    state=JobState(Stage.QUEUED, "u1", at=1.0),
    state_ttl_s=60.0,
    maxlen=100,
    catalogue_sha1=None,
    idempotency_key=None,
    index_value=IndexRecord("j1", "echo", "d1").encode(),
    index_ttl_s=60.0,
    owner=JobOwner("u1"),
)

Call = Callable[[RedisSubstrate], Awaitable[Any]]

#: (operation label, a call that sends it first).
OPERATIONS: list[tuple[str, Call]] = [
    # the finishing step (_redis_finish)
    ("finish", lambda s: s.finish("u1", "j1", "r", STATE, ttl_s=60, entry_id="1-0", epoch=1)),
    ("finish", lambda s: s.publish_result("u1", "j1", "r", ttl_s=60)),
    # the caller's path (_redis_caller)
    ("submit", lambda s: s.submit("u1", SUBMISSION)),
    ("SET NX job owner", lambda s: s.claim_job_id("j1", JobOwner("u1"), ttl_s=60)),
    ("GET job owner", lambda s: s.job_owner("j1")),
    ("DEL job owner", lambda s: s.forget_job_id("j1", JobOwner("u1"))),
    ("reclaim job owner",
     lambda s: s.claim_job_id("j1", JobOwner("u1"), ttl_s=60, replace=True)),
    ("LINDEX result", lambda s: s.get_result("u1", "j1")),
    ("BLMPOP notify", lambda s: s.read_notifications("box", count=1, block_ms=10)),
    # results, progress, state, catalogue (_redis_jobs)
    ("BLPOP result", lambda s: s.wait_result("u1", "j1", timeout_s=0.01)),
    ("XADD progress", lambda s: s.publish_progress("j1", "{}", ttl_s=60)),
    ("XREAD progress", lambda s: s.read_progress("j1", "0", block_ms=10)),
    ("SET state", lambda s: s.set_job_state("u1", "j1", STATE, ttl_s=60)),
    ("SET NX state", lambda s: s.claim_job("u1", "j1", STATE, ttl_s=60)),
    ("GET state", lambda s: s.get_job_state("u1", "j1")),
    ("mark delivered", lambda s: s.mark_delivered("u1", "j1", STATE, ttl_s=60)),
    ("read + mark delivered",
     lambda s: s.read_new_delivered("u1", "c1", count=1, state=STATE, ttl_s=60)),
    ("SET cancel", lambda s: s.request_cancel("u1", "j1", ttl_s=60)),
    ("EXISTS cancel", lambda s: s.cancel_requested("u1", "j1")),
    ("restore delivery",
     lambda s: s.restore_delivery("u1", "j1", STATE, epoch=1, ttl_s=60)),
    ("keep job", lambda s: s.keep_job("u1", "j1", ttl_s=60, idempotency_key="k1")),
    ("SET tools", lambda s: s.set_catalogue("u1", "[]")),
    ("GET tools", lambda s: s.get_catalogue("u1")),
    # the job stream (_redis_streams)
    ("XADD", lambda s: s.enqueue("u1", {"job_id": "j1"}, maxlen=100)),
    ("cancel control", lambda s: s.send_cancel("u1", "j1", ttl_s=60, maxlen=100)),
    ("XPENDING+XRANGE", lambda s: s.read_pending("u1", "c1", count=1)),
    ("XREADGROUP >", lambda s: s.read_new("u1", "c1", count=1, block_ms=10)),
    ("XACK", lambda s: s.ack("u1", "1-0")),
    ("XAUTOCLAIM",
     lambda s: s.autoclaim("u1", "c1", min_idle_ms=1, start="0-0", count=1)),
    ("XINFO CONSUMERS", lambda s: s.prune_consumers("u1", idle_ms=1, keep="c1")),
    ("HMGET index", lambda s: s.job_ids("u1", ["1-0"])),
    ("XRANGE+HGETALL", lambda s: s.trimmed("u1")),
    ("HDEL index", lambda s: s.forget("u1", "1-0")),
    ("XPENDING", lambda s: s.queue_info("u1")),
]  # fmt: skip


def _errors(operation: str) -> float:
    labels = {"operation": operation}
    return REGISTRY.get_sample_value("deskbridge_redis_errors_total", labels) or 0.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again at the end of the block


async def _names_itself(s: RedisSubstrate, operation: str, call: Call) -> None:
    before = _errors(operation)
    with trio.fail_after(5):
        with pytest.raises(SubstrateUnavailable) as info:
            await call(s)
    assert f"unavailable ({operation}):" in str(info.value), str(info.value)
    assert _errors(operation) == before + 1


@pytest.mark.parametrize(("operation", "call"), OPERATIONS, ids=[o for o, _ in OPERATIONS])
async def test_an_unreachable_redis_names_the_failed_operation(operation: str, call: Call) -> None:
    s = RedisSubstrate.from_url(f"redis://127.0.0.1:{_closed_port()}/0", connect_timeout_s=1.0)
    await _names_itself(s, operation, call)


HELLO_REPLY = b"%3\r\n$5\r\nproto\r\n:3\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$2\r\nid\r\n:1\r\n"


async def _commands(stream: trio.SocketStream, buffer: bytearray) -> list[str] | None:
    """The next RESP command sent (its words), or None once the client closed."""
    while True:
        parsed = _parse(buffer)
        if parsed is not None:
            return parsed
        data = await stream.receive_some()
        if not data:
            return None
        buffer += data


def _parse(buffer: bytearray) -> list[str] | None:
    if not buffer.startswith(b"*") or b"\r\n" not in buffer:
        return None
    head, rest = bytes(buffer).split(b"\r\n", 1)
    words = []
    for _ in range(int(head[1:])):
        if b"\r\n" not in rest:
            return None
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line[1:])
        if len(rest) < size + 2:
            return None
        words.append(rest[:size].decode())
        rest = rest[size + 2 :]
    del buffer[: len(buffer) - len(rest)]
    return words


#: The fake Redis' XRANGE + HGETALL replies for ``trimmed`` and the step it then fails.
SWEEP_STEPS = [
    # an empty stream, one indexed entry: found at once, XPENDING dropped
    ("XPENDING", b"*0\r\n", b"%1\r\n$3\r\n1-0\r\n$2\r\nj1\r\n"),
    # its first entry 1-0, 2-0 indexed too: the look for deleted entries dropped
    (
        "XINFO+XRANGE",
        b"*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
        b"%2\r\n$3\r\n1-0\r\n$2\r\nj1\r\n$3\r\n2-0\r\n$2\r\nj2\r\n",
    ),
]


@pytest.mark.parametrize(
    ("step", "xrange", "hgetall"), SWEEP_STEPS, ids=[s for s, *_ in SWEEP_STEPS]
)
async def test_the_trimmed_sweep_names_its_later_steps(
    step: str, xrange: bytes, hgetall: bytes
) -> None:
    """``trimmed``'s later steps (the look for entries deleted from the middle of the
    stream, XPENDING of the entries it found) fail on their own: the fake Redis answers
    the XRANGE + HGETALL and drops the connection at the next command."""

    async def answers_until_the_step(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while (words := await _commands(stream, buffer)) is not None:
            name = words[0].upper()
            if name == "HELLO":
                await stream.send_all(HELLO_REPLY)
            elif name == "XRANGE":
                await stream.send_all(xrange)
            elif name == "HGETALL":
                await stream.send_all(hgetall)
            else:
                await stream.aclose()
                return

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, answers_until_the_step, 0)
        port = listeners[0].socket.getsockname()[1]
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0", connect_timeout_s=1.0)
        await _names_itself(s, step, lambda s: s.trimmed("u1"))
        nursery.cancel_scope.cancel()


async def _hangs_after_hello(stream: trio.SocketStream) -> None:
    buffer = bytearray()
    while (words := await _commands(stream, buffer)) is not None:
        if words[0].upper() == "HELLO":
            await stream.send_all(HELLO_REPLY)  # then never another answer


@pytest.mark.parametrize(("operation", "call"), OPERATIONS, ids=[o for o, _ in OPERATIONS])
async def test_a_redis_that_stops_answering_fails_the_operation_after_the_command_timeout(
    operation: str, call: Call
) -> None:
    """No answer: unavailable once the command timeout (plus a blocking read's own
    block time, here at most 10 ms) has passed, never later."""
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, _hangs_after_hello, 0)
        port = listeners[0].socket.getsockname()[1]
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0", command_timeout_s=0.2)
        start = trio.current_time()
        with trio.fail_after(3):
            with pytest.raises(SubstrateUnavailable):
                await call(s)
        took = trio.current_time() - start
        assert 0.2 <= took < 0.2 + 0.01 + 1.5, took  # (slack for a loaded machine; a full
        # suite run once measured over 0.81 s. The bound still tells the 0.2 s command
        # timeout from the 3 s guard and from waiting for ever.)
        nursery.cancel_scope.cancel()


FOREVER: list[tuple[str, Call]] = [
    ("BLMPOP notify", lambda s: s.read_notifications("box", count=1, block_ms=0)),
    ("BLPOP result", lambda s: s.wait_result("u1", "j1", timeout_s=0)),
    ("XREAD progress", lambda s: s.read_progress("j1", "0", block_ms=0)),
    ("XREADGROUP >", lambda s: s.read_new("u1", "c1", count=1, block_ms=0)),
]


@pytest.mark.parametrize(("operation", "call"), FOREVER, ids=[o for o, _ in FOREVER])
async def test_a_read_told_to_block_for_ever_outwaits_the_command_timeout(
    operation: str, call: Call
) -> None:
    """Block time 0 is "until something comes" on the server, so the client sets no
    timeout either: still waiting at three command timeouts."""
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, _hangs_after_hello, 0)
        port = listeners[0].socket.getsockname()[1]
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0", command_timeout_s=0.1)
        with trio.move_on_after(0.3) as waited:
            await call(s)
        assert waited.cancelled_caught, "returned although nothing answered"
        nursery.cancel_scope.cancel()


async def test_the_cluster_layout_s_second_finishing_write_fails_after_the_command_timeout() -> (
    None
):
    """Under Cluster the progress and mailbox writes follow the script in a second round
    trip: a Redis that answers the script and then nothing fails the finish as
    unavailable after the command timeout, as the script's own round trip would."""

    async def answers_the_script_only(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while (words := await _commands(stream, buffer)) is not None:
            name = words[0].upper()
            if name == "HELLO":
                await stream.send_all(HELLO_REPLY)
            elif name == "EVAL":
                await stream.send_all(b"*2\r\n$4\r\ndone\r\n:1\r\n")

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, answers_the_script_only, 0)
        port = listeners[0].socket.getsockname()[1]
        s = RedisSubstrate.from_url(f"redis://127.0.0.1:{port}/0", command_timeout_s=0.2)
        s._cluster = True  # the Cluster's command layout, on this one fake node
        start = trio.current_time()
        with trio.fail_after(3):
            with pytest.raises(SubstrateUnavailable, match=r"unavailable \(finish\)"):
                await s.finish("u1", "j1", "r", STATE, ttl_s=60, entry_id="1-0", notify="box")
        assert trio.current_time() - start >= 0.2
        nursery.cancel_scope.cancel()
