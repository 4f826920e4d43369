"""Presence, process liveness, wake-ups and the pipelined heartbeat on Redis: the
``PresenceCommands`` part of ``RedisSubstrate`` (contract: ``_substrate.PresenceSubstrate``
and ``ReaderSubstrate``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import anyio
from coredis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from ._keys import probe_key
from ._redis_base import LUA_DELETED, RedisCommandBase, Script, _ms
from ._redis_conn import UNAVAILABLE_CODES, error_code
from ._redis_resend import resend_safe_script
from ._redis_slots import key_slot
from ._substrate import (
    GROUP,
    Beat,
    BeatReply,
    CancelAsked,
    Entry,
    Marked,
    Pushed,
    Revoked,
    Superseded,
    WakeItem,
    daemons_key,
    index_key,
    jobs_key,
    presence_key,
    proc_key,
    tools_digest_key,
    tools_key,
    wake_key,
)

#: Lua: delete the presence key only while it still holds this session (atomic).
_CLEAR_IF_HOLDER = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: Refresh presence only while it is absent or ours (a heartbeat never steals it back).
_REFRESH_IF_HOLDER = resend_safe_script(
    "local v = redis.call('GET', KEYS[1]) "
    "if v == false or v == ARGV[1] then "
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end return 0"
)
#: Lua, the heartbeat of up to ``_BEAT_USERS`` users in one script (all keys in one slot
#: on a Cluster: there, those of users whose keys share a slot, usually one). KEYS: per
#: user presence, tools, jobs, index, daemon record, the catalogue's digest (written with
#: a catalogue written again: ``SET_DIGEST``). ARGV: presence TTL ms, group, this
#: consumer, reclaim idle ms, "1" to prune consumers, the daemon record's TTL ms ("" =
#: leave it), then per user: session id, catalogue ("" = leave it), "1" for a deep beat.
#: Returns per user {ours, backlog, reclaim_due, trimmed_due, taken} (see BeatReply),
#: or {-1, error} when the user's own keys made its beat fail (a key holding the wrong
#: kind of value, an index field that is no entry ID): one user's bad data never fails
#: the others' beats. The store refusing (READONLY, NOREPLICAS, MISCONF, OOM, NOPERM,
#: ...: the codes that are an outage for every user) fails the whole call, so it reads
#: as the outage it is.
#:
#: Priced in commands as Redis counts them (INFO commandstats counts the EVALSHA and
#: every command the script runs): an idle user whose group is quiet (lag 0, nothing
#: pending, one consumer) costs GETEX + XINFO GROUPS = 2, plus its share of one EVALSHA;
#: a deep beat without a catalogue adds an EXISTS of the catalogue (a catalogue lost
#: alone, e.g. evicted, is reported as ``taken`` so that it is written again), and a deep
#: beat a PEXPIRE of the daemon record (a session that outlives the record's TTL keeps
#: its instant takeover).
#: Presence is refreshed with one GETEX ... PX (Redis >= 6.2), which also reads whose it
#: is; a newer session's value stays and its TTL becomes ours (with every process on the
#: same timings: its own), and our id is written only where presence is absent. The
#: index is looked at (HLEN, then XRANGE + HKEYS) only when the group is not quiet or the
#: beat is deep; a deep beat that found no trimmed entry then looks for entries deleted
#: from the middle of the stream (``LUA_DELETED``: XINFO STREAM, and XRANGE id id per
#: record up to the stream's largest deleted ID: none on a stream never XDELed);
#: XPENDING only with entries pending; XINFO CONSUMERS (pruning) only when the group has
#: another consumer.
#:
#: Why many users per script (issue 10, idle CPU): one EVALSHA per user cost the hub one
#: request, one reply and 15 packed arguments per desktop and heartbeat, about an eighth
#: of an idle hub's CPU at 10,000 desktops; batched, a user adds 7 arguments and a
#: 5-integer reply. Each user's beat is what it was; users are independent (one's reply
#: never depends on another's keys).
_HEARTBEAT = LUA_DELETED + """
local function record(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local px, grp, me, idle_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local prune = ARGV[5] == '1'
local record_px = ARGV[6]
local function beat(kp, kt, kj, ki, kd, ks, session, catalogue, deep)
  local old = redis.call('GETEX', kp, 'PX', px)
  if old and old ~= session then return {0, 0, 0, 0, 0} end
  local taken = 0
  if not old then
    redis.call('SET', kp, session, 'PX', px)
    taken = 1
  end
  if catalogue ~= '' then
    redis.call('SET', kt, catalogue)
    redis.call('SET', ks, redis.sha1hex(catalogue) .. ' ' .. string.len(catalogue))
  elseif deep and taken == 0 and redis.call('EXISTS', kt) == 0 then
    taken = 1  -- the store lost the catalogue (an eviction): write it again, as after presence
  end
  if deep and record_px ~= '' then
    redis.call('PEXPIRE', kd, record_px)  -- a long session keeps its daemon record
  end
  local backlog, reclaim, trimmed = 0, 0, 0
  local function last_id()
    local tail = redis.call('XREVRANGE', kj, '+', '-', 'COUNT', 1)
    if tail[1] then return tail[1][1] end
    return nil
  end
  local quiet = false
  local groups = redis.pcall('XINFO', 'GROUPS', kj)
  local exists = groups.err == nil
  if exists then
    local group = nil
    for _, g in ipairs(groups) do
      local t = record(g)
      if t['name'] == grp then group = t end
    end
    if group == nil then
      if last_id() then backlog = 1 end
    else
      local lag = group['lag']
      if not lag then
        local tail = last_id()
        if tail and older(group['last-delivered-id'], tail) then backlog = 1 end
      elseif lag > 0 then
        backlog = 1
      end
      if group['pending'] > 0 then
        local idle = redis.call('XPENDING', kj, grp, 'IDLE', idle_ms, '-', '+', 1)
        if idle[1] then reclaim = 1 end
      end
      if prune and group['consumers'] > 1 then
        for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', kj, grp)) do
          local t = record(c)
          if t['name'] ~= me and t['pending'] == 0 and t['idle'] >= tonumber(idle_ms) then
            redis.call('XGROUP', 'DELCONSUMER', kj, grp, t['name'])
          end
        end
      end
      quiet = lag == 0 and group['pending'] == 0
    end
  end
  if (not quiet or deep) and redis.call('HLEN', ki) > 0 then
    local head = {}
    if exists then head = redis.call('XRANGE', kj, '-', '+', 'COUNT', 1) end
    if head[1] == nil then
      trimmed = 1
    else
      local ids = redis.call('HKEYS', ki)
      for _, id in ipairs(ids) do
        if older(id, head[1][1]) then
          trimmed = 1
          break
        end
      end
      -- deleted from the middle (XDEL): looked for on a deep beat only (its price)
      if trimmed == 0 and deep and deleted(kj, ids, DELETED_SCAN)[1] then trimmed = 1 end
    end
  end
  return {1, backlog, reclaim, trimmed, taken}
end
local store_wide = {OOM = true, MISCONF = true, BUSY = true, MASTERDOWN = true,
  NOREPLICAS = true, LOADING = true, NOPERM = true, READONLY = true, CLUSTERDOWN = true}
local out = {}
for i = 0, #KEYS / 6 - 1 do
  local a = 7 + i * 3
  local ok, reply = pcall(beat, KEYS[i * 6 + 1], KEYS[i * 6 + 2], KEYS[i * 6 + 3],
    KEYS[i * 6 + 4], KEYS[i * 6 + 5], KEYS[i * 6 + 6], ARGV[a], ARGV[a + 1], ARGV[a + 2] == '1')
  if ok then
    out[i + 1] = reply
  else
    local why = type(reply) == 'table' and reply.err or tostring(reply)
    -- the store refusing (a replica, writes refused, too few replicas, no permission)
    -- fails the whole call, as the outage it is; anything else came of this user's own
    -- keys (one of the wrong type, an index field that is no entry ID) and stays its own;
    -- Redis 7.0 words an ACL refusal inside a script without NOPERM (``_redis_conn``)
    local code = string.match(why, '^(%u+) ')
    if (code and store_wide[code])
      or string.find(why, "The user executing the script can't", 1, true) then
      return redis.error_reply(why)
    end
    out[i + 1] = {-1, why}
  end
end
return out
"""
_HEARTBEAT_SHA = hashlib.sha1(_HEARTBEAT.encode()).hexdigest()
#: KEYS: the holder's liveness key, a probe key in its slot. 1: the holder is alive; 0:
#: its key is gone and the store takes writes (so the holder could have refreshed it:
#: it is dead); a refused write (OOM, READONLY, NOREPLICAS, MISCONF) fails the call.
_HOLDER_ALIVE = Script(
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
redis.call('SET', KEYS[2], '1', 'PX', 1000)
return 0
""",
    resend_safe=True,
)
#: Users per heartbeat script (bounds how long one script holds Redis: about a ms).
_BEAT_USERS = 100
#: Heartbeat scripts per pipelined write (bounds one write and its reply).
_BEAT_SCRIPTS_PER_WRITE = 10


