"""A desktop's tool catalogue lost alone while the desktop stays connected (evicted under
``allkeys-lru``, deleted): presence stayed, so no beat ever found it "taken", and the
catalogue was written only at the handshake or after a lost presence. ``GET
/v1/users/{u}/tools`` said ``tools: null`` (MCP: no tools) for as long as the session
lasted. A deep beat without a catalogue now looks whether it is gone, and reports that as
``taken``: the next beat writes it again. Both substrates; the session test on
MemorySubstrate with MockClock (autojump)."""

from __future__ import annotations

import secrets

import trio
import trio.testing
from deskbridge_hub._beats import DEEP_EVERY
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import Beat, jobs_key, presence_key, tools_key

from tests.pair import USER, sidecar_pair

from ..conftest import REDIS_URL, RawRedis
from .test_redis_substrate import _command_calls


async def test_a_lost_catalogue_is_written_again_within_the_deep_beats(autojump_clock):
    with trio.fail_after(30 * (DEEP_EVERY + 2)):
        async with sidecar_pair() as pair:
            substrate = pair.state.substrate
            stored = await substrate.get_catalogue(USER)
            assert stored is not None
            lost_at = trio.current_time()
            del substrate._kv[tools_key(USER)]  # evicted; presence stays
            while await substrate.get_catalogue(USER) is None:  # noqa: ASYNC110 - test poll
                await trio.sleep(1)
            back_s = trio.current_time() - lost_at
            assert back_s <= pair.state.timings.heartbeat_s * (DEEP_EVERY + 1), back_s
            assert await substrate.get_catalogue(USER) == stored
            assert pair.daemon.statistics().sessions_started == 1


async def _beat(s, user: str, *, deep: bool):
    (reply,) = await s.heartbeat(
        [Beat(user, "s1", deep=deep)], ttl_s=90, consumer="hub-1", reclaim_idle_ms=180_000
    )
    return reply


async def test_memory_a_deep_beat_reports_a_lost_catalogue_as_taken(autojump_clock):
    s = MemorySubstrate()
    await s.set_presence("u1", "s1", 90)
    await s.set_catalogue("u1", "[]")  # as every handshake does
    assert not (await _beat(s, "u1", deep=True)).taken
    del s._kv[tools_key("u1")]
    assert not (await _beat(s, "u1", deep=False)).taken  # only a deep beat looks
    assert (await _beat(s, "u1", deep=True)).taken


async def test_redis_a_deep_beat_reports_a_lost_catalogue_as_taken_for_one_exists() -> None:
    raw = RawRedis(REDIS_URL)
    user = "cat-" + secrets.token_hex(4)
    try:
        with trio.fail_after(10):
            async with RedisSubstrate.from_url(REDIS_URL) as s:
                assert await s.read_new(user, "hub-1", count=1, block_ms=None) == []  # group
                await s.set_presence(user, "s1", 90)
                await s.set_catalogue(user, "[]")
                assert not (await _beat(s, user, deep=True)).taken
                await raw("DEL", tools_key(user))
                assert not (await _beat(s, user, deep=False)).taken
                before = await _command_calls(raw)
                reply = await _beat(s, user, deep=True)
                after = await _command_calls(raw)
        assert reply.ours and reply.taken
        spent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        spent = {k: v for k, v in spent.items() if v and k not in ("info", "select")}
        assert spent == {"evalsha": 1, "getex": 1, "xinfo|groups": 1, "hlen": 1, "exists": 1}
    finally:
        await raw("DEL", presence_key(user), jobs_key(user), tools_key(user))
