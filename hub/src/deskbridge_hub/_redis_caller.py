"""The caller's path on Redis: one scripted enqueue step, results read without popping,
per-process notification mailboxes, job owner records. Mixed into ``RedisSubstrate``.

Round trips on a call's critical path (issue 10 item 3): the caller sends one write (the
``submit`` script, plus the ``bridge:job:{<job_id>}`` owner record pipelined behind it)
and then waits on its process's mailbox, which one reader per process drains with
``BLMPOP``; the holder's finishing step (``_redis_finish``) pushes the result into the
job's result list and, in the same step, into that mailbox. Scripts are sent as text
(``EVAL``; see ``_script`` for why not ``EVALSHA``). Every script touches only keys of one
user's hash slot (Redis Cluster).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import SubstrateUnavailable
from ._redis_base import RedisCommandBase, Script, _ms
from ._redis_conn import refused_at_first_write
from ._redis_jobs import _MARK
from ._substrate import (
    GROUP,
    JobOwner,
    Submission,
    Submitted,
    cancel_key,
    daemons_key,
    fence_key,
    idem_key,
    index_key,
    jobs_key,
    mailbox_key,
    owner_key,
    presence_key,
    proc_key,
    result_key,
    state_key,
    tools_digest_key,
    tools_key,
    wake_key,
)

if TYPE_CHECKING:
    pass

#: How far this process's monotonic clock and Redis' may drift apart, seconds per second
#: (100 ppm: ten times what an NTP-disciplined clock drifts): an older reading's bound
#: widens by it.
CLOCK_DRIFT = 1e-4
#: A bound widened by more than this (seconds: 100 s since its reading at ``CLOCK_DRIFT``)
#: is read again (one ``TIME`` round trip before the submit): after an idle hour it had
#: widened by 0.36 s, after a day by 8.6 s, and a caller's instant that far in Redis'
#: past made a healthy submit with a shorter ``timeout_s`` answer ``late`` at once.
MAX_WIDENING_S = 0.01

#: forget_job_id: DEL the owner record only if it is still the claim's own (its token
#: makes copies of one request differ): a refused copy's DEL that landed after another
#: copy enqueued the job and claimed the id again took the running job's id away
#: (``GET``/``DELETE /v1/jobs/{id}`` 404, the id free for another job). KEYS: owner
#: record. ARGV: the record as claimed.
_FORGET_ID = Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
    resend_safe=True,
)
#: claim_job_id(replace=True): the owner record of the job the caller enqueued under
#: the id, unless the record says the job is answered (``_redis_finish._ANSWER_OWNER``).
#: KEYS: owner record. ARGV: record, TTL ms.
_RECLAIM_ID = Script(
    """
