"""The holder's finishing step on Redis: one script that checks the delivery's fence,
publishes the result, records the job's state and XACKs the entry (issue 10 item 3,
issue 12 item 3). Mixed into ``RedisSubstrate``; ``publish_result`` (the same script
without fence, state or XACK) lives here too.

Why one script: the step was three round trips (publish, SET state, XACK + HDEL), each
a separate socket send in the hub. Why the order inside it still matters: a Redis script
is atomic towards other clients but a failing command (WRONGTYPE, OOM) stops it where it
fails and keeps the writes made before. So the RPUSH of the result comes before the XACK
(invariant 3): a result write that fails leaves the entry pending, to be redelivered.

The progress stream (``bridge:progress:{<job_id>}``) and the caller's mailbox
(``bridge:notify:{<mailbox>}``) are not in the user's slot. On a single Redis the script
declares them too, so a stale answer (refused by the fence) notifies nobody and the whole
step is one round trip. Under Redis Cluster a script must stay in one slot: the script
covers the user's keys, and the progress and mailbox writes follow in a second round trip,
sent only when the script said ``done``.
"""

from __future__ import annotations

from typing import Any

from ._jobstate import JobState
from ._redis_base import RedisCommandBase, Script, _ms
from ._substrate import (
    GROUP,
    MAILBOX_TTL_S,
    Finished,
    fence_key,
    idem_key,
    index_key,
    jobs_key,
    mailbox_key,
    outcome_event,
    owner_key,
    progress_key,
    result_key,
    state_key,
)

_ANSWER_OWNER = """
local function answer_owner(okey, ttl)
  local owner = redis.call('GET', okey)
  if not owner then return end
  if string.sub(owner, -2) ~= ' !' then owner = owner .. ' !' end
  redis.call('SET', okey, owner, 'PX', ttl)
end
"""

#: The owner record's answer under Cluster (its own slot): KEYS: owner record. ARGV: TTL ms.
ANSWER_OWNER = Script(_ANSWER_OWNER + "answer_owner(KEYS[1], ARGV[1])\n", resend_safe=True)

#: keep_job_ids, one id: PEXPIRE GT unless the record says its job is answered (the
#: answer's write, ``_ANSWER_OWNER``, may have landed first). KEYS: owner record.
#: ARGV: TTL ms.
KEEP_ID = Script(
    """
local owner = redis.call('GET', KEYS[1])
if not owner or string.sub(owner, -2) == ' !' then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[1], 'GT')
""",
    resend_safe=True,
)