class PresenceCommands(RedisCommandBase):
    """Presence, liveness, wake-ups and heartbeats of ``RedisSubstrate``."""

    async def set_presence(self, user_id: str, session_id: str, ttl_s: float) -> str | None:
        """SET ``bridge:presence:{user_id}`` = session_id PX ceil(ttl_s * 1000) GET.

        Returns:
            The session id it replaced, or None if there was none.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("SET presence") as s:
            old = await self._call(s, b"SET", presence_key(user_id), session_id, b"PX", px, b"GET")
        return None if old is None else str(old)

    async def get_presence(self, user_id: str) -> str | None:
        """GET the presence key: the holder session id, or None.

        Raises:
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub (evicting policy,
                replica, writes refused: absence proves nothing).
        """
        async with self._session("GET presence") as s:
            holder: str | None = await self._call(s, b"GET", presence_key(user_id))
        if holder is None:
            self._absent_proves_nothing("presence")
        return holder

    async def refresh_presence(self, user_id: str, session_id: str, ttl_s: float) -> bool:
        """SET presence PX ttl only if absent or held by ``session_id`` (one Lua script).

        Returns:
            True if refreshed; False if another session holds it.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("refresh presence") as s:
            key = presence_key(user_id)
            return bool(await self._call(s, b"EVAL", _REFRESH_IF_HOLDER, 1, key, session_id, px))

    async def clear_presence(self, user_id: str, session_id: str) -> bool:
        """Delete presence only while it holds ``session_id`` (one Lua script, atomic).

        Returns:
            True if deleted.

        Raises:
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        async with self._session("clear presence") as s:
            key = presence_key(user_id)
            return bool(await self._call(s, b"EVAL", _CLEAR_IF_HOLDER, 1, key, session_id))

    async def set_liveness(
        self,
        holder_id: str,
        ttl_s: float,
        *,
        consumer: str | None = None,
        max_pending: int = 32,
    ) -> bool:
        """SET ``bridge:proc:{holder_id}`` ``"<consumer> <max_pending>"`` (consumer None:
        ``1``) PX ceil(ttl_s * 1000) GET.

        Returns:
            True if the key was still set (False: it had expired, or Redis lost it).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        async with self._session("SET liveness") as s:
            value = b"1" if consumer is None else f"{consumer} {max_pending}"
            old = await self._call(s, b"SET", proc_key(holder_id), value, b"PX", px, b"GET")
        return old is not None

    async def clear_liveness(self, holder_id: str) -> None:
        """DEL ``bridge:proc:{holder_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        async with self._session("DEL liveness") as s:
            await self._call(s, b"DEL", proc_key(holder_id))

    async def holder_alive(self, holder_id: str) -> bool:
        """EXISTS ``bridge:proc:{holder_id}``; when it is gone, a write (``_HOLDER_ALIVE``)
        tells a dead holder from a store that refuses writes.

        Raises:
            SubstrateUnavailable: Redis unreachable, or refusing writes (out of memory,
                a read-only replica, too few replicas): then the holder's liveness key
                lapsed because its refresh was refused too, and "offline" would be
                untrue of a connected desktop.
        """
        async with self._session("EXISTS liveness") as s:
            keys = (proc_key(holder_id), probe_key(holder_id))
            (reply,) = await self._script(s, _HOLDER_ALIVE, keys, ())
            if isinstance(reply, BaseException):
                raise reply
            return bool(reply)

    async def wake(self, holder_id: str, user_id: str, *, ttl_s: float) -> None:
        """MULTI, RPUSH ``bridge:wake:{holder_id}`` user_id, PEXPIRE ceil(ttl_s * 1000),
        EXEC (one round trip).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        await self._push_wake("RPUSH wake", holder_id, user_id, ttl_s)

    async def notify_superseded(
        self,
        holder_id: str,
        user_id: str,
        session_id: str,
        *,
        ttl_s: float,
        check: bool = False,
    ) -> None:
        """As :meth:`wake`, with the notice (JSON ``{"superseded": session_id, "user":
        user_id}``; ``{"check": ...}`` with ``check``) as the item.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        notice = json.dumps({"check" if check else "superseded": session_id, "user": user_id})
        await self._push_wake("RPUSH superseded", holder_id, notice, ttl_s)

    async def notify_cancel(
        self, holder_id: str, user_id: str, job_id: str, *, ttl_s: float
    ) -> None:
        """As :meth:`wake`, with two items: ``user_id`` and the notice (JSON
        ``{"cancel": job_id, "user": user_id}``; a hub of an older version reads it as a
        user id it holds no session of).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        notice = json.dumps({"cancel": job_id, "user": user_id})
        await self._push_wake("RPUSH cancel", holder_id, user_id, ttl_s, notice)

    async def _push_wake(
        self, operation: str, holder_id: str, item: str, ttl_s: float, *more: str
    ) -> None:
        px = _ms(ttl_s)
        key = wake_key(holder_id)
        async with self._session(operation) as s:
            replies = await s.execute(
                (b"MULTI",),
                (b"RPUSH", key, item, *more),
                (b"PEXPIRE", key, px),
                (b"EXEC",),
                timeout_s=self._command_timeout_s,
            )
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply  # inside the session: mapped to SubstrateUnavailable

    async def wait_wakes(self, holder_id: str, *, timeout_s: float, count: int) -> list[WakeItem]:
        """BLMPOP timeout_s 1 ``bridge:wake:{holder_id}`` LEFT COUNT count.

        Returns:
            What was popped, in order: user ids, entries the submit script read for
            this process (:class:`Pushed`, from its JSON ``[user, id, fields, marked]``)
            and supersede notices (:class:`Superseded`); [] on timeout.

        Raises:
            ValueError: negative ``timeout_s``. SubstrateUnavailable: Redis unreachable.

        Cancellation: as :meth:`read_new`; nothing is popped for a cancelled wait.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        seconds = f"{_ms(timeout_s) / 1000:.3f}" if timeout_s else "0"
        key = wake_key(holder_id)
        async with self._session("BLMPOP wake") as s:
            reply = await self._call(
                s, b"BLMPOP", seconds, 1, key, b"LEFT", b"COUNT", count,
                block_s=timeout_s or None,
            )  # fmt: skip
        if not reply:
            return []
        now = anyio.current_time()
        return [_wake_item(item, now) for item in reply[1]]

    async def heartbeat(
        self,
        beats: Sequence[Beat],
        *,
        ttl_s: float,
        consumer: str,
        reclaim_idle_ms: int,
        prune: bool = True,
        record_ttl_s: float | None = None,
    ) -> list[BeatReply]:
        """The heartbeat script (``_HEARTBEAT``) over up to ``_BEAT_USERS`` users a call,
        pipelined in writes of up to ``_BEAT_SCRIPTS_PER_WRITE`` calls (scripts loaded on
        NOSCRIPT). On a Cluster one call covers users whose keys share a slot (each
        user's keys share its ``{user}`` tag).

        Returns:
            One reply per beat, in the order of ``beats``; a beat the store refused for
            that user's keys alone (a key of the wrong type) has ``error`` set; on a
            Cluster, the beats of a call that met an outage of its node while other
            calls ran have ``unavailable`` set.

        Raises:
            ValueError: ``ttl_s`` (or ``record_ttl_s``, when given) not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes (then no reply
                is known; the caller retries every beat).
            coredis ResponseError: the script failed (a key of the wrong type).
        """
        px = _ms(ttl_s)
        record_px = b"" if record_ttl_s is None else _ms(record_ttl_s)
        shared = (px, GROUP, consumer, reclaim_idle_ms, b"1" if prune else b"0", record_px)
        calls: list[tuple[list[int], tuple[Any, ...]]] = []
        for indexes in _beat_groups(beats, by_slot=self._cluster):
            keys: list[str] = []
            args: list[Any] = []
            for i in indexes:
                b = beats[i]
                u = b.user_id
                keys += (
                    presence_key(u), tools_key(u), jobs_key(u), index_key(u), daemons_key(u),
                    tools_digest_key(u),
                )  # fmt: skip
                args += (b.session_id, b.catalogue or "", b"1" if b.deep else b"0")
            calls.append((indexes, (b"EVALSHA", _HEARTBEAT_SHA, len(keys), *keys, *shared, *args)))
        replies: list[BeatReply | None] = [None] * len(beats)
        failed: list[tuple[list[int], BaseException]] = []
        async with self._session("heartbeat") as s:
            for start in range(0, len(calls), _BEAT_SCRIPTS_PER_WRITE):
                chunk = calls[start : start + _BEAT_SCRIPTS_PER_WRITE]
                commands = [command for _, command in chunk]
                raw = await s.execute(*commands, timeout_s=self._command_timeout_s)
                again = [n for n, r in enumerate(raw) if isinstance(r, NoScriptError)]
                if again:
                    # only the calls that did not run (on a Cluster, one node may have
                    # forgotten the script while the others ran theirs: running those
                    # twice would lose their ``taken``)
                    await self._call(s, b"SCRIPT", b"LOAD", _HEARTBEAT)
                    resent = await s.execute(
                        *(commands[n] for n in again), timeout_s=self._command_timeout_s
                    )
                    for n, reply in zip(again, resent, strict=True):
                        raw[n] = reply
                for (indexes, _), reply in zip(chunk, raw, strict=True):
                    if isinstance(reply, BaseException):
                        failed.append((indexes, reply))
                        continue
                    for i, one in zip(indexes, reply, strict=True):
                        if int(one[0]) < 0:
                            replies[i] = BeatReply(False, error=str(one[1]))
                            continue
                        ours, backlog, reclaim, trimmed, taken = (bool(int(x)) for x in one)
                        replies[i] = BeatReply(ours, backlog, reclaim, trimmed, taken)
            if failed and len(failed) == len(calls):
                raise failed[0][1]  # every call: an outage (or a bug), as one error
            for indexes, exc in failed:
                # Some calls ran, this one was refused before it ran (its slot still
                # migrating after the retries, its node down for the cluster): raising
                # would throw away the others' answers (their ``taken``: catalogues not
                # rewritten) and fail them all. A call whose outcome is unknown (a
                # timeout, a connection lost: it may have run and taken presence) still
                # raises: the reader's full retry rewrites catalogues.
                outage = self._outage("heartbeat", exc) if _refused_unrun(exc) else None
                if outage is None:
                    raise exc
                for i in indexes:
                    replies[i] = BeatReply(False, unavailable=str(outage)[:200])
        return [r for r in replies if r is not None]


def _refused_unrun(exc: BaseException) -> bool:
    """``exc`` is a refusal Redis gives before it runs a command: a Cluster redirection
    or retry that outlived its budget, or a store-wide refusal (OOM, READONLY, ...)."""
    if isinstance(exc, AskError | TryAgainError | ClusterDownError | ReadOnlyError):
        return True
    return isinstance(exc, ResponseError) and error_code(exc) in UNAVAILABLE_CODES


def _beat_groups(beats: Sequence[Beat], *, by_slot: bool) -> list[list[int]]:
    """The indexes of ``beats``, in groups of at most ``_BEAT_USERS`` that one script
    call covers: any users on one Redis; on a Cluster (``by_slot``), users whose keys
    share a slot."""
    if not by_slot:
        return [
            list(range(i, min(i + _BEAT_USERS, len(beats))))
            for i in range(0, len(beats), _BEAT_USERS)
        ]
    slots: dict[int, list[int]] = {}
    for i, b in enumerate(beats):
        slots.setdefault(key_slot(presence_key(b.user_id)), []).append(i)
    return [
        group[i : i + _BEAT_USERS]
        for group in slots.values()
        for i in range(0, len(group), _BEAT_USERS)
    ]


def _wake_item(item: str, received_at: float) -> WakeItem:
    """One wake list item: a user id (user ids never start with ``[`` or ``{``), a
    pushed entry's JSON ``[user, entry id, [field, value, ...], marked]`` (``marked``: the
    mark script's reply, ``{}`` when it did not mark), a supersede notice's JSON
    ``{"superseded": session id, "user": user id}`` (``{"check": ...}``: a doubt), or a
    revocation notice's ``{"revoked": cut-off, "user": user id}`` (``_revocation``), or a
    cancel notice's ``{"cancel": job id, "user": user id}``."""
    if item.startswith("{"):
        try:
            notice = json.loads(item)
            if "revoked" in notice:
                return Revoked(str(notice["user"]), float(notice["revoked"]))
            if "cancel" in notice:
                return CancelAsked(str(notice["user"]), str(notice["cancel"]))
            if "check" in notice:
                return Superseded(str(notice["user"]), str(notice["check"]), check=True)
            return Superseded(str(notice["user"]), str(notice["superseded"]))
        except (ValueError, KeyError, TypeError):  # not one of ours
            return item
    if not item.startswith("["):
        return item
    try:
        user_id, entry_id, flat, marked = json.loads(item)
    except ValueError:  # not one of ours: a user id never starts with "[" (_validate)
        return item
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    verdict = None
    if marked:
        verdict = Marked(str(marked[0]), float(marked[1]), *map(int, marked[2:]))
    return Pushed(user_id, Entry(entry_id, fields, verdict, received_at=received_at))
