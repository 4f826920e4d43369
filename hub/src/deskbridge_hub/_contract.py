"""The substrate contract suite, shipped (as trio ships ``check_one_way_stream``):
``check_substrate(make_harness)`` runs every check against a substrate you provide.

A check is a plain async function of a :class:`SubstrateHarness`: the substrate under
test plus the few things only a test may do to its backing store (delete a stream, see
that a read is blocked server-side). Checks use real time with tiny durations and bound
every wait with ``fail_after``; run them without an autojump clock.

The checks are grouped by the substrate's parts (``_substrate``): presence and results
and the ledger here, the streams in ``_contract_streams``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import trio

from ._errors import SubstrateUnavailable
from ._jobstate import JobState, Stage
from ._substrate import Entry, Substrate, jobs_key, presence_key, result_key

#: The MAXLEN the checks enqueue with when trimming is not what they test.
GROUP_MAXLEN = 1000


@attrs.define(eq=False)
class SubstrateHarness:
    """A substrate under test and what only a test may do to its backing store.

    Attributes:
        substrate: the substrate under test.
        delete_stream: drop a user's stream with its group (eviction, or a store
            restarted without persistence).
        wait_blocked: return once a blocking call of ours (``"xreadgroup"``,
            ``"blpop"``) is waiting in the store.
        is_blocked: whether such a call is waiting right now, or None if the store
            cannot tell (then the "no waiter left behind" half of a check is skipped).
        make_unavailable: a substrate of the same kind whose store cannot be reached.
        unavailable_mentions: text every unavailable error must contain (the address).
        unavailable_secret: text it must never contain (the password).
        raw: run one command on the backing store (Redis), or None: the checks that
            read the store's own view (TTLs, consumer names) then skip that part.
        on_user, on_job, on_mailbox: called with each user / job id / notification
            mailbox a check creates (cleanup).
        spoil_key: make a key hold a string (so a list write to it fails, as Redis'
            WRONGTYPE); None: ``raw("SET", key, ...)``.
        keys_of: the names of every key the store holds in a user's hash tag (Redis:
            ``SCAN MATCH bridge:*{<user>}*``), or None: the checks that a refused request
            leaves nothing behind then skip that part.
    """

    substrate: Substrate
    delete_stream: Callable[[str], Awaitable[None]]
    wait_blocked: Callable[[str], Awaitable[None]]
    make_unavailable: Callable[[], Substrate]
    is_blocked: Callable[[str], Awaitable[bool]] | None = None
    unavailable_mentions: str | None = None
    unavailable_secret: str | None = None
    raw: Callable[..., Awaitable[Any]] | None = None
    on_user: Callable[[str], None] = lambda user_id: None
    on_job: Callable[[str], None] = lambda job_id: None
    on_mailbox: Callable[[str], None] = lambda mailbox: None
    spoil_key: Callable[[str], None] | None = None
    keys_of: Callable[[str], Awaitable[list[str]]] | None = None
    xdel: Callable[[str, str], Awaitable[None]] | None = None

    def user(self) -> str:
        user_id = f"test-{secrets.token_hex(6)}"
        self.on_user(user_id)
        return user_id

    def job(self) -> str:
        job_id = f"job-{secrets.token_hex(6)}"
        self.on_job(job_id)
        return job_id

    async def spoil(self, key: str) -> None:
        """Make ``key`` hold a string (see ``spoil_key``).

        Raises:
            RuntimeError: the harness can do neither.
        """
        if self.spoil_key is not None:
            self.spoil_key(key)
        elif self.raw is not None:
            await self.raw("SET", key, "spoiled")
        else:
            raise RuntimeError("this harness cannot spoil a key (give spoil_key or raw)")

    async def delete_entry(self, user_id: str, entry_id: str) -> None:
        """Delete one entry of the user's stream, as an operator's XDEL (see ``xdel``).

        Raises:
            RuntimeError: the harness can do neither.
        """
        if self.xdel is not None:
            await self.xdel(user_id, entry_id)
        elif self.raw is not None:
            assert await self.raw("XDEL", jobs_key(user_id), entry_id) == 1
        else:
            raise RuntimeError("this harness cannot delete an entry (give xdel or raw)")

    async def fill(self, user_id: str, n: int, *, maxlen: int) -> None:
        for i in range(n):
            await self.substrate.enqueue(user_id, {"filler": str(i)}, maxlen=maxlen)


Check = Callable[[SubstrateHarness], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    """Register a contract check under its name (without ``check_``)."""
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


async def check_substrate(
    make_harness: Callable[[], AbstractAsyncContextManager[SubstrateHarness]],
    *,
    only: Iterable[str] | None = None,
) -> None:
    """Run the substrate contract suite.

    Args:
        make_harness: an async context manager factory; each check gets a fresh harness.
        only: names of the checks to run (keys of :data:`CHECKS`); default all.

    Raises:
        AssertionError: the substrate broke the contract (the message says where).
        KeyError: an unknown check name.
    """
    from . import (  # noqa: F401
        _contract_caller,
        _contract_cancel,
        _contract_desktop,
        _contract_finish,
        _contract_jobs,
        _contract_keep,
        _contract_mcp,
        _contract_revoke,
        _contract_room,
        _contract_streams,  # noqa: F401 - register their checks
    )

    names = list(CHECKS) if only is None else list(only)
    for name in names:
        async with make_harness() as harness:
            await CHECKS[name](harness)


# -- presence ------------------------------------------------------------------------------


@check
async def check_presence_set_get_and_clear_only_by_holder(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.get_presence(user) is None
    await s.set_presence(user, "session-a", 30)
    assert await s.get_presence(user) == "session-a"
    await s.set_presence(user, "session-b", 30)  # a newer socket takes over
    assert await s.clear_presence(user, "session-a") is False
    assert await s.get_presence(user) == "session-b"
    assert await s.clear_presence(user, "session-b") is True
    assert await s.get_presence(user) is None
    assert await s.clear_presence(user, "session-b") is False


@check
async def check_presence_expires_after_ttl(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    await s.set_presence(user, "session-a", 0.2)
    assert await s.get_presence(user) == "session-a"
    if h.raw is not None:
        ttl_ms = await h.raw("PTTL", presence_key(user))
        assert 0 < ttl_ms <= 200
    await trio.sleep(0.25)  # the behaviour under test is the passage of time
    assert await s.get_presence(user) is None
    assert await s.clear_presence(user, "session-a") is False


@check
async def check_refresh_presence_never_steals_it_from_another_session(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.refresh_presence(user, "s1", 30) is True  # absent: taken
    assert await s.get_presence(user) == "s1"
    assert await s.refresh_presence(user, "s1", 30) is True  # ours: refreshed
    await s.set_presence(user, "s2", 30)  # a newer session took over
    assert await s.refresh_presence(user, "s1", 30) is False
    assert await s.get_presence(user) == "s2"


@check
async def check_process_liveness_expires_and_clears(h: SubstrateHarness) -> None:
    s, holder = h.substrate, f"proc-{h.user()}"
    h.on_user(holder)
    assert await s.holder_alive(holder) is False
    assert await s.set_liveness(holder, 0.2) is False  # it was not set
    assert await s.holder_alive(holder) is True
    assert await s.set_liveness(holder, 0.2) is True  # still set: nothing was lost
    await trio.sleep(0.25)
    assert await s.holder_alive(holder) is False
    assert await s.set_liveness(holder, 30) is False  # it had lapsed
    await s.clear_liveness(holder)
    assert await s.holder_alive(holder) is False


# -- results -------------------------------------------------------------------------------


@check
async def check_cancelled_wait_result_takes_nothing(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                await s.wait_result(user, job, timeout_s=30)
                raise AssertionError("the wait was not cancelled")

            nursery.start_soon(waiter)
            await h.wait_blocked("blpop")
            nursery.cancel_scope.cancel()
        if h.is_blocked is not None:
            assert not await h.is_blocked("blpop")
        await s.publish_result(user, job, "payload", ttl_s=30)
        assert await s.wait_result(user, job, timeout_s=1) == "payload"


@check
async def check_publish_then_wait_result_round_trip(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    await s.publish_result(user, job, '{"ok": true}', ttl_s=300)
    if h.raw is not None:
        ttl_ms = await h.raw("PTTL", result_key(user, job))
        assert 299_000 < ttl_ms <= 300_000
    await s.publish_result(user, job, "second", ttl_s=300)
    with trio.fail_after(3):
        assert await s.wait_result(user, job, timeout_s=1) == '{"ok": true}'
        assert await s.wait_result(user, job, timeout_s=1) == "second"
    if h.raw is not None:
        assert await h.raw("EXISTS", result_key(user, job)) == 0


@check
async def check_wait_result_wakes_when_published(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    got: list[str | None] = []

    async def waiter() -> None:
        got.append(await s.wait_result(user, job, timeout_s=10))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await h.wait_blocked("blpop")
            await s.publish_result(user, job, "done", ttl_s=30)
    assert got == ["done"]


@check
async def check_wait_result_times_out_with_none(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    with trio.fail_after(3):
        start = trio.current_time()
        assert await s.wait_result(user, job, timeout_s=0.15) is None
        assert trio.current_time() - start >= 0.14


@check
async def check_result_expires_after_ttl(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    await s.publish_result(user, job, "late", ttl_s=0.1)
    await trio.sleep(0.15)
    assert await s.wait_result(user, job, timeout_s=0.01) is None


# -- health --------------------------------------------------------------------------------


async def assert_each_unavailable(calls: Iterable[Callable[[], Awaitable[Any]]]) -> None:
    """Each of ``calls`` (on a substrate whose store cannot be reached) raises
    ``SubstrateUnavailable`` within 3 s.

    Raises:
        AssertionError: one returned instead.
    """
    for call in calls:
        with trio.fail_after(3):
            try:
                await call()
            except SubstrateUnavailable:
                continue
            raise AssertionError("an unreachable store did not raise SubstrateUnavailable")


@check
async def check_ping(h: SubstrateHarness) -> None:
    await h.substrate.ping()


@check
async def check_unavailable_is_reported_quickly_without_the_password(h: SubstrateHarness) -> None:
    down = h.make_unavailable()
    user, job = h.user(), h.job()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: down.get_presence(user),
        lambda: down.enqueue(user, {"a": "1"}, maxlen=10),
        lambda: down.wait_result(user, job, timeout_s=5),
        lambda: down.read_new(user, "c1", count=1, block_ms=5000),
        lambda: down.ping(),
    ]
    for call in calls:
        with trio.fail_after(3):
            try:
                await call()
            except SubstrateUnavailable as exc:
                message = str(exc)
            else:
                raise AssertionError("an unreachable store did not raise SubstrateUnavailable")
        if h.unavailable_secret is not None:
            assert h.unavailable_secret not in message
        if h.unavailable_mentions is not None:
            assert h.unavailable_mentions in message


# -- the ledger: the entry index, job state, cancel flag, catalogue ------------------------


@check
async def check_index_maps_entries_to_jobs_until_acked(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    entry_id = await s.enqueue(user, {"job_id": job, "name": "x"}, maxlen=100)
    other = await s.enqueue(user, {"filler": "1"}, maxlen=100)  # no job id
    assert await s.job_ids(user, [entry_id, other, "1-1"]) == {entry_id: job}
    await s.read_new(user, "c1", count=10, block_ms=1)
    assert await s.ack(user, entry_id) == 1
    assert await s.job_ids(user, [entry_id]) == {}
    assert await s.trimmed(user) == []


@check
async def check_trimmed_lists_indexed_entries_older_than_the_stream(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    jobs = [h.job() for _ in range(3)]
    ids = [await s.enqueue(user, {"job_id": j}, maxlen=1000) for j in jobs]
    assert await s.trimmed(user) == []
    # MAXLEN ~ trims whole macro nodes in Redis: push enough to trim the first three away
    await h.fill(user, 300, maxlen=50)
    lost = await s.trimmed(user)
    assert lost == list(zip(ids, jobs, strict=True))
    assert await s.forget(user, ids[0]) is True
    assert await s.forget(user, ids[0]) is False  # only one caller owns it
    assert [e for e, _ in await s.trimmed(user)] == ids[1:]


@check
async def check_trimmed_skips_entries_a_consumer_has_read(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    read_job, unread_job = h.job(), h.job()
    read_id = await s.enqueue(user, {"job_id": read_job}, maxlen=1000)
    (entry,) = await s.read_new(user, "c1", count=1, block_ms=None)
    assert entry.entry_id == read_id
    unread_id = await s.enqueue(user, {"job_id": unread_job}, maxlen=1000)
    await h.fill(user, 300, maxlen=50)  # both bodies trimmed; the read one is pending
    assert await s.trimmed(user) == [(unread_id, unread_job)]


@check
async def check_trimmed_lists_everything_when_the_stream_is_gone(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    entry_id = await s.enqueue(user, {"job_id": job}, maxlen=100)
    await h.delete_stream(user)
    assert await s.trimmed(user) == [(entry_id, job)]


@check
async def check_job_state_and_cancel_flag(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    queued = JobState(Stage.QUEUED, "u1", at=1.5)
    delivered = queued.advance(Stage.DELIVERED, at=2.5, session_id="s1")
    assert await s.get_job_state(user, job) is None
    await s.set_job_state(user, job, queued, ttl_s=60)
    assert await s.get_job_state(user, job) == queued
    assert (await s.mark_delivered(user, job, delivered, ttl_s=60)).verdict == "delivered"
    assert await s.get_job_state(user, job) == delivered
    await s.set_job_state(user, job, queued, ttl_s=60)
    await s.request_cancel(user, job, ttl_s=60)
    assert (await s.mark_delivered(user, job, delivered, ttl_s=60)).verdict == "cancelled"
    assert await s.get_job_state(user, job) == queued  # not forwarded: untouched


@check
async def check_deadline_is_set_and_judged_on_the_substrate_clock(h: SubstrateHarness) -> None:
    """enqueue(start_within_s) stamps deadline/enqueued_at from the substrate's clock
    (Redis TIME); mark_delivered compares the deadline with that same clock."""
    s, user, job, other = h.substrate, h.user(), h.job(), h.job()
    delivered = JobState(Stage.DELIVERED, user, at=1.0, session_id="s1")
    queued = JobState(Stage.QUEUED, user, at=1.0)
    await s.enqueue(user, {"job_id": job}, maxlen=100, start_within_s=30.0)
    (entry,) = await s.read_new(user, "c1", count=1, block_ms=1)
    assert entry.fields is not None
    deadline, enqueued_at = float(entry.fields["deadline"]), float(entry.fields["enqueued_at"])
    assert abs(deadline - enqueued_at - 30.0) < 0.002
    marked = await s.mark_delivered(user, job, delivered, ttl_s=60, deadline=deadline)
    assert marked.verdict == "delivered"
    assert enqueued_at - 0.002 <= marked.server_time < enqueued_at + 5.0
    assert await s.get_job_state(user, job) == delivered
    # a deadline already passed on the substrate's clock: expired, state untouched
    await s.set_job_state(user, other, queued, ttl_s=60)
    marked = await s.mark_delivered(user, other, delivered, ttl_s=60, deadline=enqueued_at - 1.0)
    assert marked.verdict == "expired"
    assert await s.get_job_state(user, other) == queued
    # start_within_s=0: expired as soon as it is read
    await s.enqueue(user, {"job_id": other}, maxlen=100, start_within_s=0.0)
    (late,) = await s.read_new(user, "c1", count=1, block_ms=1)
    assert late.fields is not None
    marked = await s.mark_delivered(
        user, other, delivered, ttl_s=60, deadline=float(late.fields["deadline"])
    )
    assert marked.verdict == "expired"


@check
async def check_claim_job_only_once(h: SubstrateHarness) -> None:
    s, user, job = h.substrate, h.user(), h.job()
    queued = JobState(Stage.QUEUED, "u1", at=1.0)
    assert await s.claim_job(user, job, queued, ttl_s=60) is True
    assert await s.claim_job(user, job, JobState(Stage.QUEUED, "u2"), ttl_s=60) is False
    assert await s.get_job_state(user, job) == queued


@check
async def check_catalogue_round_trips(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.get_catalogue(user) is None
    await s.set_catalogue(user, '[{"name": "echo"}]')
    assert await s.get_catalogue(user) == '[{"name": "echo"}]'


@check
async def check_prune_consumers_drops_idle_empty_consumers_only(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    for _ in range(3):
        await s.enqueue(user, {"job_id": h.job()}, maxlen=100)
    (first,) = await s.read_new(user, "dead-acked", count=1, block_ms=1)
    await s.ack(user, first.entry_id)
    await s.read_new(user, "dead-pending", count=1, block_ms=1)
    await s.read_new(user, "me", count=1, block_ms=1)
    # "dead-pending" still owns an entry (reclaim takes it later); "me" is kept
    assert await s.prune_consumers(user, idle_ms=0, keep="me") == 1  # dead-acked
    assert await s.prune_consumers(user, idle_ms=0, keep="me") == 0
    assert await s.prune_consumers(user, idle_ms=3_600_000, keep="x") == 0
    if h.raw is not None:
        names = {c[1] for c in await h.raw("XINFO", "CONSUMERS", jobs_key(user), "bridge-workers")}
        assert names == {"dead-pending", "me"}


async def read_all(h: SubstrateHarness, user: str, consumer: str) -> list[Entry]:
    """Read until a read comes back empty twice (a NOGROUP heal returns [] once first)."""
    out: list[Entry] = []
    empty = 0
    with trio.fail_after(5):
        while empty < 2:
            got = await h.substrate.read_new(user, consumer, count=10, block_ms=100)
            out += got
            empty = 0 if got else empty + 1
    return out


__all__ = ["CHECKS", "SubstrateHarness", "check_substrate"]
