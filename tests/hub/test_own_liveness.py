"""``_own_liveness``: when this process's own writes may have lapsed (MockClock)."""

from __future__ import annotations

import trio
from deskbridge_hub._own_liveness import DOUBT_AFTER_S, STALLED_AFTER_S, OwnLiveness


async def test_prompt_refreshes_that_keep_the_key_raise_no_doubt(autojump_clock):
    own = OwnLiveness()
    for _ in range(5):
        own.sending()
        await trio.sleep(0.01)
        own.answered(kept=True)
        assert not own.in_doubt()
        await trio.sleep(1)


async def test_a_refresh_held_past_the_stall_bound_is_doubt_until_well_after_it(
    autojump_clock,
):
    own = OwnLiveness()
    own.sending()
    await trio.sleep(STALLED_AFTER_S * 0.9)
    assert not own.in_doubt()
    await trio.sleep(STALLED_AFTER_S * 0.2)
    assert own.in_doubt()  # held: a black hole, DEBUG SLEEP
    await trio.sleep(2)
    own.answered(kept=True)  # answered late: what it refreshed may have lapsed
    await trio.sleep(DOUBT_AFTER_S - 0.1)
    assert own.in_doubt()
    await trio.sleep(0.2)
    assert not own.in_doubt()


async def test_failing_refreshes_keep_the_first_ones_start(autojump_clock):
    own = OwnLiveness()
    for _ in range(4):  # each fails (the loop sends again without an answer)
        own.sending()
        await trio.sleep(0.5)
    assert own.in_doubt()


async def test_a_lapsed_key_found_promptly_is_doubt_for_a_while(autojump_clock):
    own = OwnLiveness()
    own.sending()
    own.answered(kept=False)  # Redis lost it, or this process stalled
    assert own.in_doubt()
    await trio.sleep(DOUBT_AFTER_S + 0.01)
    assert not own.in_doubt()


async def test_a_users_beat_held_past_the_stall_bound_is_doubt_for_that_user_only(
    autojump_clock,
):
    """A Cluster slot refusing or holding writes (TRYAGAIN while it migrates, its
    primary down) while the process's own liveness key, elsewhere, is kept."""
    own = OwnLiveness()
    own.beat_sending("u1")
    own.beat_sending("u2")
    await trio.sleep(0.01)
    own.beat_kept("u2", taken=False)  # another slot: answered at once
    await trio.sleep(STALLED_AFTER_S * 0.9)
    assert not own.in_doubt("u1")
    await trio.sleep(STALLED_AFTER_S * 0.2)
    assert own.in_doubt("u1")
    assert not own.in_doubt() and not own.in_doubt("u2")
    own.beat_sending("u1")  # the retry keeps the first one's start
    await trio.sleep(3)
    own.beat_kept("u1", taken=True)  # presence had lapsed and was written again
    await trio.sleep(DOUBT_AFTER_S - 0.1)
    assert own.in_doubt("u1")
    await trio.sleep(0.2)
    assert not own.in_doubt("u1")


async def test_a_users_prompt_beats_raise_no_doubt_and_an_ended_session_none(autojump_clock):
    own = OwnLiveness()
    for _ in range(3):
        own.beat_sending("u1")
        await trio.sleep(0.01)
        own.beat_kept("u1", taken=False)
        assert not own.in_doubt("u1")
        await trio.sleep(1)
    own.beat_sending("u1")  # held, then the session ends: its desktop may be gone
    await trio.sleep(STALLED_AFTER_S * 2)
    assert own.in_doubt("u1")
    own.forget("u1")
    assert not own.in_doubt("u1")


# -- a Cluster slot's trouble (``slot_troubled``) -------------------------------------------


async def test_a_troubled_slot_puts_its_users_absent_presence_in_doubt_a_while(autojump_clock):
    from deskbridge_hub._keys import presence_key
    from deskbridge_hub._redis_slots import key_slot

    own = OwnLiveness()
    slot = key_slot(presence_key("u1"))
    own.slot_troubled(slot)
    assert own.in_doubt("u1")
    other = next(f"v{n}" for n in range(100) if key_slot(presence_key(f"v{n}")) != slot)
    assert not own.in_doubt(other)  # another slot's user: no doubt
    await trio.sleep(DOUBT_AFTER_S - 0.1)
    assert own.in_doubt("u1")
    await trio.sleep(0.2)
    assert not own.in_doubt("u1") and not own.in_doubt()


class _CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts the entries walked by ``items()`` (a rebuild's cost)."""

    walked = 0

    def items(self):  # type: ignore[no-untyped-def]
        _CountingDict.walked += len(self)
        return super().items()


async def test_many_troubled_slots_are_not_walked_on_every_trouble(autojump_clock):
    """A node down under Cluster: every command on its slots is troubled, thousands of
    slots within the doubt's time. The record stays bounded (by the slots, and what
    no longer counts is dropped), but it is not walked again on each trouble. Was: past
    256 slots every ``slot_troubled`` rebuilt the whole dict (all still recent, so it
    stayed past 256): quadratic work on the event loop through an outage."""
    own = OwnLiveness()
    _CountingDict.walked = 0
    own._slot_trouble_at = _CountingDict()  # type: ignore[assignment]
    for slot in range(2000):  # 2000 troubled commands, each on another slot
        own.slot_troubled(slot)
        if not isinstance(own._slot_trouble_at, _CountingDict):  # rebuilt: count it too
            own._slot_trouble_at = _CountingDict(own._slot_trouble_at)  # type: ignore[assignment]
        await trio.sleep(0.001)
    assert _CountingDict.walked < 20_000, _CountingDict.walked  # was ~1.7 million
    await trio.sleep(DOUBT_AFTER_S + 1)
    for slot in range(2000, 2300):  # later: what no longer counts is dropped
        own.slot_troubled(slot)
    assert len(own._slot_trouble_at) <= 300


# -- the store changed under this process (``store_changed``) -------------------------------


async def test_a_changed_store_puts_held_users_absent_presence_in_doubt_a_while(autojump_clock):
    """A connection found dead or on a replica, another replication history, an outage
    ended: the writes this process acknowledged last may be lost, the presence of the
    desktops it holds among them. Only those: another desktop's absent presence is
    another process's to doubt."""
    own = OwnLiveness()
    own.holding("u1")
    own.holding("u2")
    assert not own.in_doubt("u1")
    own.store_changed()
    assert own.in_doubt("u1") and own.in_doubt("u2")
    assert not own.in_doubt("u3") and not own.in_doubt()
    own.forget("u2")  # its session ended here: its desktop may be gone
    assert not own.in_doubt("u2")
    await trio.sleep(DOUBT_AFTER_S - 0.1)
    assert own.in_doubt("u1")
    await trio.sleep(0.2)
    assert not own.in_doubt("u1")
    own.store_changed()
    assert own.in_doubt("u1")
