"""Results, progress, job state and the tool catalogue on Redis: the ``JobCommands`` part
of ``RedisSubstrate`` (contract: ``_substrate.ResultSubstrate`` and ``LedgerSubstrate``).
"""

from __future__ import annotations

from ._jobstate import JobState
from ._redis_base import RedisCommandBase, Script, _entries, _ms
from ._substrate import (
    Marked,
    cancel_key,
    fence_key,
    progress_key,
    result_key,
    state_key,
    tools_key,
)

#: mark_delivered: decide on the server's clock (TIME) whether a job read from the stream
#: may be forwarded; only then record it as delivered and raise its claim epoch (the
#: fencing token ``finish`` checks), kept until the deadline + the state's TTL (at least
#: that TTL). KEYS: state, cancel, fence (the user's slot). ARGV: state, TTL ms, deadline.
#: A deadline that passed expires only a job never forwarded: one whose state says it was
#: delivered (awaiting approval, or interrupted) may have run, so it goes to the desktop
#: again, whose ledger answers (issue 16: a redelivery after a pod kill was answered
#: "expired" for a job that ran).
_MARK_DELIVERED = Script(
    """
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
if ARGV[3] ~= '' and tonumber(now) >= tonumber(ARGV[3]) then
  local stage = nil
  local state = redis.call('GET', KEYS[1])
  if state then
    local ok, body = pcall(cjson.decode, state)
    if ok and type(body) == 'table' then stage = body['stage'] end
  end
  if stage ~= 'delivered' and stage ~= 'interrupted' and stage ~= 'awaiting_approval' then
    return {'expired', now}
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'cancelled', now} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local epoch = redis.call('INCR', KEYS[3])
local keep = tonumber(ARGV[2])
if ARGV[3] ~= '' then
  keep = keep + math.max(0, math.ceil((tonumber(ARGV[3]) - tonumber(now)) * 1000))
end
redis.call('PEXPIRE', KEYS[3], keep)
return {'delivered', now, epoch}
"""
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
    ) -> Marked:
        """One script, one round trip: compare ``deadline`` with the server's ``TIME``
        (unless the stored state says the job was already delivered or interrupted),
        check the cancel flag, and only then SET the state PX ceil(ttl_s * 1000) and
        INCR the job's claim epoch (``bridge:fence:{user_id}:job_id``).

        Returns:
            :class:`Marked` with the verdict, the server's time and (delivered) the epoch.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        limit = "" if deadline is None else repr(float(deadline))
        keys = (
            state_key(user_id, job_id),
            cancel_key(user_id, job_id),
            fence_key(user_id, job_id),
        )
        args = (state.encode(), _ms(ttl_s), limit)
        async with self._session("mark delivered") as s:
            (reply,) = await self._script(s, _MARK_DELIVERED, keys, args)
        if isinstance(reply, BaseException):
            raise reply
        verdict, now, *epoch = reply
        return Marked(str(verdict), float(now), int(epoch[0]) if epoch else None)

    async def request_cancel(self, user_id: str, job_id: str, *, ttl_s: float) -> None:
        """SET ``bridge:cancel:{user_id}:job_id`` 1 PX ceil(ttl_s * 1000).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET cancel") as s:
            await self._call(s, b"SET", cancel_key(user_id, job_id), "1", b"PX", _ms(ttl_s))

    async def set_catalogue(self, user_id: str, catalogue: str) -> None:
        """SET ``bridge:tools:{user_id}`` catalogue (no TTL: the last known catalogue).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("SET tools") as s:
            await self._call(s, b"SET", tools_key(user_id), catalogue)

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
