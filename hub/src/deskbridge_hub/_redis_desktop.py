"""What a desktop says about itself, on Redis: the ``DesktopCommands`` part of
``RedisSubstrate`` (contract: ``_substrate.DesktopSubstrate``): the daemon record with
the instant takeover it allows (one script in the user's slot), and the asleep record."""

from __future__ import annotations

from ._memory_desktop import UNKNOWN_DAEMON, decode_asleep, encode_asleep
from ._redis_base import RedisCommandBase, Script, _entries, _ms
from ._substrate import (
    GROUP,
    Asleep,
    Claimed,
    asleep_key,
    daemons_key,
    index_key,
    jobs_key,
    presence_key,
)

#: take_over. KEYS: stream, daemon record (hash consumer -> daemon id), presence, index.
#: ARGV: group, consumer, daemon id ('' = unknown), session id, count, record TTL ms, '?',
#: '1' for a running session's step again (``again``: a consumer with no record left is
#: this daemon's whatever is pending on it).
#: Returns {claimed entries, deleted ids, quiet (1: nothing pending, nothing undelivered,
#: index empty)}. Every key is in the user's slot; the consumers'
#: processes are not consulted: presence naming this session means every other socket of
#: the user is gone or stale (docs/architecture.md, "Instant takeover").
_TAKE_OVER = Script(
    """
if redis.call('GET', KEYS[3]) ~= ARGV[4] then return {{}, {}, 0} end
local group, me, daemon, unknown = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
local flat = redis.call('HGETALL', KEYS[2])
local record = {}
for i = 1, #flat, 2 do record[flat[i]] = flat[i + 1] end
local claimed, deleted, mine = {}, {}, 0
local budget = tonumber(ARGV[5])
local summary = redis.pcall('XPENDING', KEYS[1], group)
if type(summary) == 'table' and not summary.err then
  for _, c in ipairs(summary[4] or {}) do
    local name, n = c[1], tonumber(c[2])
    if name == me then
      mine = n
    elseif daemon ~= '' and record[name] == daemon and budget > 0 then
      local ids = {}
      for _, p in ipairs(redis.call('XPENDING', KEYS[1], group, '-', '+', budget, name)) do
        ids[#ids + 1] = p[1]
      end
      local got = redis.call('XCLAIM', KEYS[1], group, me, 0, unpack(ids))
      local present = {}
      for _, e in ipairs(got) do
        claimed[#claimed + 1] = e
        present[e[1]] = true
      end
      for _, id in ipairs(ids) do
        if not present[id] then deleted[#deleted + 1] = id end
      end
      budget = budget - #ids
      if #ids >= n then
        redis.call('HDEL', KEYS[2], name)
        record[name] = nil
      end
    end
  end
  local members = {}
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], group)) do
    for i = 1, #c, 2 do if c[i] == 'name' then members[c[i + 1]] = true end end
  end
  for name, _ in pairs(record) do
    if name ~= me and not members[name] then redis.call('HDEL', KEYS[2], name) end
  end
end
local value = daemon
local lost = ARGV[8] == '1' and record[me] == nil
if daemon == '' or (record[me] ~= daemon and mine > 0 and not lost) then value = unknown end
redis.call('HSET', KEYS[2], me, value)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
local quiet = 0
if redis.call('HLEN', KEYS[4]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    quiet = 1
  elseif type(summary) == 'table' and not summary.err and summary[1] == 0 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
      local t = {}
      for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
      if t['name'] == group and t['lag'] == 0 then quiet = 1 end
    end
  end
end
return {claimed, deleted, quiet}
"""
)


class DesktopCommands(RedisCommandBase):
    """Daemon record, takeover and asleep commands of ``RedisSubstrate``."""

    async def take_over(
        self,
        user_id: str,
        consumer: str,
        *,
        daemon_id: str | None,
        session_id: str,
        count: int,
        record_ttl_s: float,
        again: bool = False,
    ) -> Claimed:
        """EVAL the takeover script (see :meth:`DesktopSubstrate.take_over`).

        Raises:
            ValueError: ``count`` < 1 or ``record_ttl_s`` not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count!r}")
        keys = (jobs_key(user_id), daemons_key(user_id), presence_key(user_id), index_key(user_id))
        args = (
            GROUP, consumer, daemon_id or "", session_id, count, _ms(record_ttl_s),
            UNKNOWN_DAEMON, b"1" if again else b"0",
        )  # fmt: skip
        async with self._session("take over") as s:
            (reply,) = await self._script(s, _TAKE_OVER, keys, args)
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
        raw_claimed, deleted, quiet = reply
        return Claimed("0-0", tuple(_entries(raw_claimed)), tuple(deleted), quiet == 1)

    async def set_asleep(self, user_id: str, asleep: Asleep, *, ttl_s: float) -> None:
        """SET ``bridge:asleep:{user_id}`` PX ceil(ttl_s * 1000).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("SET asleep") as s:
            await self._call(s, b"SET", asleep_key(user_id), encode_asleep(asleep), b"PX", px)

    async def get_asleep(self, user_id: str) -> Asleep | None:
        """GET ``bridge:asleep:{user_id}``. Raises SubstrateUnavailable."""
        async with self._session("GET asleep") as s:
            return decode_asleep(await self._call(s, b"GET", asleep_key(user_id)))

    async def clear_asleep(self, user_id: str) -> None:
        """DEL ``bridge:asleep:{user_id}``. Raises SubstrateUnavailable."""
        async with self._session("DEL asleep") as s:
            await self._call(s, b"DEL", asleep_key(user_id))
