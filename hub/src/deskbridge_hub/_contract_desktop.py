"""Contract checks of what a desktop says about itself (``_substrate.DesktopSubstrate``):
the daemon record, the instant takeover it allows (issue 12.4), the asleep record
(issue 12.6). Registered into ``_contract.CHECKS``; run them with
``deskbridge_hub.testing.check_substrate``."""

from __future__ import annotations

import trio

from ._contract import GROUP_MAXLEN, SubstrateHarness, check
from ._substrate import Asleep, Beat, Claimed, asleep_key, daemons_key

_RECORD_TTL_S = 60.0


async def _take_over(
    h: SubstrateHarness,
    user: str,
    consumer: str,
    daemon: str | None,
    *,
    count: int = 32,
    again: bool = False,
    record_ttl_s: float = _RECORD_TTL_S,
) -> Claimed:
    """The takeover step of a session ``<consumer>.<daemon>`` (presence not touched)."""
    return await h.substrate.take_over(
        user, consumer, daemon_id=daemon, session_id=f"{consumer}.{daemon}", count=count,
        record_ttl_s=record_ttl_s, again=again,
    )  # fmt: skip


async def _start(h: SubstrateHarness, user: str, consumer: str, daemon: str | None) -> list[str]:
    """A session of ``daemon`` starts on ``consumer``: presence, then the takeover step
    (as the hub's reader does at attach). Returns the entry IDs it took over."""
    await h.substrate.set_presence(user, f"{consumer}.{daemon}", 30)
    got = await _take_over(h, user, consumer, daemon)
    assert got.next_start == "0-0"
    return [e.entry_id for e in got.entries]


async def _enqueue(h: SubstrateHarness, user: str, n: int) -> list[str]:
    return [
        await h.substrate.enqueue(user, {"job_id": h.job(), "i": str(i)}, maxlen=GROUP_MAXLEN)
        for i in range(n)
    ]


@check
async def check_take_over_claims_only_what_went_to_the_same_daemon(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 3)
    assert await _start(h, user, "pod-a", "daemon-1") == []
    await s.read_new(user, "pod-a", count=2, block_ms=None)  # delivered to daemon-1
    assert await _start(h, user, "pod-b", "daemon-2") == []  # another daemon: nothing
    await s.read_new(user, "pod-b", count=1, block_ms=None)  # delivered to daemon-2
    # daemon-1 is back on a third process: its two entries move at once, daemon-2's stay
    assert await _start(h, user, "pod-c", "daemon-1") == ids[:2]
    mine = await s.read_pending(user, "pod-c", count=10)
    assert [e.entry_id for e in mine] == ids[:2]
    assert all(e.fields is not None for e in mine)
    assert [e.entry_id for e in await s.read_pending(user, "pod-b", count=10)] == ids[2:]
    assert await s.read_pending(user, "pod-a", count=10) == []
    # the claimed entries count as delivered again (reclaim idle restarts)
    info = await s.queue_info(user, count=10)
    assert {p.entry_id: p.consumer for p in info.pending} == {
        ids[0]: "pod-c", ids[1]: "pod-c", ids[2]: "pod-b"
    }  # fmt: skip
    if h.raw is not None:
        record = await h.raw("HGETALL", daemons_key(user))
        assert dict(zip(record[::2], record[1::2], strict=True)) == {
            "pod-b": "daemon-2", "pod-c": "daemon-1"
        }  # fmt: skip
        assert 0 < await h.raw("PTTL", daemons_key(user)) <= _RECORD_TTL_S * 1000


@check
async def check_take_over_does_nothing_unless_presence_is_ours(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 1)
    await _start(h, user, "pod-a", "daemon-1")
    await s.read_new(user, "pod-a", count=1, block_ms=None)
    await s.set_presence(user, "someone-newer", 30)
    got = await _take_over(h, user, "pod-c", "daemon-1")
    assert got.entries == () and got.deleted_ids == ()
    assert [e.entry_id for e in await s.read_pending(user, "pod-a", count=10)] == ids
    # and it recorded nothing for pod-c: a later session of daemon-1 there may take over
    assert await _start(h, user, "pod-d", "daemon-1") == ids


