"""Results, progress, job state and the tool catalogue on Redis: the ``JobCommands`` part
of ``RedisSubstrate`` (contract: ``_substrate.ResultSubstrate`` and ``LedgerSubstrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coredis.exceptions import ResponseError, StreamConsumerGroupError

from ._jobstate import JobState
from ._redis_base import RedisCommandBase, Script, _entries, _ms
from ._redis_finish import KEEP_ID
from ._substrate import (
    GROUP,
    Entry,
    Marked,
    cancel_key,
    fence_key,
    idem_key,
    job_keys,
    jobs_key,
    owner_key,
    presence_key,
    progress_key,
    result_key,
    state_key,
    tools_digest_key,
    tools_key,
)

#: mark_delivered: decide on the server's clock (TIME) whether a job read from the stream
#: may be forwarded; only then record it as delivered and raise its claim epoch (the
#: fencing token ``finish`` checks), kept until the deadline + the state's TTL (at least
#: that TTL). KEYS: state, cancel, fence (the user's slot). ARGV: state, TTL ms, deadline.
#: A deadline that passed expires only a job never forwarded: one whose state says it was
#: delivered (awaiting approval, or interrupted) may have run, so it goes to the desktop
#: again, whose ledger answers (issue 16: a redelivery after a pod kill was answered
#: "expired" for a job that ran). A cancel flag likewise: a job never forwarded is
#: "cancelled" (it never started); a forwarded one may have run, so it is "in_doubt",
#: with a raised epoch so that the old delivery's late answer is refused (one answer),
#: and the reply's fourth item says whether an earlier delivery went to another desktop
#: than this one (1; 0: every one went to this daemon, whose ledger knows the job: it is
#: asked for its answer, ``_delivery``); the state is left as it was.
#: A redelivery records the desktop it goes to (the state's ``daemon_id``), or ``?`` once
#: an earlier delivery went to another desktop or one not known (``desk``, as
#: ``_jobstate.delivered_again``), and says so (the reply's fourth item, 1); it keeps
#: ``running`` from the stored state (an earlier delivery was reported running).
#: A delivery keeps the idempotency record that names the job (``ikey``, if any) as long
#: as the state (PEXPIRE GT): a holder that dies writes no ``interrupted`` mark, and the
#: record lapsed at the deadline + result TTL (or its last keep + result TTL) while the
#: state was kept a day; a retry with the key then found it free (``offline``, or a
#: second job the desktop's ledger runs again past its key window). The answer's write
#: sets it back to its own lifetime (``_redis_finish.FINISH``).
_MARK = """
local function forwarded(skey)
  local current = redis.call('GET', skey)
  if not current then return false end
  local ok, body = pcall(cjson.decode, current)
  if not ok or type(body) ~= 'table' then return false end
  local stage = body['stage']
  if stage == 'delivered' or stage == 'interrupted' or stage == 'awaiting_approval' then
    return body
  end
  return false
end
local function desk(state, before)
  if not before then return state, 0 end
  local prev = before['daemon_id']
  local mine = cjson.decode(state)
  if type(prev) == 'string' and prev ~= '?' and prev == mine['daemon_id'] then
    return state, 0
  end
  mine['daemon_id'] = '?'
  return cjson.encode(mine), 1
end
local function raise(fkey, ttl, deadline, now)
  local epoch = redis.call('INCR', fkey)
  local keep = tonumber(ttl)
  if deadline ~= '' then
    keep = keep + math.max(0, math.ceil((tonumber(deadline) - tonumber(now)) * 1000))
  end
  redis.call('PEXPIRE', fkey, keep)
  return epoch
end
local function keep_key(ikey, job, ttl)
  if not ikey or ikey == '' then return end
  local record = redis.call('GET', ikey)
  if record and string.sub(record, 1, string.len(job) + 1) == job .. ' ' then
    redis.call('PEXPIRE', ikey, ttl, 'GT')
  end
