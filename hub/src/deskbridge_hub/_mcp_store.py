"""2025-era MCP sessions in the shared store, so every hub process serves every session
(docs/architecture.md, "MCP sessions on every replica"; the hub's side: ``_mcp_sessions``).

One hash per session, ``bridge:mcp:{<user_id>}:<session_id>`` (the user's hash tag: one
slot under Redis Cluster, one key per script):

* field ``s``: the session's record (:func:`encode_record`: the negotiated protocol
  version and the client's ``initialize`` params), written when ``initialize`` succeeded;
* field ``c:<request id as JSON>``: the job a ``tools/call`` of the session runs, while it
  runs (unkeyed calls only: the ones a cancel withdraws), or :data:`CANCELLED`, left by a
  ``notifications/cancelled`` that came before the call was recorded.

The key's TTL is the session's idle timeout, raised (never lowered: ``PEXPIRE ... GT``)
by every request on any process and by each call to cover its own deadline. The session
belongs to the user whose URL opened it: the key is looked up under the URL's user, so
another user's URL never finds it. ``DELETE`` drops the key (its calls' jobs come back to
be withdrawn).

Every method raises :class:`~deskbridge_hub.SubstrateUnavailable` when the store cannot
be reached (and ``ValueError`` for a ``ttl_s`` that is not positive).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Protocol

from ._keys import mcp_session_key

#: The hash field of the session's record.
RECORD_FIELD = "s"
#: A call's field value when a cancel came before the call was recorded.
CANCELLED = "!"
#: Most fields one session's hash takes from cancels of calls it does not know (each
#: such cancel leaves :data:`CANCELLED`); past it they are not recorded (a client
#: cancelling made-up request ids must not grow the hash without bound).
MAX_FIELDS = 256
#: Most bytes of the client's ``initialize`` params kept in the record; larger ones are
#: left out (the hub's handlers never read them; the version is always kept).
MAX_CLIENT_BYTES = 8192


def call_field(request_id: str | int) -> str:
    """The hash field of the call with JSON-RPC id ``request_id`` (``1`` and ``"1"`` are
    two requests)."""
    return "c:" + json.dumps(request_id)


def encode_record(protocol_version: str, client: dict[str, Any] | None) -> str:
    """The record of a session that negotiated ``protocol_version`` with a client whose
    ``initialize`` params were ``client`` (dropped past :data:`MAX_CLIENT_BYTES`)."""
    kept = client
    if client is not None and len(json.dumps(client)) > MAX_CLIENT_BYTES:
        kept = None
    return json.dumps({"protocolVersion": protocol_version, "client": kept})


def decode_record(raw: str) -> tuple[str, dict[str, Any] | None] | None:
    """``(protocol version, client params or None)`` of a record, or None when it is not
    one (written by something else: the session is then not adopted)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("protocolVersion"), str):
        return None
    client = value.get("client")
    return value["protocolVersion"], client if isinstance(client, dict) else None


class McpSessionSubstrate(Protocol):
    """The store's part (``MemoryMcpSessions``, ``RedisMcpSessions``; contract checks in
    ``_contract_mcp``)."""

    async def open_mcp_session(
        self, user_id: str, session_id: str, record: str, *, ttl_s: float
    ) -> None:
        """Write the session's record with a TTL of ``ttl_s`` seconds."""

    async def touch_mcp_session(self, user_id: str, session_id: str, *, ttl_s: float) -> str | None:
        """The session's record, None when it has none (never opened, ended, expired);
        a live one's TTL is raised to ``ttl_s`` seconds if shorter. One round trip."""

    async def end_mcp_session(self, user_id: str, session_id: str) -> list[str] | None:
        """Drop the session; returns the jobs its calls in flight run (None: there was
        no session)."""

    async def track_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str, *, ttl_s: float
    ) -> bool:
        """Record that the session's request ``request_id`` runs ``job_id`` and raise the
        session's TTL to ``ttl_s`` if shorter. False, recording nothing, when that request
        was cancelled already or the session is gone: the call must not run."""

    async def untrack_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str
    ) -> None:
        """Forget the call (only if it still names ``job_id``)."""

    async def cancel_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int
    ) -> str | None:
        """The job the session's request ``request_id`` runs, to be withdrawn; None when
        none is recorded (then, while the session lives and has room, :data:`CANCELLED`
        is left for the call to find when it starts: see :meth:`track_mcp_call`)."""