@check
async def check_unknown_or_mixed_daemons_are_never_taken_over(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 2)
    await _start(h, user, "pod-a", None)  # an older sidecar: no daemon id
    await s.read_new(user, "pod-a", count=1, block_ms=None)
    assert await _start(h, user, "pod-x", "daemon-1") == []
    await _start(h, user, "pod-b", "daemon-1")
    await s.read_new(user, "pod-b", count=1, block_ms=None)
    # another daemon's session starts on pod-b while daemon-1's entry is pending there
    await _start(h, user, "pod-b", "daemon-2")
    assert await _start(h, user, "pod-c", "daemon-1") == []
    assert await _start(h, user, "pod-d", "daemon-2") == []
    assert [e.entry_id for e in await s.read_pending(user, "pod-a", count=10)] == ids[:1]
    assert [e.entry_id for e in await s.read_pending(user, "pod-b", count=10)] == ids[1:]
    if h.raw is not None:
        assert await h.raw("HGET", daemons_key(user), "pod-a") == "?"
        assert await h.raw("HGET", daemons_key(user), "pod-b") == "?"


@check
async def check_take_over_again_records_a_consumer_whose_record_was_lost(
    h: SubstrateHarness,
) -> None:
    """A running session's step ``again`` (its beat wrote lost presence back): a consumer
    with no record left, entries pending on it, is recorded as this daemon's, so they
    can be taken over at once; the session-start rule would say ``?`` (and does: the
    step without ``again``), and a ``?`` still recorded stays ``?``."""
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 3)
    # delivered on pod-a, whose record the store lost (never written, here)
    await s.set_presence(user, "pod-a.daemon-1", 30)
    await s.read_new(user, "pod-a", count=1, block_ms=None)
    await _take_over(h, user, "pod-a", "daemon-1", again=True)
    assert await _start(h, user, "pod-c", "daemon-1") == ids[:1]
    # the same on pod-b (another daemon) without ``again``: unknown, nothing taken over
    await s.set_presence(user, "pod-b.daemon-2", 30)
    await s.read_new(user, "pod-b", count=1, block_ms=None)
    await _take_over(h, user, "pod-b", "daemon-2")
    assert await _start(h, user, "pod-d", "daemon-2") == []
    # a recorded ``?`` is not overwritten by ``again``
    await s.set_presence(user, "pod-b.daemon-2", 30)
    await _take_over(h, user, "pod-b", "daemon-2", again=True)
    assert await _start(h, user, "pod-e", "daemon-2") == []
    assert [e.entry_id for e in await s.read_pending(user, "pod-b", count=10)] == ids[1:2]
    if h.raw is not None:
        assert await h.raw("HGET", daemons_key(user), "pod-b") == "?"


@check
async def check_take_over_reports_entries_whose_body_is_gone(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 2)
    await _start(h, user, "pod-a", "daemon-1")
    await s.read_new(user, "pod-a", count=2, block_ms=None)
    # MAXLEN ~ trims whole macro nodes in Redis: push enough to trim both away
    await h.fill(user, 300, maxlen=50)
    await s.set_presence(user, "pod-c.daemon-1", 30)
    got = await _take_over(h, user, "pod-c", "daemon-1")
    assert got.entries == ()
    assert sorted(got.deleted_ids) == sorted(ids)
    assert await s.read_pending(user, "pod-a", count=10) == []