end
local function mark(skey, ckey, fkey, state, ttl, deadline, now, ikey, job)
  local sent = forwarded(skey)
  if deadline ~= '' and tonumber(now) >= tonumber(deadline) and not sent then
    return {'expired', now}
  end
  if redis.call('EXISTS', ckey) == 1 then
    if not sent then return {'cancelled', now} end
    local _, other = desk(state, sent)
    return {'in_doubt', now, raise(fkey, ttl, deadline, now), other}
  end
  local written, elsewhere = desk(state, sent)
  if sent and sent['running'] == true and not string.find(written, '"running":true', 1, true) then
    written = '{"running":true,' .. string.sub(written, 2)
  end
  redis.call('SET', skey, written, 'PX', ttl)
  keep_key(ikey, job, ttl)
  return {'delivered', now, raise(fkey, ttl, deadline, now), elsewhere}
end
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
"""
_MARK_DELIVERED = Script(
    _MARK
    + "return mark(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], now, KEYS[4], ARGV[4])\n"
)

#: read_new_delivered: XREADGROUP ... > (no BLOCK) and, for every entry that is a job
#: (``job_id`` and a numeric ``deadline``, no ``control``), the mark above, in one step.
#: KEYS: the stream, presence. ARGV: group, consumer, count, state, TTL ms, then the
#: state, cancel and fence key prefixes (``_keys`` with an empty job id: every key in the
#: user's slot), then the reading session's id ('' = no check), then the idempotency
#: record's key prefix (the entry's ``idempotency_key`` names it): nothing is read while
#: presence names another session (a superseded session, maybe half-open).
_READ_DELIVERED = Script(
    _MARK
    + """
if ARGV[9] ~= '' then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[9] then return {} end
end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
  'STREAMS', KEYS[1], '>')
