"""The caller's path on Redis beyond the shared contract: the consumer group is made by
the script when it enqueues (asked once per session and user, and again for a stream
gone), a stream key of another type fails the submit with Redis' own error, an absent
presence proves nothing while Redis cannot serve the hub, the caller's instant on
Redis' clock (``RedisClock``: a script that runs after it writes nothing, a job's window
counts from it), and the mailbox read's server and client block times. Real Redis
(``DESKBRIDGE_TEST_REDIS_URL``), unique ids, every wait bounded, keys deleted afterwards."""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from coredis.exceptions import ResponseError
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._contract_caller import _submission
from deskbridge_hub._jobstate import JobState, Stage
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_caller import CLOCK_DRIFT, MAX_WIDENING_S, RedisClock
from deskbridge_hub._redis_slots import key_slot
from deskbridge_hub._substrate import (
    GROUP,
    idem_key,
    index_key,
    jobs_key,
    mailbox_key,
    state_key,
    tools_digest_key,
    tools_key,
)

from ..conftest import REDIS_URL, RawRedis
from .redis_kit import delete_tagged


@pytest.fixture
async def substrate() -> AsyncIterator[RedisSubstrate]:
    async with RedisSubstrate.from_url(REDIS_URL) as s:
        yield s


@pytest.fixture
async def user(raw_redis: RawRedis) -> AsyncIterator[str]:
    user_id = f"test-{secrets.token_hex(6)}"
    yield user_id
    await delete_tagged(raw_redis, user_id)