@check
async def check_take_over_is_bounded_by_count(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    ids = await _enqueue(h, user, 3)
    await _start(h, user, "pod-a", "daemon-1")
    await s.read_new(user, "pod-a", count=3, block_ms=None)
    await s.set_presence(user, "pod-c.daemon-1", 30)
    first = await _take_over(h, user, "pod-c", "daemon-1", count=2)
    assert [e.entry_id for e in first.entries] == ids[:2]
    # pod-a's record stays while it still holds an entry of daemon-1; pod-c's entries
    # went to daemon-1 too (its session there is gone as well): both move
    assert sorted(await _start(h, user, "pod-d", "daemon-1")) == ids
    assert await s.read_pending(user, "pod-a", count=10) == []


@check
async def check_a_deep_heartbeat_keeps_the_daemon_record_alive(h: SubstrateHarness) -> None:
    """The record was kept ``record_ttl_s`` after the session's start only, so a desktop
    connected longer (7 days by default) lost its instant takeover: a deep beat of the
    session holding presence now keeps it; a shallow one, or another session's, does not."""
    s = h.substrate
    for deep in (True, False):
        user = h.user()
        ids = await _enqueue(h, user, 1)
        await s.set_presence(user, "pod-a.daemon-1", 30)
        await _take_over(h, user, "pod-a", "daemon-1", record_ttl_s=0.3)
        await s.read_new(user, "pod-a", count=1, block_ms=None)  # delivered to daemon-1
        beats = [Beat(user, "pod-a.daemon-1", deep=deep), Beat(user, "pod-z.other", deep=True)]
        for beat in beats:  # the second is not ours: it never touches the record
            await s.heartbeat(
                [beat], ttl_s=30, consumer="pod-a", reclaim_idle_ms=60_000, record_ttl_s=60
            )
        if h.raw is not None:
            pttl = await h.raw("PTTL", daemons_key(user))
            assert (pttl > 30_000) if deep else (0 < pttl <= 300)
        await trio.sleep(0.4)  # past the start's TTL: the behaviour under test is time
        # daemon-1 is back on another process: its entry moves at once while the record
        # lives, and waits for the reclaim idle once it has gone
        assert await _start(h, user, "pod-c", "daemon-1") == (ids if deep else [])


@check
async def check_asleep_round_trips_expires_and_clears(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    assert await s.get_asleep(user) is None
    await s.set_asleep(user, Asleep(1_700_000_000.25, "announced"), ttl_s=30)
    assert await s.get_asleep(user) == Asleep(1_700_000_000.25, "announced")
    await s.clear_asleep(user)
    assert await s.get_asleep(user) is None
    await s.clear_asleep(user)  # idempotent
    await s.set_asleep(user, Asleep(5.0, "detected"), ttl_s=0.2)
    if h.raw is not None:
        assert 0 < await h.raw("PTTL", asleep_key(user)) <= 200
    await trio.sleep(0.25)  # the behaviour under test is the passage of time
    assert await s.get_asleep(user) is None
    if h.raw is not None:  # a value that is not ours reads as no record
        await h.raw("SET", asleep_key(user), "not json")
        assert await s.get_asleep(user) is None


@check
async def check_take_over_says_quiet_only_when_nothing_waits(h: SubstrateHarness) -> None:
    """``quiet`` lets a starting session skip its drain, reclaim, sweep and read (issue
    10): it must be False whenever any of them would find something."""
    s, user = h.substrate, h.user()
    await s.set_presence(user, "pod-a.daemon-1", 30)
    assert (await _take_over(h, user, "pod-a", "daemon-1")).quiet  # no stream at all
    [entry_id] = await _enqueue(h, user, 1)
    assert not (await _take_over(h, user, "pod-a", "daemon-1")).quiet  # undelivered
    await s.read_new(user, "pod-b", count=1, block_ms=None)
    assert not (await _take_over(h, user, "pod-a", "daemon-1")).quiet  # pending elsewhere
    assert await s.ack(user, entry_id) == 1
    assert (await _take_over(h, user, "pod-a", "daemon-1")).quiet  # answered, unindexed
    [second] = await _enqueue(h, user, 1)
    await s.read_new(user, "pod-a", count=1, block_ms=None)
    assert not (await _take_over(h, user, "pod-a", "daemon-1")).quiet  # pending on ours
    await s.ack(user, second)
    await s.set_presence(user, "pod-z.daemon-9", 30)  # not ours: nothing is claimed or said
    assert not (await _take_over(h, user, "pod-a", "daemon-1")).quiet
