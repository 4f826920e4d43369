"""A command whose connection died after Redis ran it (``_redis_session`` / ``_redis_resend``).

A reused connection found dead has its batch sent once more on a new one only when
running it twice is harmless. A proxy between the substrate and real Redis forwards one
command, lets Redis answer it and cuts the connection before the reply reaches the hub:
what a ``CLIENT KILL`` racing the command, or a proxy cutting after forwarding, does.
Before: the submit script ran twice and answered ``job_id_in_use`` for the caller's own
job (the Bridge then raised JobIdInUse for a hub-minted id while the job ran); a wake-up
BLMPOP that had popped was sent again, its item lost without the error that makes the
reader drain."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator

import pytest
import trio
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._idempotency import IndexRecord
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_caller import SUBMIT
from deskbridge_hub._substrate import (
    JobOwner,
    Submission,
    jobs_key,
    presence_key,
    proc_key,
    wake_key,
)

from tests.conftest import REDIS_URL, RawRedis

pytestmark = pytest.mark.integration


class ReplyCutter:
    """A loopback proxy to Redis; after :meth:`arm`, the next bytes a client sends are
    forwarded, Redis' reply to them is dropped and that client's connection closed."""

    def __init__(self, upstream_port: int, port: int) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.armed = False
        self.cut = 0

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self) -> None:
        self.armed = True

    async def handle(self, client: trio.SocketStream) -> None:
        doomed = False
        async with client:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
            async with upstream, trio.open_nursery() as nursery:

                async def up() -> None:
                    nonlocal doomed
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        while data := await client.receive_some(65536):
                            if self.armed:
                                self.armed, doomed = False, True
                            await upstream.send_all(data)

                async def down() -> None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        while data := await upstream.receive_some(65536):
                            if doomed:  # Redis ran it and answered: drop that, cut
                                self.cut += 1
                                nursery.cancel_scope.cancel()
                                return
                            await client.send_all(data)

                nursery.start_soon(up)
                nursery.start_soon(down)


@contextlib.asynccontextmanager
async def reply_cutter() -> AsyncIterator[ReplyCutter]:
    upstream = RawRedis(REDIS_URL)
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy = ReplyCutter(upstream.port, listener.socket.getsockname()[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, proxy.handle, [listener])
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
    await listener.aclose()  # not closed by serve_listeners: a socket for the GC to warn of


def _submission(user: str, job: str, *, own: bool) -> Submission:
    return Submission(
        job_id=job,
        fields={"job_id": job, "name": "echo"},
        start_within_s=30.0,
        state=JobState(Stage.QUEUED, user, at=1.0),
        state_ttl_s=60.0,
        maxlen=100,
        catalogue_sha1=None,
        idempotency_key=None,
        index_value=IndexRecord(job, "echo", "d1").encode(),
        index_ttl_s=60.0,
        owner=JobOwner(user),
        alive_holder="h-" + user,
        own=own,
    )


async def _online(raw: RawRedis, user: str) -> None:
    await raw("SCRIPT", "LOAD", SUBMIT.text)  # the EVALSHA runs (no NOSCRIPT to resend)
    await raw("SET", presence_key(user), f"h-{user}.s1", "PX", 60_000)
    await raw("SET", proc_key(f"h-{user}"), "1", "PX", 60_000)


async def test_a_submit_that_ran_and_lost_its_reply_answers_queued_once(raw_redis) -> None:
    user = "resend-" + secrets.token_hex(4)
    job = "j-" + secrets.token_hex(4)
    await _online(raw_redis, user)
    with trio.fail_after(10):
        async with reply_cutter() as proxy, RedisSubstrate.from_url(proxy.url()) as sub:
            assert await sub.get_presence(user) is not None  # the connection is reused now
            proxy.arm()
            got = await sub.submit(user, _submission(user, job, own=True))
    assert proxy.cut == 1
    assert got.verdict == "queued"  # was: job_id_in_use, for its own job
    assert await raw_redis("XLEN", jobs_key(user)) == 1  # enqueued once


async def test_a_submit_that_cannot_tell_its_own_job_is_not_sent_again(raw_redis) -> None:
    """Without ``own`` (the id may be another call's) a found job proves nothing: the
    step is not resent, the caller is told unavailable (may have enqueued)."""
    user = "resend-" + secrets.token_hex(4)
    job = "j-" + secrets.token_hex(4)
    await _online(raw_redis, user)
    with trio.fail_after(10):
        async with reply_cutter() as proxy, RedisSubstrate.from_url(proxy.url()) as sub:
            assert await sub.get_presence(user) is not None
            proxy.arm()
            with pytest.raises(SubstrateUnavailable) as err:
                await sub.submit(user, _submission(user, job, own=False))
    assert not err.value.unsent
    assert await raw_redis("XLEN", jobs_key(user)) == 1


async def test_a_wake_up_pop_whose_reply_was_lost_fails_instead_of_hiding_it(raw_redis) -> None:
    """The popped item is gone either way; the error is what makes the reader drain every
    attached user (``ProcessReader._wait_lost``) instead of leaving a pushed entry
    pending for the reclaim idle."""
    holder = "resend-h-" + secrets.token_hex(4)
    with trio.fail_after(10):
        async with reply_cutter() as proxy, RedisSubstrate.from_url(proxy.url()) as sub:
            assert await sub.wait_wakes(holder, timeout_s=0.01, count=10) == []  # reused now
            await raw_redis("RPUSH", wake_key(holder), "u1")
            proxy.arm()
            with pytest.raises(SubstrateUnavailable):
                await sub.wait_wakes(holder, timeout_s=0.5, count=10)
    assert proxy.cut == 1
    assert await raw_redis("LLEN", wake_key(holder)) == 0  # Redis popped it


async def test_a_read_whose_connection_died_is_still_sent_again(raw_redis) -> None:
    """A read runs twice harmlessly: still answered from the new connection."""
    user = "resend-" + secrets.token_hex(4)
    await _online(raw_redis, user)
    with trio.fail_after(10):
        async with reply_cutter() as proxy, RedisSubstrate.from_url(proxy.url()) as sub:
            assert await sub.get_presence(user) is not None
            proxy.arm()
            assert await sub.get_presence(user) == f"h-{user}.s1"
    assert proxy.cut == 1