async def test_submit_makes_sure_of_the_group_once_per_session_and_user(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script is asked to make the group (ARGV 15) until a submit of this session
    enqueued for the user; a refused one does not count (it made nothing)."""
    flags: list[str] = []
    script = substrate._script

    async def recording(*args: Any, **kwargs: Any) -> list[Any]:
        flags.append(args[3][14])
        return await script(*args, **kwargs)

    monkeypatch.setattr(substrate, "_script", recording)
    with trio.fail_after(5):
        offline = await substrate.submit(user, _submission(user, f"job-{secrets.token_hex(6)}"))
        assert offline.verdict == "offline"
        await substrate.set_presence(user, "s1", 30)
        for _ in range(3):
            job = f"job-{secrets.token_hex(6)}"
            assert (await substrate.submit(user, _submission(user, job))).verdict == "queued"
    assert flags == ["1", "1", "", ""]
    groups = await raw_redis("XINFO", "GROUPS", jobs_key(user))
    assert [g[1] for g in groups] == [GROUP]


async def test_a_stream_deleted_under_the_session_gets_its_group_again(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """The session believes in the group, but the stream is gone (evicted, Redis
    restarted empty): the script makes stream and group again before the XADD, so the
    entry is read as new at once, without a NOGROUP round of its own."""
    await substrate.set_presence(user, "s1", 30)
    with trio.fail_after(5):
        assert (await substrate.submit(user, _submission(user, "job-a"))).verdict == "queued"
        assert await raw_redis("DEL", jobs_key(user)) == 1
        assert (await substrate.submit(user, _submission(user, "job-b"))).verdict == "queued"
        groups = await raw_redis("XINFO", "GROUPS", jobs_key(user))
        assert [g[1] for g in groups] == [GROUP]
        (entry,) = await substrate.read_new(user, "c1", count=5, block_ms=None)
    assert entry.fields is not None and entry.fields["job_id"] == "job-b"


async def test_a_stream_key_of_another_type_fails_the_submit_with_redis_error(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """The XGROUP CREATE's own error, raised before the script wrote anything; while
    the user is offline the stream is not looked at (nothing would be written)."""
    await raw_redis("SET", jobs_key(user), "not a stream")
    job = f"job-{secrets.token_hex(6)}"
    with trio.fail_after(5):
        assert (await substrate.submit(user, _submission(user, job))).verdict == "offline"
        await substrate.set_presence(user, "s1", 30)
        with pytest.raises(ResponseError, match="wrong kind of value"):
            await substrate.submit(user, _submission(user, job))
        assert await substrate.get_job_state(user, job) is None


async def test_an_absent_presence_proves_nothing_while_redis_cannot_serve_the_hub(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the health probe would find an evicting Redis (``_redis_health``): "offline"
    would be a guess, so the submit is unavailable, naming the read; a queued submit
    found its presence, so it stands."""
    asked: list[str] = []

    def unusable(what: str) -> SubstrateUnavailable:
        asked.append(what)
        return SubstrateUnavailable(f"Redis cannot serve {what}: evicting")

    monkeypatch.setattr(substrate._connections, "unusable", unusable)
    with trio.fail_after(5):
        with pytest.raises(SubstrateUnavailable, match="cannot serve a presence read"):
            await substrate.submit(user, _submission(user, f"job-{secrets.token_hex(6)}"))
        await substrate.set_presence(user, "s1", 30)
        queued = await substrate.submit(user, _submission(user, f"job-{secrets.token_hex(6)}"))
    assert queued.verdict == "queued"
    assert asked == ["a presence read"]


@pytest.mark.parametrize(
    ("block_ms", "seconds", "block_s"), [(1000, "1.000", 1.0), (0, "0.000", None)]
)
async def test_a_mailbox_read_blocks_the_server_block_ms_and_the_client_as_long_plus_the_timeout(
    substrate: RedisSubstrate,
    raw_redis: RawRedis,
    monkeypatch: pytest.MonkeyPatch,
    block_ms: int,
    seconds: str,
    block_s: float | None,
) -> None:
    """BLMPOP's timeout is ``block_ms`` in seconds; the client waits that long (0: for
    ever, as the server) before the command timeout starts counting."""
    box = f"box-{secrets.token_hex(4)}"
    calls: list[tuple[tuple[Any, ...], float | None]] = []
    call = substrate._call

    async def recording(session: Any, *command: Any, block_s: float | None = 0.0) -> Any:
        calls.append((command, block_s))
        return await call(session, *command, block_s=block_s)

    monkeypatch.setattr(substrate, "_call", recording)
    await raw_redis("RPUSH", mailbox_key(box), "j1 done")
    try:
        with trio.fail_after(5):
            assert await substrate.read_notifications(box, count=5, block_ms=block_ms) == [
                ("j1", "done")
            ]
    finally:
        await raw_redis("DEL", mailbox_key(box))
    ((command, waited),) = calls
    assert command == (b"BLMPOP", seconds, 1, mailbox_key(box), b"LEFT", b"COUNT", 5)
    assert waited == block_s


async def test_on_a_single_redis_the_wake_up_is_pushed_only_for_a_queued_job(
    substrate: RedisSubstrate, user: str
) -> None:
    """The wake-up is the script's own last write there: a submit answered "holder" (or
    anything but "queued") wakes nobody. (Under Cluster it follows the script in the same
    write whatever the answer: a spurious wake-up only makes the holder read an empty
    stream.)"""
    holder = f"h{secrets.token_hex(4)}"
    await substrate.set_presence(user, "elsewhere.s1", 30)
    sub = attrs.evolve(
        _submission(user, f"job-{secrets.token_hex(6)}"), alive_holder=holder, wake_ttl_s=30.0
    )
    with trio.fail_after(5):
        assert (await substrate.submit(user, sub)).verdict == "holder"
        assert await substrate.wait_wakes(holder, timeout_s=0.05, count=10) == []


@pytest.mark.parametrize("step", ["submit", "finish"])
async def test_under_cluster_every_key_a_script_declares_is_in_the_user_s_slot(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The wake-up list, the progress stream and the mailbox are in other slots: in the
    Cluster's command layout the scripts leave them out (a Cluster would refuse the
    script with CROSSSLOT), and the writes to them follow the script."""
    scripts: list[tuple[Any, ...]] = []
    script = substrate._script

    async def recording(s: Any, sc: Any, keys: Any, args: Any, **kwargs: Any) -> list[Any]:
        scripts.append(tuple(keys))
        return await script(s, sc, keys, args, **kwargs)

    monkeypatch.setattr(substrate, "_script", recording)
    substrate._cluster = True
    job = f"job-{secrets.token_hex(6)}"
    await substrate.set_presence(user, "h1.s1", 30)
    with trio.fail_after(5):
        if step == "submit":
            sub = attrs.evolve(_submission(user, job), alive_holder="h1", wake_ttl_s=30.0)
            assert (await substrate.submit(user, sub)).verdict == "queued"
        else:
            state = JobState(Stage.FINISHED, user, at=1.0)
            await substrate.finish(user, job, "done", state, ttl_s=30, notify="box")
            await substrate.read_notifications("box", count=10, block_ms=1)
    ((*keys,),) = scripts
    assert {key_slot(k) for k in keys if k} == {key_slot(jobs_key(user))}, keys


async def test_under_cluster_a_registered_holder_gets_the_user_id_not_a_pushed_entry(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """Push delivery reads the holder's liveness key and pushes onto its wake list from
    the script: under Cluster both are in other slots, so the holder is woken with the
    user id (in the same write) and reads the entry itself."""
    holder = f"h{secrets.token_hex(4)}"
    substrate._cluster = True
    try:
        await substrate.set_liveness(holder, 30, consumer="c1")
        await substrate.set_presence(user, f"{holder}.s1", 30)
        job = f"job-{secrets.token_hex(6)}"
        sub = attrs.evolve(
            _submission(user, job), alive_holder=holder, wake_ttl_s=30.0, delivered_ttl_s=60.0
        )
        with trio.fail_after(5):
            got = await substrate.submit(user, sub)
            assert (got.verdict, got.pushed) == ("queued", False)
            assert await substrate.wait_wakes(holder, timeout_s=1.0, count=10) == [user]
            assert await substrate.read_pending(user, "c1", count=10) == []
    finally:
        await raw_redis("DEL", f"bridge:proc:{{{holder}}}", f"bridge:wake:{{{holder}}}")


async def test_a_script_sent_alone_goes_as_evalsha_and_as_eval_after_noscript(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit script alone in its write goes as EVALSHA; Redis without it cached (a
    restart, SCRIPT FLUSH) answers NOSCRIPT, nothing ran, and it goes again as EVAL."""
    sent: list[bytes] = []
    alone = functools.partial(attrs.evolve, write_owner=False)  # nothing after it
    await substrate.set_presence(user, "s1", 30)
    with trio.fail_after(5):
        first = f"job-{secrets.token_hex(6)}"
        assert (await substrate.submit(user, alone(_submission(user, first)))).verdict == "queued"

        async with substrate._session("probe") as session:
            execute = session.execute

            async def recording(*commands: Any, **kw: Any) -> list[Any]:
                sent.extend(c[0] for c in commands)
                return await execute(*commands, **kw)

            monkeypatch.setattr(
                type(session), "execute", lambda self, *c, **kw: recording(*c, **kw)
            )
            await raw_redis("SCRIPT", "FLUSH")
            job = f"job-{secrets.token_hex(6)}"
            assert (await substrate.submit(user, alone(_submission(user, job)))).verdict == "queued"
            again = f"job-{secrets.token_hex(6)}"
            sub = alone(_submission(user, again))
            assert (await substrate.submit(user, sub)).verdict == "queued"
    assert sent == [b"EVALSHA", b"EVAL", b"EVALSHA"], sent
    assert (await substrate.queue_info(user)).length == 3  # each enqueued once


async def test_a_submit_that_runs_after_the_callers_instant_writes_nothing(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """The script compares ``TIME`` with the caller's give-up instant (its call instant
    on Redis' clock, from ``RedisClock``, plus ``give_up_s``): here the clock reading is
    made 10 s early, as if the script ran 10 s after the call (a stall)."""
    await substrate.set_presence(user, "s1", 30)
    sub = attrs.evolve(_submission(user, "job-late"), give_up_s=1.0)
    with trio.fail_after(5):
        assert (await substrate.submit(user, _submission(user, "job-a"))).verdict == "queued"
        clock = substrate._redis_clock
        assert clock.offset_s is not None  # learnt from the reply
        clock.offset_s -= 10.0
        assert (await substrate.submit(user, sub)).verdict == "late"
    assert await raw_redis("XLEN", jobs_key(user)) == 1
    assert await raw_redis("EXISTS", state_key(user, "job-late")) == 0
    assert await raw_redis("EXISTS", idem_key(user, "job-late")) == 0


async def test_a_late_submit_within_the_callers_time_counts_the_window_from_the_call(
    substrate: RedisSubstrate, user: str
) -> None:
    """The script ran 2 s after the call (as the reading says): the job's deadline is
    the call instant plus ``start_within_s``, not ``TIME`` plus it."""
    await substrate.set_presence(user, "s1", 30)
    with trio.fail_after(5):
        assert (await substrate.submit(user, _submission(user, "job-a"))).verdict == "queued"
        substrate._redis_clock.offset_s -= 2.0  # type: ignore[operator]
        sub = attrs.evolve(_submission(user, "job-b"), give_up_s=30.0)
        assert (await substrate.submit(user, sub)).verdict == "queued"
        entries = await substrate.read_new(user, "c1", count=5, block_ms=None)
    fields = entries[-1].fields
    assert fields is not None and fields["job_id"] == "job-b"
    window = float(fields["deadline"]) - float(fields["enqueued_at"])
    assert 30.0 - 2.0 - 0.1 < window <= 30.0 - 2.0 + 0.002


async def test_the_first_submit_reads_redis_clock_before_the_script(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a reading, one TIME round trip first (a stall there sends no script);
    then every reply's TIME keeps it, with no round trip of its own."""
    calls: list[tuple[Any, ...]] = []
    call = substrate._call

    async def recording(session: Any, *command: Any, block_s: float | None = 0.0) -> Any:
        calls.append(command)
        return await call(session, *command, block_s=block_s)

    monkeypatch.setattr(substrate, "_call", recording)
    await substrate.set_presence(user, "s1", 30)
    calls.clear()
    with trio.fail_after(5):
        for job in ("job-a", "job-b"):
            sub = attrs.evolve(_submission(user, job), give_up_s=30.0, write_owner=False)
            assert (await substrate.submit(user, sub)).verdict == "queued"
    assert calls == [(b"TIME",)]
    with pytest.raises(ValueError, match="give_up_s"):
        await substrate.submit(user, attrs.evolve(_submission(user, "job-c"), give_up_s=0.0))


def test_the_clock_keeps_the_largest_lower_bound_and_widens_it_with_age() -> None:
    clock = RedisClock()
    assert clock.at_least(5.0) is None
    clock.learn(1000.0, received_at=10.0)  # quick round trip: Redis = local + 990
    assert clock.at_least(10.0) == 1000.0
    clock.learn(1003.0, received_at=15.0)  # a reply late by 2 s: a worse bound, not taken
    assert clock.offset_s == 990.0
    assert clock.at_least(20.0) == pytest.approx(1010.0 - CLOCK_DRIFT * 10)
    clock.learn(1020.5, received_at=30.0)  # Redis' clock stepped forward: taken at once
    assert clock.at_least(30.0) == 1020.5


def test_a_bound_that_aged_is_read_again_and_the_fresh_reading_wins() -> None:
    """Found by review: the bound widened by 100 us a second from its last reading, and
    only submits refreshed it, so after an idle day a call with a timeout_s under 8.6 s
    was answered ``late`` at once by a healthy Redis. A bound older than 100 s is stale
    (the submit reads TIME first), and that fresh reading replaces it even when lower (a
    Redis clock stepped back is followed, not kept for hours)."""
    clock = RedisClock()
    assert clock.stale(0.0)
    clock.learn(1000.0, received_at=10.0)
    assert not clock.stale(10.0 + MAX_WIDENING_S / CLOCK_DRIFT - 1)
    assert clock.stale(10.0 + MAX_WIDENING_S / CLOCK_DRIFT + 1)
    assert clock.stale(10.0 + 86_400)
    clock.learn(1000.0 + 86_400 - 2.0, received_at=10.0 + 86_400, fresh=True)  # stepped back
    assert clock.at_least(10.0 + 86_400) == 1000.0 + 86_400 - 2.0
    assert not clock.stale(10.0 + 86_400)


async def test_an_idle_process_reads_the_clock_again_before_its_next_submit(
    substrate: RedisSubstrate, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit after 100 s without a reading sends TIME first, and a healthy Redis
    enqueues a call with a short timeout (before the fix it was answered ``late`` at once
    after an idle day: the aged bound put the caller's instant 8.6 s in Redis' past)."""
    import deskbridge_hub._redis_caller as caller_module

    real, idle_s = caller_module.time.monotonic, [0.0]
    monkeypatch.setattr(caller_module.time, "monotonic", lambda: real() + idle_s[0])
    calls: list[bytes] = []
    call = substrate._call

    async def recording(session: Any, *command: Any, block_s: float | None = 0.0) -> Any:
        calls.append(command[0])
        return await call(session, *command, block_s=block_s)

    monkeypatch.setattr(substrate, "_call", recording)
    await substrate.set_presence(user, "s1", 30)
    with trio.fail_after(5):
        sub = attrs.evolve(_submission(user, "job-a"), give_up_s=1.0, write_owner=False)
        assert (await substrate.submit(user, sub)).verdict == "queued"
        calls.clear()
        idle_s[0] = 86_400.0  # an idle day on this process's clock (Redis' is read again)
        sub = attrs.evolve(_submission(user, "job-b"), give_up_s=1.0, write_owner=False)
        assert (await substrate.submit(user, sub)).verdict == "queued"
    assert calls == [b"TIME"]


async def test_the_last_places_of_a_queue_go_to_exactly_as_many_racing_callers(
    user: str, raw_redis: RawRedis
) -> None:
    """The count (HLEN of the entry index) and the XADD are one script: twenty submits
    racing from two processes' substrates for a queue with room for five enqueue five,
    the rest are refused (``queue_full``) and write nothing, as the stream and the index
    show (a count read in a round trip of its own let more than five in)."""
    verdicts: list[str] = []
    async with RedisSubstrate.from_url(REDIS_URL) as one, RedisSubstrate.from_url(REDIS_URL) as two:
        await one.set_presence(user, "s1", 30)

        async def submit(substrate: RedisSubstrate) -> None:
            sub = attrs.evolve(_submission(user, f"job-{secrets.token_hex(6)}"), maxlen=5)
            verdicts.append((await substrate.submit(user, sub)).verdict)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(submit, (one, two)[i % 2])
    assert sorted(verdicts) == ["queue_full"] * 15 + ["queued"] * 5
    assert await raw_redis("XLEN", jobs_key(user)) == 5
    assert await raw_redis("HLEN", index_key(user)) == 5
    assert len(await raw_redis("KEYS", f"bridge:state:{{{user}}}:*")) == 5


async def test_the_submit_compares_the_catalogues_recorded_digest_not_a_hash_per_call(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """Hashing the catalogue in the submit script cost Redis ~3.3 us per KiB on every
    call (a 1 MiB catalogue ~3.5 ms, every user's commands waiting). The catalogue's
    writer records ``<sha1> <bytes>`` with it and the script trusts that while the stored
    catalogue has that length; a catalogue written without it (a hub from before the
    digest), of another length or with no digest at all, is hashed as before."""
    text = '[{"name": "echo", "description": "' + "x" * 2000 + '"}]'
    sha1 = hashlib.sha1(text.encode()).hexdigest()
    with trio.fail_after(5):
        await substrate.set_presence(user, "s1", 30)
        await substrate.set_catalogue(user, text)
        assert await raw_redis("GET", tools_digest_key(user)) == f"{sha1} {len(text)}"
        # an older hub rewrote the catalogue alone, same length: the digest decides (the
        # stored text is not hashed: it would not match ``sha1``)
        await raw_redis("SET", tools_key(user), text.replace("x", "y"))
        job = f"j-{secrets.token_hex(6)}"
        got = await substrate.submit(user, _submission(user, job, sha1=sha1))
        assert got.verdict == "queued"
        # another length: the digest is not trusted, the catalogue is hashed
        await raw_redis("SET", tools_key(user), text + " ")
        job = f"j-{secrets.token_hex(6)}"
        stale = await substrate.submit(user, _submission(user, job, sha1=sha1))
        assert stale.verdict == "catalogue" and stale.catalogue == text + " "
        # a digest left over from another catalogue of the same length (an older hub
        # wrote this one alone, or the digest's own write failed) never refuses the
        # catalogue that is stored: a mismatch is checked against the catalogue itself
        same = hashlib.sha1(text.replace("x", "y").encode()).hexdigest()
        await raw_redis("SET", tools_key(user), text.replace("x", "y"))
        job = f"j-{secrets.token_hex(6)}"
        assert (await substrate.submit(user, _submission(user, job, sha1=same))).verdict == "queued"
        await raw_redis("SET", tools_key(user), text + " ")
        # no digest (written before it existed): hashed, so the right SHA-1 is accepted
        await raw_redis("DEL", tools_digest_key(user))
        again = hashlib.sha1((text + " ").encode()).hexdigest()
        job = f"j-{secrets.token_hex(6)}"
        hashed = await substrate.submit(user, _submission(user, job, sha1=again))
        assert hashed.verdict == "queued"


async def test_a_heartbeat_that_writes_the_catalogue_again_records_its_digest(
    substrate: RedisSubstrate, user: str, raw_redis: RawRedis
) -> None:
    """The heartbeat rewrites a lost catalogue (with presence); its digest goes with it,
    so the submit's comparison stays right after the store lost both."""
    from deskbridge_hub._substrate import Beat

    text = '[{"name": "echo"}]'
    with trio.fail_after(5):
        (reply,) = await substrate.heartbeat(
            [Beat(user, "s1", catalogue=text)], ttl_s=30, consumer="c1", reclaim_idle_ms=1000
        )
        assert reply.taken
        assert await raw_redis("GET", tools_key(user)) == text
        sha1 = hashlib.sha1(text.encode()).hexdigest()
        assert await raw_redis("GET", tools_digest_key(user)) == f"{sha1} {len(text)}"