_OPEN = """
redis.call('HSET', KEYS[1], 's', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_TOUCH = """
local record = redis.call('HGET', KEYS[1], 's')
if record then redis.call('PEXPIRE', KEYS[1], ARGV[1], 'GT') end
return record
"""
_END = """
local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return all
"""
_TRACK = """
if redis.call('HEXISTS', KEYS[1], 's') == 0 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) == '!' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3], 'GT')
return 1
"""
_UNTRACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""
_CANCEL = """
if redis.call('HEXISTS', KEYS[1], 's') == 0 then return false end
local job = redis.call('HGET', KEYS[1], ARGV[1])
if job then return job end
if redis.call('HLEN', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], '!')
end
return false
"""


@functools.cache
def _scripts() -> dict[str, Any]:
    """The scripts as ``_redis_base.Script`` (imported here: ``_redis_base`` imports the
    substrate module). All but ``_END`` may run twice (the second run after a lost reply
    has the first's effect; ``_END``'s second would find nothing to report)."""
    from ._redis_base import Script

    safe = {"open": _OPEN, "touch": _TOUCH, "track": _TRACK, "untrack": _UNTRACK}
    scripts = {name: Script(text, resend_safe=True) for name, text in safe.items()}
    scripts["cancel"] = Script(_CANCEL, resend_safe=True)
    scripts["end"] = Script(_END)
    return scripts


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _ms(ttl_s: float) -> int:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
    return max(1, math.ceil(ttl_s * 1000))


def _jobs(fields: dict[str, str]) -> list[str]:
    return sorted(v for k, v in fields.items() if k.startswith("c:") and v != CANCELLED)


class RedisMcpSessions:
    """The MCP session commands of ``RedisSubstrate`` (one script each)."""

    async def _mcp(self, what: str, name: str, user_id: str, session_id: str, *args: Any) -> Any:
        async with self._session(what) as s:  # type: ignore[attr-defined]
            replies = await self._script(  # type: ignore[attr-defined]
                s, _scripts()[name], [mcp_session_key(user_id, session_id)], list(args)
            )
            if isinstance(replies[0], BaseException):
                raise replies[0]
        return replies[0]

    async def open_mcp_session(
        self, user_id: str, session_id: str, record: str, *, ttl_s: float
    ) -> None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        await self._mcp("open MCP session", "open", user_id, session_id, record, _ms(ttl_s))

    async def touch_mcp_session(self, user_id: str, session_id: str, *, ttl_s: float) -> str | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        ms = _ms(ttl_s)
        return _text(await self._mcp("touch MCP session", "touch", user_id, session_id, ms))

    async def end_mcp_session(self, user_id: str, session_id: str) -> list[str] | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        flat = [
            _text(v) or "" for v in await self._mcp("end MCP session", "end", user_id, session_id)
        ]
        if not flat:
            return None
        return _jobs(dict(zip(flat[::2], flat[1::2], strict=True)))

    async def track_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str, *, ttl_s: float
    ) -> bool:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        field, ms = call_field(request_id), _ms(ttl_s)
        return bool(
            await self._mcp("track MCP call", "track", user_id, session_id, field, job_id, ms)
        )

    async def untrack_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str
    ) -> None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        field = call_field(request_id)
        await self._mcp("untrack MCP call", "untrack", user_id, session_id, field, job_id)

    async def cancel_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int
    ) -> str | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        field = call_field(request_id)
        job = _text(
            await self._mcp("cancel MCP call", "cancel", user_id, session_id, field, MAX_FIELDS)
        )
        return None if job in (None, CANCELLED) else job


class MemoryMcpSessions:
    """The MCP session commands of ``MemorySubstrate`` (same contract, in process; the
    hashes live in its ``_hashes``: key -> (fields, expiry on ``anyio.current_time()``))."""

    def _mcp_hash(self, user_id: str, session_id: str, now: float) -> dict[str, str] | None:
        key = mcp_session_key(user_id, session_id)
        held = self._hashes.get(key)  # type: ignore[attr-defined]
        if held is None:
            return None
        if now >= held[1]:
            del self._hashes[key]  # type: ignore[attr-defined]
            return None
        fields: dict[str, str] = held[0]
        return fields

    def _mcp_raise(self, user_id: str, session_id: str, now: float, ttl_s: float) -> None:
        """``PEXPIRE ... GT`` on a live hash."""
        key = mcp_session_key(user_id, session_id)
        fields, until = self._hashes[key]  # type: ignore[attr-defined]
        self._hashes[key] = (fields, max(until, now + ttl_s))  # type: ignore[attr-defined]

    async def open_mcp_session(
        self, user_id: str, session_id: str, record: str, *, ttl_s: float
    ) -> None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        now = await self._enter_ttl(ttl_s)  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now) or {}
        fields[RECORD_FIELD] = record
        self._hashes[mcp_session_key(user_id, session_id)] = (fields, now + ttl_s)  # type: ignore[attr-defined]

    async def touch_mcp_session(self, user_id: str, session_id: str, *, ttl_s: float) -> str | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        now = await self._enter_ttl(ttl_s)  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now)
        record = None if fields is None else fields.get(RECORD_FIELD)
        if record is not None:
            self._mcp_raise(user_id, session_id, now, ttl_s)
        return record

    async def end_mcp_session(self, user_id: str, session_id: str) -> list[str] | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        now = await self._enter()  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now)
        if fields is None:
            return None
        del self._hashes[mcp_session_key(user_id, session_id)]  # type: ignore[attr-defined]
        return _jobs(fields)

    async def track_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str, *, ttl_s: float
    ) -> bool:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable, ValueError."""
        now = await self._enter_ttl(ttl_s)  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now)
        field = call_field(request_id)
        if fields is None or RECORD_FIELD not in fields or fields.get(field) == CANCELLED:
            return False
        fields[field] = job_id
        self._mcp_raise(user_id, session_id, now, ttl_s)
        return True

    async def untrack_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int, job_id: str
    ) -> None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        now = await self._enter()  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now)
        field = call_field(request_id)
        if fields is not None and fields.get(field) == job_id:
            del fields[field]

    async def cancel_mcp_call(
        self, user_id: str, session_id: str, request_id: str | int
    ) -> str | None:
        """See :class:`McpSessionSubstrate`. Raises SubstrateUnavailable."""
        now = await self._enter()  # type: ignore[attr-defined]
        fields = self._mcp_hash(user_id, session_id, now)
        if fields is None or RECORD_FIELD not in fields:
            return None
        field = call_field(request_id)
        job = fields.get(field)
        if job is None and len(fields) < MAX_FIELDS:
            fields[field] = CANCELLED
        return None if job in (None, CANCELLED) else job


__all__ = [
    "CANCELLED",
    "McpSessionSubstrate",
    "MemoryMcpSessions",
    "RedisMcpSessions",
    "call_field",
    "decode_record",
    "encode_record",
]
