"""A connection that reached a replica (READONLY: the primary demoted under it) is opened
again, at most once a second per connection, so that a URL naming an endpoint that
follows the primary reaches the new one (``_redis_session._REOPEN_ON_READONLY_AFTER_S``;
with real processes: tests/chaos/test_redis_failover.py). A private redis-server on this
suite's port, made a replica of nothing (writes READONLY, reads answered)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate

from tests.procs import RedisServer, running


async def _set(s: RedisSubstrate, *, read: bool = False) -> None:
    """SET (a write: READONLY on a replica), or with ``read`` a GET (MASTERDOWN on a
    replica that does not serve stale data)."""
    command = (b"GET", "bridge:test:ro") if read else (b"SET", "bridge:test:ro", "1")
    async with s._session("SET") as session:
        await s._call(session, *command)


async def _blpop(s: RedisSubstrate) -> None:
    async with s._session("BLPOP") as session:
        await s._call(session, b"BLPOP", "bridge:test:ro-list", "0.05", block_s=0.05)


@pytest.mark.parametrize("stale", ["yes", "no"], ids=["readonly", "masterdown"])
async def test_a_connection_answering_readonly_is_opened_again(tmp_path: Path, stale: str) -> None:
    """``stale`` no: the replica refuses reads too, MASTERDOWN (its primary is down)."""
    redis = RedisServer(tmp_path, name="readonly", port=None)
    with running(redis):
        await trio.to_thread.run_sync(redis.wait_ready)
        with trio.fail_after(30):
            async with RedisSubstrate.from_url(redis.url) as s:
                await _set(s)
                await _blpop(s)
                opened = s.statistics().opened_total
                refused = "READONLY" if stale == "yes" else "MASTERDOWN"
                redis.command("CONFIG", "SET", "replica-serve-stale-data", stale)
                redis.command("REPLICAOF", "127.0.0.1", "1")  # nothing listens there
                await trio.sleep(1.1)  # the connections are older than the reopen bound
                with pytest.raises(SubstrateUnavailable, match=refused):
                    await _set(s, read=stale == "no")
                with pytest.raises(SubstrateUnavailable, match="READONLY"):
                    await _blpop(s)  # BLPOP pops: a write
                await trio.sleep(0.1)  # the shared one closes once its commands are answered
                stats = s.statistics()
                assert stats.shared == 0 and stats.blocking == 0, stats
                # new ones, to the same node here (still a replica): opened once, kept
                for _ in range(5):
                    with pytest.raises(SubstrateUnavailable, match=refused):
                        await _set(s, read=stale == "no")
                assert s.statistics().opened_total == opened + 1, s.statistics()
                redis.command("REPLICAOF", "NO", "ONE")
                await _set(s)
                await _blpop(s)