#: KEYS: fence, result, idem, state, jobs, index, [progress, mailbox, owner record] (the
#: last three only on a single Redis: other slots). With a state, the owner record of a
#: caller-chosen job id lives at least as long as it (PEXPIRE GT: a job answered after
#: its deadline outlived the record's deadline + result TTL, and GET / DELETE of its id
#: said 404 while its state and answer were kept). ARGV: epoch ('' unfenced), payload
#: ('' none), TTL ms, job id, index flag ('' none), state ('' none), entry ID ('' no
#: XACK), group, mailbox TTL ms, provisional flag ('' no: the payload goes into the
#: result list; '1': only to the caller's mailbox and the progress stream).
#: Order matters (module docstring): fence, result, state, XACK, then the notifications.
#: A terminal answer is final (``Substrate.finish``): with a state to record (not
#: ``publish_result``) and a terminal one stored, only the XACK happens; the reply is
#: ``done`` when the stored state is this step's own (a retry whose reply was lost),
#: else ``settled``. A stage of the delivery written without ``daemon_id`` (the
#: interrupted mark, the desktop's stage reports) keeps the stored one: it names the
#: desktops the job went to (``_jobstate.JobState.daemon_id``), which only the mark knows;
#: every stage of the delivery keeps a stored ``running`` (the desktop reported it running).
#: A stage of the delivery (not terminal) keeps the idempotency record that names the
#: job at least as long as the state (PEXPIRE GT): a retry with the key of a job whose
#: desktop went away attaches to it, never "offline" (the answer's write then keeps the
#: result as long as the record).
#: The answer (a payload, not provisional) sets the record that names the job to its own
#: lifetime: the job's deadline (the record's last part) + the TTL, at least the TTL, and
#: no longer than it had left: the delivery's mark and an ``interrupted`` write keep it
#: as long as a forwarded job's state (a day), which only an unanswered job needs (an
#: answered key would stay taken, and its result kept, a day).
#: A terminal state shortens the claim epoch to its own TTL (PEXPIRE LT): the mark keeps
#: it as long as a forwarded job's state (``_jobstate.forwarded_keep_s``, a day), which
#: only an unanswered job needs.
#: A terminal state sets the owner record to its own TTL (PEXPIRE: GT and LT at once)
#: and marks it answered (``JobOwner.answered``): the delivery keeps a forwarded chosen
#: id's record a day (``_keepalive``), which only an unanswered job needs; an answered
#: id is free again with its state, also when that keep lands after the answer (it
#: keeps no record marked answered, ``KEEP_ID``).
FINISH = Script(
    _ANSWER_OWNER
    + """
if ARGV[1] ~= '' then
  local newest = redis.call('GET', KEYS[1])
  if newest and newest ~= ARGV[1] then return {'stale', newest} end
end
if ARGV[6] ~= '' then
  local current = redis.call('GET', KEYS[4])
  local ok, body = false, nil
  if current then ok, body = pcall(cjson.decode, current) end
  if ok and type(body) == 'table' and (body['stage'] == 'finished' or
      body['stage'] == 'cancelled' or body['stage'] == 'expired' or body['stage'] == 'lost') then
    local acked = 0
    if ARGV[7] ~= '' then
      acked = redis.call('XACK', KEYS[5], ARGV[8], ARGV[7])
      redis.call('HDEL', KEYS[6], ARGV[7])
    end
    if current == ARGV[6] then return {'done', acked} end
    return {'settled', acked}
  end
  if ok and type(body) == 'table' then
    local new = cjson.decode(ARGV[6])
    if new['stage'] == 'delivered' or new['stage'] == 'interrupted' or
        new['stage'] == 'awaiting_approval' then
      if new['daemon_id'] == nil and type(body['daemon_id']) == 'string' then
        ARGV[6] = '{"daemon_id":' .. cjson.encode(body['daemon_id']) .. ',' ..
          string.sub(ARGV[6], 2)
      end
      if body['running'] == true and new['running'] ~= true then
        ARGV[6] = '{"running":true,' .. string.sub(ARGV[6], 2)
      end
    end
  end
end
local ttl = tonumber(ARGV[3])
if ARGV[2] ~= '' and ARGV[10] == '' then
  if ARGV[5] ~= '' then
    local record = redis.call('GET', KEYS[3])
    if record and string.sub(record, 1, string.len(ARGV[4]) + 1) == ARGV[4] .. ' ' then
      local left = redis.call('PTTL', KEYS[3])
      local deadline = tonumber(string.match(record, '^%S+ %S+ %S+ (%S+)$') or '')
      if deadline then
        local t = redis.call('TIME')
        local own = ttl + math.max(0, math.ceil(
          (deadline - tonumber(t[1]) - tonumber(t[2]) / 1000000) * 1000))
        if left > own then left = own end
      end
      if left > ttl then ttl = left end
      redis.call('PEXPIRE', KEYS[3], ttl)
    end
  end
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[3])
  local stage = cjson.decode(ARGV[6])['stage']
  if stage == 'finished' or stage == 'cancelled' or stage == 'expired' or stage == 'lost' then
    if KEYS[9] then answer_owner(KEYS[9], ARGV[3]) end
    redis.call('PEXPIRE', KEYS[1], ARGV[3], 'LT')
  else
    if KEYS[9] then redis.call('PEXPIRE', KEYS[9], ARGV[3], 'GT') end
    if ARGV[5] ~= '' then
      local record = redis.call('GET', KEYS[3])
      if record and string.sub(record, 1, string.len(ARGV[4]) + 1) == ARGV[4] .. ' ' then
        redis.call('PEXPIRE', KEYS[3], ARGV[3], 'GT')
      end
    end
  end
end
local acked = 0
if ARGV[7] ~= '' then
  acked = redis.call('XACK', KEYS[5], ARGV[8], ARGV[7])
  redis.call('HDEL', KEYS[6], ARGV[7])
end
if ARGV[2] ~= '' and #KEYS > 6 then
  redis.call('XADD', KEYS[7], 'NOMKSTREAM', 'MAXLEN', '~', 64, '*', 'p',
    '{"outcome":' .. ARGV[2] .. '}')
  if KEYS[8] ~= '' then
    redis.call('RPUSH', KEYS[8], ARGV[4] .. ' ' .. ARGV[2])
    redis.call('PEXPIRE', KEYS[8], ARGV[9])
  end
end
return {'done', acked}
""",
    resend_safe=True,
)