local owner = redis.call('GET', KEYS[1])
if owner and string.sub(owner, -2) == ' !' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
""",
    resend_safe=True,
)


@attrs.define
class RedisClock:
    """What one process knows of Redis' clock (``TIME``), for a caller's instants.

    A reading ``T`` received at local ``time.monotonic()`` ``r`` was taken at or before
    ``r``, so Redis' time at local ``m`` is at least ``T + m - r`` (while both clocks run
    at one rate; ``CLOCK_DRIFT`` widens it with the reading's age). The largest such bound
    is kept: a reading on a quick round trip is exact to its round trip, one after a
    stall (a late reply) is worse and replaces it only once the older one has aged as
    much. A bound older than ``MAX_WIDENING_S / CLOCK_DRIFT`` (100 s) is read again
    (:meth:`stale`), and that fresh reading replaces it whatever it says (:meth:`learn`
    with ``fresh``): a Redis clock stepped back is followed within 100 s (until then,
    instants come out late: less protection, as with no reading, never a false ``late``).
    Under Cluster the readings come from the nodes that answer, whose clocks may differ
    by their NTP error; the largest bound is kept, so for a user on a slower node an
    instant may come out late by that difference (less protection, not a false refusal).

    Attributes:
        offset_s: the bound on (Redis time - local monotonic time), seconds, or None (no
            reading yet).
        taken_at: local monotonic time of that reading, seconds.
    """

    offset_s: float | None = None
    taken_at: float = 0.0

    def learn(self, server_time: float, received_at: float, *, fresh: bool = False) -> None:
        """A ``TIME`` reading (Unix s) received at local monotonic ``received_at``;
        ``fresh``: a round trip of its own, taken because the bound was :meth:`stale`
        (it replaces the bound even when lower: Redis' clock was stepped back)."""
        low = server_time - received_at
        if fresh or self.offset_s is None or low >= self._offset(received_at):
            self.offset_s, self.taken_at = low, received_at

    def stale(self, at: float) -> bool:
        """No reading yet, or the bound at local monotonic ``at`` has widened by more
        than ``MAX_WIDENING_S``: read Redis' clock again before using it."""
        return self.offset_s is None or CLOCK_DRIFT * abs(at - self.taken_at) > MAX_WIDENING_S

    def _offset(self, at: float) -> float:
        assert self.offset_s is not None
        return self.offset_s - CLOCK_DRIFT * abs(at - self.taken_at)

    def at_least(self, at: float) -> float | None:
        """Redis' time at local monotonic ``at``, Unix s: a bound it is at least, or None
        without a reading."""
        return None if self.offset_s is None else at + self._offset(at)


#: The caller's one step. KEYS: presence, tools, jobs, index, state, idem, the catalogue's
#: digest (``tools_digest_key``: the catalogue is compared by its recorded SHA-1, not
#: hashed per call), and on a single
#: Redis the holder's wake list (under Cluster it is in another slot: the wake follows in
#: the same write instead), its liveness key, the job's cancel flag and claim epoch, the
#: user's daemon record (a pushed delivery records its consumer's daemon). ARGV:
#: catalogue SHA-1 ('-': no check), maxlen, job id, start-within ms, state, state TTL ms,
#: index flag ('' none; '2': attach only, ``Submission.attach_only``), index record,
#: index TTL ms, the hub process known alive ('' none),
#: wake TTL ms, user id, delivered-state TTL ms ('': no push delivery), group, whether to
#: make sure the group exists ('1': the caller's session has not seen it; '': only when the
#: stream is missing), the caller's call instant and give-up instant (Redis ms, lower
#: bounds from ``RedisClock``; '': unknown), '1' when the job id is the call's own
#: (``Submission.own``), then the entry's fields. Every reply starts
#: with ``TIME`` (s, 6 decimals), which feeds ``RedisClock``. A step that runs at or after
#: the give-up instant answers ``late`` before anything else (the caller has answered
#: already; a Redis stall held the command); the job's deadline counts ``start_within``
#: from the call instant when that is earlier than ``TIME``. The index record is stored
#: with the job's deadline appended; an indexed key is answered with the record (TIME
#: first, as every reply). Order matters: the idempotency index first (a key whose job may
#: still run is never answered "offline"), then presence and the process it names, the
#: catalogue version, the queue's bound (``queue_full`` while the user's entry index
#: holds maxlen entries, HLEN: the ones not yet acknowledged), the job id claim, and only
#: then any other write: the stream's consumer group is made here (``XGROUP CREATE ...
#: MKSTREAM``, BUSYGROUP ignored) just before the XADD, so a refused submit (offline, a
#: dead holder, a stale catalogue, a full queue, a job id in use) writes nothing at all
#: (it was made before the script, in the same write: every unknown user id called left
#: an empty stream without a TTL). On a single Redis the
#: script also reads the holder's liveness key: absent, it answers ``holder`` (the caller
#: checks that process and answers offline: a dead process's presence is not written to);
#: present, the reply says so and the caller's liveness cache is refreshed without a round
#: trip of its own. Push delivery (issue 10): when the holder's liveness key names its
#: consumer and its sessions' in-flight limit, the new entry is the group's only
#: undelivered one (XINFO GROUPS lag 1: no backlog the holder left unread for want of room)
#: and the group has fewer entries pending than that limit (else the session is full: the
#: entry waits unread, as without push), the entry is read into that consumer's pending
#: entries list and marked delivered here (``_MARK``, as ``read_new_delivered`` does), and
#: the wake list gets the read entry as JSON ``[user, id, fields, marked]`` instead of the
#: user id: the holder forwards it without a read of its own.
SUBMIT = Script(
    _MARK
    + """
local function room(key, group, most)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == group then return f['lag'] == 1 and f['pending'] < most end
  end
  return false
end
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[17] ~= '' and now_ms >= tonumber(ARGV[17]) then return {now, 'late'} end
local function again(presence)
  -- ARGV[18] '1': the job id is this call's own, so its job found here was enqueued
  -- by an earlier run of this very step whose reply was lost: answered as then
  local alive = 0
  if KEYS[9] and redis.call('EXISTS', KEYS[9]) == 1 then alive = 1 end
  return {now, 'queued', '', presence or '', 0, alive}
end
if ARGV[7] ~= '' then
  local record = redis.call('GET', KEYS[6])
  if record and ARGV[18] == '1' and string.match(record, '^(%S+)') == ARGV[3] then
    return again(redis.call('GET', KEYS[1]))
  end
  if record then return {now, 'indexed', record} end
  if ARGV[7] == '2' then return {now, 'job_id_in_use'} end
end
local presence = redis.call('GET', KEYS[1])
if ARGV[18] == '1' and redis.call('EXISTS', KEYS[5]) == 1 then return again(presence) end
if not presence then return {now, 'offline'} end
local holder = string.match(presence, '^(.+)%.[^.]*$')
if holder and holder ~= ARGV[10] then return {now, 'holder', presence} end
local consumer = nil
if KEYS[9] then
  consumer = redis.call('GET', KEYS[9])
  if not consumer then return {now, 'holder', presence} end
end
if ARGV[1] ~= '-' then
  -- the digest its writer recorded ('<sha1> <bytes>', ``SET_DIGEST``), trusted while
  -- the catalogue has that length and it matches; otherwise (none, another length, or
  -- another digest: a hub from before the digest wrote the catalogue alone, or the
  -- digest's own write failed) the catalogue itself is hashed, O(its size), so a stale
  -- digest can never refuse the catalogue the caller validated against
  local sha = nil
  local digest = redis.call('GET', KEYS[7])
  if digest then
    local hex, size = string.match(digest, '^(%x+) (%d+)$')
    if hex and tonumber(size) > 0 and tonumber(size) == redis.call('STRLEN', KEYS[2]) then
      sha = hex
    end
  end
  if sha ~= ARGV[1] then
    local catalogue = redis.call('GET', KEYS[2])
    sha = ''
    if catalogue then sha = redis.sha1hex(catalogue) end
    if sha ~= ARGV[1] then return {now, 'catalogue', catalogue} end
  end
end
-- the queue's bound: the index holds every entry not yet acknowledged (dropped with the
-- XACK), so the trim below never has to take an accepted entry to make room
if redis.call('HLEN', KEYS[4]) >= tonumber(ARGV[2]) then return {now, 'queue_full'} end
if ARGV[15] == '1' or redis.call('EXISTS', KEYS[3]) == 0 then
  -- the group only now, on the path that enqueues: a refused submit leaves no stream
  local made = redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[14], '0', 'MKSTREAM')
  if type(made) == 'table' and made.err and not string.find(made.err, 'BUSYGROUP', 1, true) then
    return made
  end
end
if not redis.call('SET', KEYS[5], ARGV[5], 'NX', 'PX', ARGV[6]) then
  return {now, 'job_id_in_use'}
end
local fields = {}
for i = 19, #ARGV do fields[#fields + 1] = ARGV[i] end
local from_ms = now_ms
if ARGV[16] ~= '' then from_ms = math.min(now_ms, tonumber(ARGV[16])) end
local deadline = string.format('%.3f', (from_ms + tonumber(ARGV[4])) / 1000)
fields[#fields + 1] = 'deadline'
fields[#fields + 1] = deadline
fields[#fields + 1] = 'enqueued_at'
fields[#fields + 1] = string.format('%.3f', now_ms / 1000)
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
redis.call('HSET', KEYS[4], id, ARGV[3])
if ARGV[7] ~= '' then redis.call('SET', KEYS[6], ARGV[8] .. ' ' .. deadline, 'PX', ARGV[9]) end
local pushed = 0
if KEYS[8] then
  local item = ARGV[12]
  local reader, most = string.match(consumer, '^(%S+) (%d+)$')
  if ARGV[13] ~= '' and reader and room(KEYS[3], ARGV[14], tonumber(most)) then
    local read = redis.call('XREADGROUP', 'GROUP', ARGV[14], reader, 'COUNT', 1,
      'STREAMS', KEYS[3], '>')
    local entry = read and read[1][2][1]
    if entry then
      local marked = {}
      if entry[1] == id then
        local state = '{"stage":"delivered","user_id":' .. cjson.encode(ARGV[12]) ..
          ',"at":' .. now .. ',"session_id":' .. cjson.encode(presence)
        local desk = redis.call('HGET', KEYS[12], reader)
        if desk then state = state .. ',"daemon_id":' .. cjson.encode(desk) end
        state = state .. '}'
        marked = mark(KEYS[5], KEYS[10], KEYS[11], state, ARGV[13], deadline, now, KEYS[6], ARGV[3])
      end
      item = cjson.encode({ARGV[12], entry[1], entry[2], marked})
      pushed = 1
    end
  end
  redis.call('RPUSH', KEYS[8], item)
  redis.call('PEXPIRE', KEYS[8], ARGV[11])
end
local alive = 0
if consumer then alive = 1 end
return {now, 'queued', id, presence, pushed, alive}
"""
)


class CallerCommands(RedisCommandBase):
    """The caller-path commands of ``RedisSubstrate`` (see the module docstring)."""

    #: this process's knowledge of Redis' clock (set by ``RedisSubstrate``)
    _redis_clock: RedisClock

    async def submit(self, user_id: str, submission: Submission) -> Submitted:
        """The caller's one step: EVAL ``SUBMIT`` (which also pushes the wake-up of
        ``alive_holder`` on a single Redis, and makes the consumer group when it
        enqueues), and under Cluster the wake-up, in one write; with ``write_owner``,
        SET the owner record in a second write once queued (nothing uses it on the hot
        path: the Bridge's job ids name their user or were claimed first).

        Returns:
            :class:`Submitted` (its ``verdict`` says what happened).

        With ``give_up_s``, the call's instant on Redis' clock is taken from
        :class:`RedisClock` (a ``TIME`` round trip first when this substrate has not
        read Redis' clock in the last 100 s (``RedisClock.stale``): before the script is
        sent, so a stall there leaves nothing written), and every reply's ``TIME`` is
        learnt.

        Raises:
            ValueError: ``start_within_s`` < 0, ``maxlen`` < 1, ``give_up_s`` <= 0, or
                ``attach_only`` without an ``idempotency_key``.
            SubstrateUnavailable: Redis unreachable or refusing writes; the job may or may
                not have been enqueued. Raised before anything is sent (``unsent``) while
                the health probe finds the ACL refusing a command the hub needs.

        Cancellation: as an unavailable Redis: the job may or may not be enqueued (with
        ``give_up_s``, a script that runs after the caller's instant refuses, ``late``).
        """
        called = time.monotonic()
        sub = submission
        if not sub.start_within_s >= 0 or sub.maxlen < 1:
            raise ValueError("submit needs start_within_s >= 0 and maxlen >= 1")
        if sub.give_up_s is not None and not sub.give_up_s > 0:
            raise ValueError(f"submit needs give_up_s > 0, got {sub.give_up_s!r}")
        if sub.attach_only and sub.idempotency_key is None:
            raise ValueError("submit with attach_only needs an idempotency_key")
        refused = self._refuses_work("a submit")
        if refused is not None:
            raise refused
        keys: tuple[str, ...] = (
            presence_key(user_id),
            tools_key(user_id),
            jobs_key(user_id),
            index_key(user_id),
            state_key(user_id, sub.job_id),
            idem_key(user_id, sub.idempotency_key or sub.job_id),
            tools_digest_key(user_id),
        )
        # On a single Redis the wake-up is the script's own last write (only once queued);
        # under Cluster its key is in the holder's slot, so it follows in the same write.
        in_script = None if self._cluster else sub.alive_holder  # whose wake the script pushes
        if in_script is not None:
            keys += (
                wake_key(in_script),
                proc_key(in_script),
                cancel_key(user_id, sub.job_id),
                fence_key(user_id, sub.job_id),
                daemons_key(user_id),
            )
        flat = [item for pair in sub.fields.items() for item in pair]
        args = (
            "-" if sub.catalogue_sha1 is None else sub.catalogue_sha1,
            sub.maxlen,
            sub.job_id,
            math.ceil(sub.start_within_s * 1000),
            sub.state.encode(),
            _ms(sub.state_ttl_s),
            "" if sub.idempotency_key is None else "2" if sub.attach_only else "1",
            sub.index_value,
            _ms(sub.index_ttl_s),
            sub.alive_holder or "",
            _ms(sub.wake_ttl_s),
            user_id,
            "" if sub.delivered_ttl_s is None else _ms(sub.delivered_ttl_s),
            GROUP,
            "",  # whether to make sure of the group: set below, per connection session
            "",  # the call's instant (Redis ms, a lower bound): set below
            "",  # the caller's give-up instant (likewise)
            "1" if sub.own else "",
            *flat,
        )
        after: tuple[tuple[Any, ...], ...] = ()
        if sub.alive_holder is not None and in_script is None:
            wake = wake_key(sub.alive_holder)
            after += (
                (b"MULTI",),
                (b"RPUSH", wake, user_id),
                (b"PEXPIRE", wake, _ms(sub.wake_ttl_s)),
                (b"EXEC",),
            )
        script_error: list[BaseException] = []  # the script's own error reply, if any
        try:
            return await self._submit_once(user_id, sub, keys, args, after, called, script_error)
        except SubstrateUnavailable as exc:
            if not (script_error and exc.__cause__ is script_error[0]):
                raise
            if not refused_at_first_write(script_error[0]):
                raise
            # Redis refused the script at its first write: the script reads all it decides
            # on before it writes, its own job too (``own``: a job an earlier send of this
            # step enqueued is answered ``queued``, no write), so nothing was enqueued
            refused = SubstrateUnavailable(
                f"{exc}; nothing was enqueued (refused before the submit's first write): "
                "retry once Redis takes writes"
            )
            refused.refused = True
            raise refused from exc.__cause__

    async def _submit_once(
        self,
        user_id: str,
        sub: Submission,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        after: tuple[tuple[Any, ...], ...],
        called: float,
        script_error: list[BaseException],
    ) -> Submitted:
        """:meth:`submit`'s round trip and the reading of its reply; the script's error
        reply, if it has one, goes into ``script_error`` before it is raised (mapped)."""
        async with self._session("submit") as s:
            if user_id not in s.groups:  # the script makes sure of the group if it enqueues
                args = (*args[:14], "1", *args[15:])
            if sub.give_up_s is not None:
                if self._redis_clock.stale(called):  # never read, or read > 100 s ago
                    reply = await self._call(s, b"TIME")
                    server_s = int(reply[0]) + int(reply[1]) / 1e6
                    self._redis_clock.learn(server_s, time.monotonic(), fresh=True)
                at = self._redis_clock.at_least(called)
                assert at is not None
                at_ms = math.floor(at * 1000)
                give_up_ms = at_ms + math.floor(sub.give_up_s * 1000)
                args = (*args[:15], at_ms, give_up_ms, *args[17:])
            # Sent once more on a new connection (its first connection found dead after
            # Redis may have run it) only when a second run answers truly: an own job id
            # (a job found under it is this step's, answered ``queued``) or a look-up.
            resend = sub.own or sub.attach_only
            replies = await self._script(s, SUBMIT, keys, args, after=after, resend=resend)
            received = time.monotonic()
            if isinstance(replies[0], BaseException):
                script_error.append(replies[0])  # (its refusal may prove it wrote nothing)
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
            server_now, verdict, *rest = replies[0]
            self._redis_clock.learn(float(server_now), received)
            if verdict == "queued":
                s.groups.add(user_id)
                if sub.write_owner:
                    owner = owner_key(sub.job_id)
                    encoded = sub.owner.encode()
                    await self._call(s, b"SET", owner, encoded, b"PX", _ms(sub.state_ttl_s))
        if verdict == "offline":
            # an absent presence proves nothing while Redis cannot serve the hub
            self._absent_proves_nothing("presence")
        if verdict == "queued":
            return Submitted(
                "queued",
                entry_id=rest[0],
                presence=rest[1],
                pushed=rest[2] == 1,
                holder_alive=rest[3] == 1,
            )
        if verdict == "catalogue":
            return Submitted("catalogue", catalogue=rest[0] if rest else None)
        if verdict == "indexed":
            return Submitted("indexed", index_value=rest[0], server_time=float(server_now))
        if verdict == "holder":
            return Submitted("holder", presence=rest[0])
        return Submitted(str(verdict))

    async def claim_job_id(
        self, job_id: str, owner: JobOwner, *, ttl_s: float, replace: bool = False
    ) -> bool:
        """SET ``bridge:job:{job_id}`` NX PX ceil(ttl_s * 1000); ``replace``: EVAL
        ``_RECLAIM_ID`` (SET PX unless the record is marked answered).

        Returns:
            True if the id was free (of every user's jobs) and is now claimed; with
            ``replace``, True if written.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        if replace:
            async with self._session("reclaim job owner") as s:
                (reply,) = await self._script(
                    s, _RECLAIM_ID, (owner_key(job_id),), (owner.encode(), _ms(ttl_s))
                )
                if isinstance(reply, BaseException):
                    raise reply  # inside the session: mapped to SubstrateUnavailable
            return bool(reply)
        async with self._session("SET NX job owner") as s:
            reply = await self._call(
                s, b"SET", owner_key(job_id), owner.encode(), b"NX", b"PX", _ms(ttl_s)
            )
        return reply is not None

    async def job_owner(self, job_id: str) -> JobOwner | None:
        """GET ``bridge:job:{job_id}``.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("GET job owner") as s:
            raw = await self._call(s, b"GET", owner_key(job_id))
        return None if raw is None else JobOwner.decode(raw)

    async def forget_job_id(self, job_id: str, owner: JobOwner) -> None:
        """EVAL ``_FORGET_ID``: DEL ``bridge:job:{job_id}`` if it is ``owner.encode()``.

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("DEL job owner") as s:
            (reply,) = await self._script(s, _FORGET_ID, (owner_key(job_id),), (owner.encode(),))
            if isinstance(reply, BaseException):
                raise reply  # inside the session: mapped to SubstrateUnavailable

    async def get_result(self, user_id: str, job_id: str) -> str | None:
        """LINDEX ``bridge:result:{user_id}:job_id`` 0 (nothing is popped).

        Raises:
            SubstrateUnavailable: Redis unreachable.
        """
        async with self._session("LINDEX result") as s:
            first: str | None = await self._call(s, b"LINDEX", result_key(user_id, job_id), 0)
            return first

    async def read_notifications(
        self, mailbox: str, *, count: int, block_ms: int
    ) -> list[tuple[str, str]]:
        """BLMPOP block_ms/1000 1 ``bridge:notify:{mailbox}`` LEFT COUNT count.

        Returns:
            ``[(job_id, payload)]`` in push order; [] on timeout.

        Raises:
            ValueError: ``block_ms`` < 0 or ``count`` < 1.
            SubstrateUnavailable: Redis unreachable.

        Cancellation: the connection is closed, and the close awaited, before the
        cancellation propagates (no server-side waiter is left to pop later pushes).
        """
        if block_ms < 0 or count < 1:
            raise ValueError("read_notifications needs block_ms >= 0 and count >= 1")
        seconds = f"{block_ms / 1000:.3f}"
        async with self._session("BLMPOP notify") as s:
            reply = await self._call(
                s,
                b"BLMPOP",
                seconds,
                1,
                mailbox_key(mailbox),
                b"LEFT",
                b"COUNT",
                count,
                block_s=block_ms / 1000 if block_ms else None,
            )
        if not reply:
            return []
        out = []
        for item in reply[1]:
            job_id, _, payload = item.partition(" ")
            out.append((job_id, payload))
        return out
