"""Contract checks of the 2025-era MCP sessions in the store (``_mcp_store``): a session's
record any process can adopt, its calls in flight, cancels that come before the call,
``DELETE``. Registered by ``_contract.check_substrate``."""

from __future__ import annotations

import secrets

import trio

from ._contract import SubstrateHarness, assert_each_unavailable, check
from ._keys import mcp_session_key
from ._mcp_store import MAX_FIELDS, encode_record


def _sid() -> str:
    return secrets.token_hex(16)


@check
async def check_an_mcp_session_is_found_under_its_own_user_only(h: SubstrateHarness) -> None:
    s, user, other, sid = h.substrate, h.user(), h.user(), _sid()
    record = encode_record("2025-06-18", {"clientInfo": {"name": "t", "version": "1"}})
    assert await s.touch_mcp_session(user, sid, ttl_s=30) is None  # never opened
    await s.open_mcp_session(user, sid, record, ttl_s=30)
    assert await s.touch_mcp_session(user, sid, ttl_s=30) == record
    assert await s.touch_mcp_session(other, sid, ttl_s=30) is None  # another user's URL
    assert await s.touch_mcp_session(user, _sid(), ttl_s=30) is None
    assert await s.end_mcp_session(other, sid) is None  # nor ended there
    assert await s.end_mcp_session(user, sid) == []
    assert await s.touch_mcp_session(user, sid, ttl_s=30) is None  # ended for good
    assert await s.end_mcp_session(user, sid) is None


@check
async def check_an_mcp_session_expires_unless_used(h: SubstrateHarness) -> None:
    s, user, idle, used = h.substrate, h.user(), _sid(), _sid()
    await s.open_mcp_session(user, idle, "r1", ttl_s=0.2)
    await s.open_mcp_session(user, used, "r2", ttl_s=0.2)
    assert await s.touch_mcp_session(user, used, ttl_s=30) == "r2"  # raised to 30 s
    await trio.sleep(0.3)
    assert await s.touch_mcp_session(user, idle, ttl_s=30) is None
    assert await s.touch_mcp_session(user, used, ttl_s=0.05) == "r2"  # never lowered
    await trio.sleep(0.1)
    assert await s.touch_mcp_session(user, used, ttl_s=30) == "r2"
    if h.raw is not None:
        assert 29_000 < await h.raw("PTTL", mcp_session_key(user, used)) <= 30_000


@check
async def check_a_call_in_flight_is_found_by_a_cancel_and_by_the_end(h: SubstrateHarness) -> None:
    s, user, sid = h.substrate, h.user(), _sid()
    await s.open_mcp_session(user, sid, "r", ttl_s=30)
    assert await s.track_mcp_call(user, sid, 5, "job-5", ttl_s=60)
    assert await s.track_mcp_call(user, sid, "5", "job-s5", ttl_s=60)  # another request
    assert await s.track_mcp_call(user, sid, 5, "job-5", ttl_s=60)  # sent again: the same
    if h.raw is not None:  # the session outlives the call's own deadline
        assert await h.raw("PTTL", mcp_session_key(user, sid)) > 30_000
    assert await s.cancel_mcp_call(user, sid, 5) == "job-5"
    assert await s.cancel_mcp_call(user, sid, 5) == "job-5"  # still running: still there
    await s.untrack_mcp_call(user, sid, 5, "job-other")  # not its job: kept
    assert await s.cancel_mcp_call(user, sid, 5) == "job-5"
    await s.untrack_mcp_call(user, sid, 5, "job-5")
    assert await s.cancel_mcp_call(user, sid, 5) is None  # over
    assert await s.end_mcp_session(user, sid) == ["job-s5"]


@check
async def check_a_cancel_before_its_call_stops_the_call(h: SubstrateHarness) -> None:
    """A ``notifications/cancelled`` that lands on a process before the call's own
    process recorded the call: the call, once it looks, must not run."""
    s, user, sid = h.substrate, h.user(), _sid()
    await s.open_mcp_session(user, sid, "r", ttl_s=30)
    assert await s.cancel_mcp_call(user, sid, 7) is None
    assert not await s.track_mcp_call(user, sid, 7, "job-7", ttl_s=60)
    assert await s.track_mcp_call(user, sid, 8, "job-8", ttl_s=60)  # other requests run
    assert await s.end_mcp_session(user, sid) == ["job-8"]  # a cancel mark is no job


@check
async def check_no_call_is_recorded_for_a_session_that_is_gone(h: SubstrateHarness) -> None:
    s, user, sid = h.substrate, h.user(), _sid()
    assert not await s.track_mcp_call(user, sid, 1, "job-1", ttl_s=60)
    assert await s.cancel_mcp_call(user, sid, 1) is None
    assert await s.touch_mcp_session(user, sid, ttl_s=30) is None
    if h.raw is not None:  # nothing was written for it
        assert await h.raw("EXISTS", mcp_session_key(user, sid)) == 0


@check
async def check_cancels_of_unknown_calls_are_bounded(h: SubstrateHarness) -> None:
    s, user, sid = h.substrate, h.user(), _sid()
    await s.open_mcp_session(user, sid, "r", ttl_s=30)
    for rid in range(MAX_FIELDS + 5):
        assert await s.cancel_mcp_call(user, sid, rid) is None
    if h.raw is not None:
        assert await h.raw("HLEN", mcp_session_key(user, sid)) == MAX_FIELDS
    # past the bound a cancel leaves nothing: that call runs (as it did before sharing)
    assert await s.track_mcp_call(user, sid, MAX_FIELDS + 4, "job", ttl_s=60)
    assert not await s.track_mcp_call(user, sid, 0, "job-0", ttl_s=60)


@check
async def check_mcp_session_calls_raise_unavailable(h: SubstrateHarness) -> None:
    down, user, sid = h.make_unavailable(), h.user(), _sid()
    await assert_each_unavailable(
        (
            lambda: down.open_mcp_session(user, sid, "r", ttl_s=30),
            lambda: down.touch_mcp_session(user, sid, ttl_s=30),
            lambda: down.end_mcp_session(user, sid),
            lambda: down.track_mcp_call(user, sid, 1, "j", ttl_s=30),
            lambda: down.untrack_mcp_call(user, sid, 1, "j"),
            lambda: down.cancel_mcp_call(user, sid, 1),
        )
    )