class FinishCommands(RedisCommandBase):
    """The holder's finishing step (and ``publish_result``) of ``RedisSubstrate``."""

    async def finish(
        self,
        user_id: str,
        job_id: str,
        payload: str | None,
        state: JobState,
        *,
        ttl_s: float,
        entry_id: str | None = None,
        epoch: int | None = None,
        notify: str | None = None,
        idempotency_key: str | None = None,
        provisional: bool = False,
    ) -> Finished:
        """EVAL ``FINISH`` (see the module docstring and ``Substrate.finish``): one round
        trip on a single Redis, two under Cluster (the second only when ``done``).

        Returns:
            :class:`Finished`.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes; the step may or
                may not have happened.
            coredis.exceptions.ResponseError: the script failed (e.g. WRONGTYPE on the
                result list); its writes before the failing one stay.
        """
        return await self._finish(
            user_id, job_id, payload, state.encode(), ttl_s, entry_id, epoch, notify,
            idempotency_key, provisional, terminal=state.stage.terminal,
        )  # fmt: skip

    async def publish_result(
        self,
        user_id: str,
        job_id: str,
        payload: str,
        *,
        ttl_s: float,
        notify: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """``FINISH`` without fence, state or XACK: RPUSH + PEXPIRE of the result list
        (the idempotency record kept as long), then the outcome ends the job's progress
        stream (XADD NOMKSTREAM) and ``<job_id> <payload>`` + PEXPIRE go to the mailbox
        ``notify``.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: Redis unreachable or refusing writes; the payload may
                or may not have been stored.
        """
        await self._finish(user_id, job_id, payload, "", ttl_s, None, None, notify, idempotency_key)

    async def _finish(
        self,
        user_id: str,
        job_id: str,
        payload: str | None,
        state: str,
        ttl_s: float,
        entry_id: str | None,
        epoch: int | None,
        notify: str | None,
        idempotency_key: str | None,
        provisional: bool = False,
        *,
        terminal: bool = False,
    ) -> Finished:
        keys: tuple[str, ...] = (
            fence_key(user_id, job_id),
            result_key(user_id, job_id),
            idem_key(user_id, idempotency_key or job_id),
            state_key(user_id, job_id),
            jobs_key(user_id),
            index_key(user_id),
        )
        box = mailbox_key(notify) if notify else ""
        if not self._cluster:
            keys += (progress_key(job_id), box, owner_key(job_id))
        args = (
            "" if epoch is None else str(epoch),
            payload or "",
            _ms(ttl_s),
            job_id,
            "" if idempotency_key is None else "1",
            state,
            entry_id or "",
            GROUP,
            _ms(MAILBOX_TTL_S),
            "1" if provisional else "",
        )
        async with self._session("finish") as s:
            (reply,) = await self._script(s, FINISH, keys, args)
            if isinstance(reply, BaseException):
                raise reply
            verdict, value = reply
            if verdict == "stale":
                return Finished("stale", newest=int(value))
            if verdict == "settled":
                return Finished("settled", acked=bool(value))
            if self._cluster and (payload or state):
                owner: tuple[Any, ...] = ()
                if state:
                    owner = (_ms(ttl_s),) if terminal else (_ms(ttl_s), b"GT")
                await self._notify(s, job_id, payload, box, owner)
        return Finished("done", acked=bool(value))

    async def _notify(
        self, s: Any, job_id: str, payload: str | None, box: str, owner: tuple[Any, ...]
    ) -> None:
        """Under Cluster: the progress stream's end and the mailbox push (with a
        payload), and the owner record's PEXPIRE (with a state: ``owner``, its TTL and
        flag: GT for a stage of the delivery, none for a terminal state), after the
        script (their keys are in other slots); one write, split per node."""
        after: tuple[tuple[Any, ...], ...] = ()
        if owner and owner[1:] == (b"GT",):
            after += ((b"PEXPIRE", owner_key(job_id), *owner),)
        elif owner:  # the answer: marked answered, so a late keep keeps nothing
            after += (ANSWER_OWNER.eval((owner_key(job_id),), owner),)
        if payload:
            after += (
                (b"XADD", progress_key(job_id), b"NOMKSTREAM", b"MAXLEN", b"~", 64, b"*",
                 b"p", outcome_event(payload)),
            )  # fmt: skip
        if payload and box:
            after += (
                (b"RPUSH", box, f"{job_id} {payload}"),
                (b"PEXPIRE", box, _ms(MAILBOX_TTL_S)),
            )
        replies = await s.execute(*after, timeout_s=self._command_timeout_s)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
