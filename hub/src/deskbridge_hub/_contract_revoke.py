"""Contract checks of token revocation (``_revocation``): the per-user record the
handshake reads, the index the per-process sweep reads, and the notice a holder process
pops from its wake list. Registered by ``_contract.check_substrate``."""

from __future__ import annotations

import time

import trio

from ._contract import SubstrateHarness, assert_each_unavailable, check
from ._keys import revoked_key
from ._substrate_values import Revocation, Revoked, Superseded

#: The index of recent revocations (one key for every user: a check removes its own
#: members, the harness deletes per-user keys only).
_INDEX = "bridge:revocations"


async def _forget(h: SubstrateHarness, *users: str) -> None:
    if h.raw is not None:
        await h.raw("ZREM", _INDEX, *users)


@check
async def check_a_revocation_is_stored_for_good_and_read_back(h: SubstrateHarness) -> None:
    s, user, other = h.substrate, h.user(), h.user()
    now = time.time()
    try:
        assert await s.get_revocation(user) is None
        first = Revocation(before_s=float(int(now)), at_s=now)
        assert await s.revoke_tokens(user, first) == (None, first)  # nobody holds presence
        assert await s.get_revocation(user) == first
        assert await s.get_revocation(other) is None  # one user's record only
        later = Revocation(before_s=float(int(now) + 5), at_s=now + 4.5)
        await s.revoke_tokens(user, later)
        assert await s.get_revocation(user) == later  # the newer one replaces it
        if h.raw is not None:  # kept as long as a token it refuses may live: no TTL
            assert await h.raw("PTTL", revoked_key(user)) == -1
    finally:
        await _forget(h, user)


@check
async def check_an_earlier_cut_off_never_replaces_a_later_one(h: SubstrateHarness) -> None:
    """A second ``revoke`` run on a clock behind the first's (another operator's
    machine) keeps the later cut-off: the tokens the first one refused stay refused, in
    the record the handshake reads and in the index the sweep reads."""
    s, user = h.substrate, h.user()
    now = float(int(time.time()))
    later = Revocation(before_s=now, at_s=now - 0.5)
    try:
        await s.revoke_tokens(user, later)
        reply = await s.revoke_tokens(user, Revocation(now - 600, now - 600.5))
        assert await s.get_revocation(user) == later
        assert dict(await s.recent_revocations(since_s=now - 60)).get(user) == now
        assert reply == (None, later)  # nobody holds presence; the record in force
        again = Revocation(before_s=now, at_s=now + 0.2)  # the same second: kept too
        assert (await s.revoke_tokens(user, again))[1] == later
    finally:
        await _forget(h, user)


@check
async def check_revoking_names_the_session_holding_presence(h: SubstrateHarness) -> None:
    s, user = h.substrate, h.user()
    now = time.time()
    try:
        await s.set_presence(user, "h1.s1", 30)
        assert (await s.revoke_tokens(user, Revocation(float(int(now)), now)))[0] == "h1.s1"
        assert await s.get_presence(user) == "h1.s1"  # presence is not touched
    finally:
        await _forget(h, user)


@check
async def check_recent_revocations_are_listed_by_their_cut_off(h: SubstrateHarness) -> None:
    s, old, new = h.substrate, h.user(), h.user()
    now = float(int(time.time()))
    try:
        await s.revoke_tokens(old, Revocation(before_s=now - 600, at_s=now - 600))
        await s.revoke_tokens(new, Revocation(before_s=now, at_s=now))
        recent = dict(await s.recent_revocations(since_s=now - 60))
        assert recent.get(new) == now
        assert old not in recent
        assert dict(await s.recent_revocations(since_s=now - 700)).get(old) == now - 600
    finally:
        await _forget(h, old, new)


@check
async def check_a_revoked_notice_is_popped_in_push_order_with_the_wakes(
    h: SubstrateHarness,
) -> None:
    s, holder = h.substrate, f"holder-{h.user()}"
    h.on_user(holder)
    await s.wake(holder, "u1", ttl_s=30)
    await s.notify_revoked(holder, "u1", 1_700_000_000.0, ttl_s=30)
    await s.notify_superseded(holder, "u2", "h1.s2", ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_wakes(holder, timeout_s=1, count=10) == [
            "u1",
            Revoked("u1", 1_700_000_000.0),
            Superseded("u2", "h1.s2"),
        ]


@check
async def check_revocation_calls_raise_unavailable(h: SubstrateHarness) -> None:
    down, user = h.make_unavailable(), h.user()
    await assert_each_unavailable(
        (
            lambda: down.get_revocation(user),
            lambda: down.revoke_tokens(user, Revocation(1.0, 1.0)),
            lambda: down.recent_revocations(since_s=0.0),
            lambda: down.notify_revoked("holder", user, 1.0, ttl_s=30),
        )
    )