if not reply then return {} end
local out = {}
for _, entry in ipairs(reply[1][2]) do
  local flat, f = entry[2], {}
  for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
  local marked = {}
  local job = f['job_id']
  if job and job ~= '' and not f['control'] and tonumber(f['deadline']) then
    local ikey = nil
    if f['idempotency_key'] then ikey = ARGV[10] .. f['idempotency_key'] end
    marked = mark(ARGV[6] .. job, ARGV[7] .. job, ARGV[8] .. job, ARGV[4], ARGV[5],
      f['deadline'], now, ikey, job)
  end
  out[#out + 1] = {entry[1], flat, marked}
end
return out
"""
)


#: unmark_delivered: KEYS: state, fence. ARGV: epoch, state, TTL ms.
_UNMARK = Script(
    """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local ok, body = pcall(cjson.decode, current)
if not ok or type(body) ~= 'table' or body['stage'] ~= 'delivered' then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
"""
)

#: restore_delivery: KEYS: state, fence. ARGV: epoch, state, TTL ms. Only over a stored
#: ``queued`` state and a claim epoch absent or not above ``epoch``; the epoch's TTL is
#: never shortened.
_RESTORE = Script(
    """
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local ok, body = pcall(cjson.decode, current)
if not ok or type(body) ~= 'table' or body['stage'] ~= 'queued' then return 0 end
local held = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if held > tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local keep = math.max(redis.call('PTTL', KEYS[2]), tonumber(ARGV[3]))
redis.call('SET', KEYS[2], ARGV[1], 'PX', keep)
return 1
"""
)


#: The catalogue's digest (``tools_digest_key``: ``<SHA-1 hex> <bytes>``), which the
#: caller's step compares instead of hashing the catalogue on every call (Redis' CPU per
#: call grew with the catalogue's size: ~3.3 us per KiB, a 1 MiB catalogue ~3.5 ms of
#: Redis per call, every user's calls waiting meanwhile). Hashed here, once per session,
#: so the digest is of the very bytes stored. KEYS: digest. ARGV: catalogue.
SET_DIGEST = Script(
    """
redis.call('SET', KEYS[1], redis.sha1hex(ARGV[1]) .. ' ' .. string.len(ARGV[1]))
return 1
""",
    resend_safe=True,
)

class JobCommands(RedisCommandBase):
    """Results, progress, job state and catalogue commands of ``RedisSubstrate``."""

    async def wait_result(self, user_id: str, job_id: str, *, timeout_s: float) -> str | None:
        """BLPOP ``bridge:result:{user_id}:job_id`` timeout_s (server-side; 0 waits forever).

        Args:
            timeout_s: seconds, millisecond precision (a positive value below 1 ms
                waits 1 ms).

        Returns:
            The payload, or None on timeout.

        Raises:
            ValueError: negative ``timeout_s``.
            SubstrateUnavailable: Redis unreachable, or no reply ``command_timeout_s``
                after the timeout.

        Cancellation: as :meth:`read_new`; nothing is popped for a cancelled wait.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        seconds = f"{_ms(timeout_s) / 1000:.3f}" if timeout_s else "0"
        async with self._session("BLPOP result") as s:
            reply = await self._call(
                s, b"BLPOP", result_key(user_id, job_id), seconds, block_s=timeout_s or None
            )
        return None if reply is None else reply[1]

    # -- progress ----------------------------------------------------------------------

    async def publish_progress(
        self, job_id: str, payload: str, *, ttl_s: float, maxlen: int = 64
    ) -> None:
        """MULTI, XADD ``bridge:progress:{job_id}`` MAXLEN ~ maxlen * p payload, PEXPIRE,
        EXEC (one round trip).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes.
        """
        px = _ms(ttl_s)
        key = progress_key(job_id)
        async with self._session("XADD progress") as s:
            replies = await s.execute(
                (b"MULTI",),
                (b"XADD", key, b"MAXLEN", b"~", maxlen, b"*", b"p", payload),
                (b"PEXPIRE", key, px),
                (b"EXEC",),
                timeout_s=self._command_timeout_s,
            )
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply

    async def read_progress(
        self, job_id: str, after: str, *, block_ms: int
    ) -> list[tuple[str, str]]:
        """XREAD COUNT 100 BLOCK block_ms STREAMS ``bridge:progress:{job_id}`` after.

        Returns:
            ``[(entry_id, payload)]`` in order; ``[]`` on timeout.

        Raises:
            ValueError: negative ``block_ms``.
            SubstrateUnavailable: Redis unreachable.

        Cancellation: as :meth:`read_new` (the blocked connection is discarded).
        """
        if block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {block_ms!r}")
        key = progress_key(job_id)
        async with self._session("XREAD progress") as s:
            reply = await self._call(
                s,
                b"XREAD",
                b"COUNT",
                100,
                b"BLOCK",
                block_ms,
                b"STREAMS",
                key,
                after,
                block_s=block_ms / 1000 if block_ms else None,
            )
        if not reply:
            return []
        entries = reply.get(key) if isinstance(reply, dict) else reply[0][1]
        return [(e.entry_id, e.fields.get("p", "")) for e in _entries(entries) if e.fields]

    async def set_job_state(
        self, user_id: str, job_id: str, state: JobState, *, ttl_s: float
    ) -> None:
        """SET ``bridge:state:{user_id}:job_id`` state.encode() PX ceil(ttl_s * 1000).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET state") as s:
            await self._call(
                s, b"SET", state_key(user_id, job_id), state.encode(), b"PX", _ms(ttl_s)
            )

    async def claim_job(self, user_id: str, job_id: str, state: JobState, *, ttl_s: float) -> bool:
        """SET ``bridge:state:{user_id}:job_id`` state.encode() NX PX ceil(ttl_s * 1000).

        Returns:
            True if the job id was free and is now claimed.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET NX state") as s:
            reply = await self._call(
                s, b"SET", state_key(user_id, job_id), state.encode(), b"NX", b"PX", _ms(ttl_s)
            )
        return reply is not None

    async def get_job_state(self, user_id: str, job_id: str) -> JobState | None:
        """GET ``bridge:state:{user_id}:job_id``, decoded.

        Raises:
            MalformedState: the stored value is not a job state.
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub.
        """
        async with self._session("GET state") as s:
            raw = await self._call(s, b"GET", state_key(user_id, job_id))
        if raw is None:
            self._absent_proves_nothing("job state")
            return None
        return JobState.decode(raw)

    async def mark_delivered(
        self,
        user_id: str,
        job_id: str,
        state: JobState,
        *,
        ttl_s: float,
        deadline: float | None = None,
        idempotency_key: str | None = None,
    ) -> Marked:
        """One script, one round trip: compare ``deadline`` with the server's ``TIME``
        (unless the stored state says the job was already delivered or interrupted),
        check the cancel flag, and only then SET the state PX ceil(ttl_s * 1000),
        INCR the job's claim epoch (``bridge:fence:{user_id}:job_id``) and keep the
        record of ``idempotency_key`` at least as long, if it names this job.

        Returns:
            :class:`Marked` with the verdict, the server's time and (delivered) the epoch.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        limit = "" if deadline is None else repr(float(deadline))
        keys: tuple[str, ...] = (
            state_key(user_id, job_id),
            cancel_key(user_id, job_id),
            fence_key(user_id, job_id),
        )
        if idempotency_key is not None:  # never an empty key: under Cluster it has a slot
            keys += (idem_key(user_id, idempotency_key),)
        args = (state.encode(), _ms(ttl_s), limit, job_id)
        async with self._session("mark delivered") as s:
            (reply,) = await self._script(s, _MARK_DELIVERED, keys, args)
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
        verdict, now, *rest = reply
        return Marked(str(verdict), float(now), *map(int, rest))

    async def read_new_delivered(
        self,
        user_id: str,
        consumer: str,
        *,
        count: int,
        state: JobState,
        ttl_s: float,
        session_id: str | None = None,
    ) -> list[Entry]:
        """EVAL ``_READ_DELIVERED``: XREADGROUP GROUP bridge-workers consumer COUNT count
        STREAMS key > (no BLOCK) and :meth:`mark_delivered` of every job read, in one
        round trip (issue 10 item 3: the holder's read and its delivery mark).

        Returns:
            New entries, now in this consumer's PEL, each job's with its ``marked``;
            ``[]`` when there are none, when presence names another session than
            ``session_id``. A missing group is recreated from 0 and read at once.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        keys = (jobs_key(user_id), presence_key(user_id))
        args = (
            GROUP, consumer, count, state.encode(), _ms(ttl_s), state_key(user_id, ""),
            cancel_key(user_id, ""), fence_key(user_id, ""), session_id or "",
            idem_key(user_id, ""),
        )  # fmt: skip
        async with self._session("read + mark delivered") as s:
            (reply,) = await self._script(s, _READ_DELIVERED, keys, args)
            if _no_group(reply):
                # Redis lost the group (restarted empty) and an XADD made the stream
                # again: its entries are new to the group made from 0, so read them now
                # (returning [] left them to the next heartbeat: a call waited 30-60 s)
                s.groups.discard(user_id)
                await self._heal_group(s, user_id)
                (reply,) = await self._script(s, _READ_DELIVERED, keys, args)
                if _no_group(reply):  # gone again meanwhile: the next read heals it
                    return []
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
        s.groups.add(user_id)
        out = []
        for entry_id, flat, marked in reply:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            verdict = None
            if marked:
                verdict = Marked(str(marked[0]), float(marked[1]), *map(int, marked[2:]))
            out.append(Entry(entry_id, fields, verdict))
        return out

    async def keep_job(
        self, user_id: str, job_id: str, *, ttl_s: float, idempotency_key: str | None = None
    ) -> None:
        """PEXPIRE ceil(ttl_s * 1000) GT of each of the job's records (``job_keys``:
        state, claim epoch, cancel flag, owner record, idempotency record) in one write
        (split per node under Cluster). GT (Redis >= 7) never shortens a TTL, and
        PEXPIRE never makes a key.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable.
        """
        px = _ms(ttl_s)
        commands = [
            (b"PEXPIRE", key, px, b"GT") for key in job_keys(user_id, job_id, idempotency_key)
        ]
        async with self._session("keep job") as s:
            for reply in await s.execute(*commands, timeout_s=self._command_timeout_s):
                if isinstance(reply, BaseException):
                    raise reply  # inside the session: mapped to SubstrateUnavailable

    async def keep_job_ids(self, job_ids: Sequence[str], *, ttl_s: float) -> None:
        """PEXPIRE ceil(ttl_s * 1000) GT of each job id's owner record unless it says
        its job is answered (``KEEP_ID``, one EVAL per id in its own slot), in one write
        (split per node under Cluster; see ``Substrate.keep_job_ids``).

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable.
        """
        if not job_ids:
            return
        px = _ms(ttl_s)
        commands = [KEEP_ID.eval((owner_key(job_id),), (px,)) for job_id in job_ids]
        async with self._session("keep job ids") as s:
            for reply in await s.execute(*commands, timeout_s=self._command_timeout_s):
                if isinstance(reply, BaseException):
                    raise reply  # inside the session: mapped to SubstrateUnavailable

    async def unmark_delivered(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """EVAL ``_UNMARK`` (see ``Substrate.unmark_delivered``).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        keys = (state_key(user_id, job_id), fence_key(user_id, job_id))
        async with self._session("unmark delivered") as s:
            (reply,) = await self._script(s, _UNMARK, keys, (epoch, state.encode(), _ms(ttl_s)))
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
        return bool(reply)

    async def restore_delivery(
        self, user_id: str, job_id: str, state: JobState, *, epoch: int, ttl_s: float
    ) -> bool:
        """EVAL ``_RESTORE`` (see ``Substrate.restore_delivery``).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        keys = (state_key(user_id, job_id), fence_key(user_id, job_id))
        async with self._session("restore delivery") as s:
            (reply,) = await self._script(s, _RESTORE, keys, (epoch, state.encode(), _ms(ttl_s)))
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable
        return bool(reply)

    async def cancel_requested(self, user_id: str, job_id: str) -> bool:
        """EXISTS ``bridge:cancel:{user_id}:job_id``.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("EXISTS cancel") as s:
            return bool(await self._call(s, b"EXISTS", cancel_key(user_id, job_id)))

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """SET ``bridge:cancel:{user_id}:job_id`` 1 NX PX ceil(ttl_s * 1000).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET cancel") as s:
            await self._call(s, b"SET", cancel_key(user_id, job_id), "1", b"NX", b"PX", _ms(ttl_s))

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """SET ``bridge:tools:{user_id}`` catalogue (no TTL: the last known catalogue),
        then its digest ``bridge:toolsha:{user_id}`` (``SET_DIGEST``), in one write: two
        one-key commands, so a handshake goes on while its user's Cluster slot migrates
        (a two-key script is refused TRYAGAIN until the migration ends). Between the two,
        or if the second fails, the digest may be the previous catalogue's: the submit
        trusts it only while the catalogue has the length it records.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET tools") as s:
            replies = await self._script(
                s,
                SET_DIGEST,
                (tools_digest_key(user_id),),
                (catalogue,),
                before=((b"SET", tools_key(user_id), catalogue),),
            )
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply

    async def get_catalogue(self, user_id: str) -> str | None:
        """GET ``bridge:tools:{user_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable, or the key is absent while the last
                health probe found Redis unable to serve the hub.
        """
        async with self._session("GET tools") as s:
            catalogue: str | None = await self._call(s, b"GET", tools_key(user_id))
        if catalogue is None:
            self._absent_proves_nothing("catalogue")
        return catalogue


def _no_group(reply: Any) -> bool:
    """The reply of a read whose stream or consumer group is missing (NOGROUP)."""
    return isinstance(reply, StreamConsumerGroupError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOGROUP")
    )
