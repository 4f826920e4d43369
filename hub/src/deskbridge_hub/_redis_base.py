"""What every command mixin of ``RedisSubstrate`` shares: the plumbing it calls (declared
here, provided by ``RedisSubstrate`` in ``_redis``), the ``Script`` type and the reply
helpers. The mixins are split by the substrate contract's concerns (``_substrate``):
``_redis_presence`` (presence, liveness, wake-ups, heartbeats), ``_redis_streams`` (the
job stream), ``_redis_jobs`` (results, progress, job state, catalogue) and
``_redis_caller`` (the caller's scripted path)."""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
from coredis.exceptions import NoScriptError

from ._redis_resend import resend_safe_script
from ._substrate import Entry

if TYPE_CHECKING:
    from ._errors import SubstrateUnavailable
    from ._redis_session import _Session


def _ms(duration_s: float) -> int:
    """Seconds -> whole milliseconds, rounded up, at least 1.

    Raises:
        ValueError: ``duration_s`` is not positive.
    """
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s!r}")
    return max(1, math.ceil(round(duration_s * 1000, 6)))


def _stream_id(entry_id: str) -> tuple[int, int]:
    """``"<ms>-<seq>"`` -> ``(ms, seq)`` for ordering entry IDs."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _entries(raw: Any) -> list[Entry]:
    """``[[id, [f, v, ...] | nil], ...]`` -> entries (nil body: trimmed or deleted)."""
    out = []
    for entry_id, flat in raw or ():
        fields = None if flat is None else dict(zip(flat[::2], flat[1::2], strict=True))
        out.append(Entry(entry_id, fields))
    return out


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: Most index records one look for entries deleted from the middle of a user's stream
#: looks up (``XRANGE id id`` each; the index holds about ``jobs_maxlen`` records, 500 by
#: default, so one look usually covers them all, and an oversized index is covered over
#: several sweeps as the records found are dropped).
DELETED_SCAN = 1000
#: Lua shared by scripts that compare entry IDs and look for deleted entries: ``older(a,
#: b)``, and ``deleted(kj, ids, most)``: of the entry IDs ``ids``, those at or after the
#: stream's first entry that are no longer in it (deleted from its middle: an operator's
#: XDEL), each looked up with ``XRANGE id id``, at most ``most`` looked up. On Redis >= 7.0
#: only IDs up to the stream's ``max-deleted-entry-id`` can be deleted ones (an XDEL
#: raises it, a trim does not), so the others are not looked up: a stream that never saw
#: an XDEL costs one XINFO STREAM. An empty or missing stream: ``{}`` (every indexed
#: entry is older than its first, which the trimmed rule already covers).
#: ``DELETED_SCAN`` (Lua) is :data:`DELETED_SCAN`.
LUA_DELETED = f"local DELETED_SCAN = {DELETED_SCAN}\n" + """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function older(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local function deleted(kj, ids, most)
  local info = redis.pcall('XINFO', 'STREAM', kj)
  if info.err then return {} end
  local t = {}
  for i = 1, #info, 2 do t[info[i]] = info[i + 1] end
  local first, top = t['first-entry'], t['max-deleted-entry-id']
  if not first then return {} end
  local gone, looked = {}, 0
  for _, id in ipairs(ids) do
    if looked >= most then break end
    if not older(id, first[1]) and (not top or not older(top, id)) then
      looked = looked + 1
      if redis.call('XRANGE', kj, id, id)[1] == nil then gone[#gone + 1] = id end
    end
  end
  return gone
end
"""


@attrs.frozen
class Script:
    """A Lua script: its text (sent with ``EVAL``) and SHA-1. ``resend_safe``: a second
    run after a first whose reply was lost has the first's effect and answers as truly,
    so it may be sent once more on a new connection (``_redis_resend``)."""

    text: str
    sha: str = attrs.field(init=False)
    resend_safe: bool = attrs.field(default=False, kw_only=True)

    @sha.default
    def _sha(self) -> str:
        return hashlib.sha1(self.text.encode("utf-8")).hexdigest()

    def __attrs_post_init__(self) -> None:
        if self.resend_safe:
            resend_safe_script(self.text)

    def evalsha(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return (b"EVALSHA", self.sha, len(keys), *keys, *args)

    def eval(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return (b"EVAL", self.text, len(keys), *keys, *args)


class RedisCommandBase:
    """The plumbing a command mixin calls; ``RedisSubstrate`` provides each of these."""

    _command_timeout_s: float
    #: Redis Cluster (scripts stay in one slot) rather than a single Redis.
    _cluster: bool

    def _session(
        self, what: str
    ) -> contextlib.AbstractAsyncContextManager[_Session]:  # pragma: no cover
        raise NotImplementedError

    async def _call(
        self, session: _Session, *command: Any, block_s: float | None = 0.0
    ) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def _heal_group(self, session: _Session, user_id: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def _absent_proves_nothing(self, what: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def _outage(self, what: str, exc: BaseException) -> SubstrateUnavailable | None:
        """``exc`` as the SubstrateUnavailable it stands for, or None (not an outage)."""
        raise NotImplementedError  # pragma: no cover

    def _refuses_work(self, what: str) -> SubstrateUnavailable | None:
        """The error to raise before sending ``what`` while the ACL refuses this user a
        command the hub needs (``RedisConnections.refuses_work``), else None."""
        raise NotImplementedError  # pragma: no cover

    def _refuses_view(self, view: str, what: str) -> SubstrateUnavailable | None:
        """The error to raise before sending ``what`` while the ACL refuses this user a
        command the operator view ``view`` needs (``RedisConnections.refuses_view``)."""
        raise NotImplementedError  # pragma: no cover

    async def _script(
        self,
        s: _Session,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        before: Sequence[tuple[Any, ...]] = (),
        after: Sequence[tuple[Any, ...]] = (),
        resend: bool | None = None,
    ) -> list[Any]:
        """Run ``script`` (EVAL with its text) with ``before``/``after`` commands in the
        same write. Returns the replies (exceptions as values) in order.

        Why EVAL and not EVALSHA: ``before``/``after`` run in the same write, so a
        NOSCRIPT reply (a restarted Redis, a failover, a cluster node that never saw the
        script) comes back after they already ran, and resending the write would apply
        them twice (a second notification, wake-up or progress outcome). Redis caches the
        compiled script under its SHA-1 either way; the text costs a few KiB of loopback
        bandwidth per call and no extra round trip.

        A script sent alone goes as EVALSHA (issue 10: the submit and finishing scripts
        are 2-4 KiB, which every call packed, sent, and Redis hashed again); a NOSCRIPT
        reply means nothing ran, so it is sent once more as EVAL (which caches it).

        ``resend``: whether the write may be sent once more on a new connection when
        the one it went out on is found dead (``_Session.execute``; None: the script's
        own ``resend_safe`` and the command table decide)."""
        timeout_s = self._command_timeout_s
        if before or after:
            commands = (*before, script.eval(keys, args), *after)
            return await s.execute(*commands, timeout_s=timeout_s, resend=resend)
        replies = await s.execute(script.evalsha(keys, args), timeout_s=timeout_s, resend=resend)
        if isinstance(replies[0], NoScriptError):
            replies = await s.execute(script.eval(keys, args), timeout_s=timeout_s, resend=resend)
        return replies
