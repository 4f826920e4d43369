"""The desktop directory: which desktops connected recently, for the admin API.

Presence stays the only truth for "online" (invariant 1): the directory is an index of
users to look presence up for, so an admin listing never scans keys. Two records per
user, written only when a session starts and ends (never per heartbeat), and again
when a heartbeat takes a session's lost presence back (Redis restarted empty):

* ``bridge:desktops`` - a sorted set, member = user id, score = the Unix time in ms of the
  user's last session start or end. Listing pages through it newest first (ZRANGE ...
  REV LIMIT), then reads the page's presence keys; 10,000 desktops cost one ZRANGE and
  one GET per listed row. Entries older than :data:`RETENTION_S` are removed at each
  session start (ZREMRANGEBYSCORE).
* ``bridge:desktop:{<user_id>}`` - JSON text: ``session_id``, ``sidecar_version``,
  ``consumer`` (the hub process), ``tools`` (names), ``connected_at``, and after the
  session ends ``ended_at`` and ``end`` (close code and reason); expires after
  :data:`RETENTION_S`.

A hub that dies without ending its sessions leaves ``ended_at`` unset; presence then
reads offline within ``presence_ttl_s`` and the listing says offline since "unknown"
(not later than the connection time). The writes are best effort: a failure is logged
and never ends a session.

A session writes the record only while no other session holds the desktop (presence
names it or nobody), and its end only over its own record: a hub process that was
stopped (SIGSTOP, a paused VM) long enough for its desktops to reconnect elsewhere ends
its old sessions when it resumes, and those late writes replaced the new sessions'
records (the listing named the stopped process as the holder, since null).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from ._errors import SubstrateUnavailable
from ._keys import asleep_key
from ._substrate import presence_key

log = logging.getLogger("deskbridge.hub.directory")

#: How long a desktop stays listed after its last session, seconds (one week).
RETENTION_S = 7 * 24 * 3600.0
#: Bound on each directory write at a session start or end, seconds.
WRITE_TIMEOUT_S = 2.0
INDEX_KEY = "bridge:desktops"


def desktop_key(user_id: str) -> str:
    return f"bridge:desktop:{{{user_id}}}"


@attrs.frozen
class DirectoryPage:
    """One page of the directory.

    Attributes:
        total: users listed in the directory (online or not).
        rows: ``(user_id, last change, Unix seconds)``, newest first.
    """

    total: int
    rows: tuple[tuple[str, float], ...]


# -- substrate mixins (the directory's commands on each substrate) --------------------


#: record_desktop's fenced write (``session_id`` given): SET the record unless presence
#: names another session, or (``ending``) the record is another session's. KEYS: record,
#: presence (one slot: the user's). ARGV: record, EX seconds, session id, "1" ending.
_RECORD_LUA = """
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[3] then return 0 end
if ARGV[4] == '1' then
  local current = redis.call('GET', KEYS[1])
  if current then
    local ok, record = pcall(cjson.decode, current)
    if ok and type(record) == 'table' and record.session_id ~= ARGV[3] then return 0 end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


@functools.cache
def _record_script() -> Any:
    """``_RECORD_LUA`` as a ``Script`` (imported here: ``_redis_base`` imports the
    substrate module, which imports this one)."""
    from ._redis_base import Script

    return Script(_RECORD_LUA, resend_safe=True)


def _fenced_out(holder: str | None, current: str | None, session_id: str, ending: bool) -> bool:
    """Whether ``_RECORD`` refuses the write (the memory substrate's copy of it)."""
    if holder is not None and holder != session_id:
        return True
    if not ending or current is None:
        return False
    try:
        record = json.loads(current)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("session_id") != session_id


class RedisDirectory:
    """Directory commands for ``RedisSubstrate`` (uses its session and call plumbing)."""

    async def record_desktop(
        self,
        user_id: str,
        info: str,
        *,
        at_s: float,
        session_id: str | None = None,
        ending: bool = False,
    ) -> None:
        """SET the desktop record (EX retention), ZADD the index, drop entries older
        than the retention; pipelined in one round trip. With ``session_id`` the record
        is written only while presence names that session or none, and an ``ending``
        write only over that session's own record (or none): a late write of an older
        session never replaces a newer one's (the index is touched either way).
        Raises SubstrateUnavailable."""
        at_ms = int(at_s * 1000)
        index = (
            (b"ZADD", INDEX_KEY, at_ms, user_id),
            (b"ZREMRANGEBYSCORE", INDEX_KEY, b"-inf", at_ms - int(RETENTION_S * 1000)),
        )
        async with self._session("record desktop") as s:  # type: ignore[attr-defined]
            if session_id is None:
                record = (b"SET", desktop_key(user_id), info, b"EX", int(RETENTION_S))
                replies = await s.execute(
                    record,
                    *index,
                    timeout_s=self._command_timeout_s,  # type: ignore[attr-defined]
                )
            else:
                keys = (desktop_key(user_id), presence_key(user_id))
                args = (info, int(RETENTION_S), session_id, b"1" if ending else b"0")
                replies = await self._script(  # type: ignore[attr-defined]
                    s, _record_script(), keys, args, after=index
                )
            raise_any(replies)  # inside the session: mapped to SubstrateUnavailable

    async def list_desktops(self, *, offset: int, limit: int) -> DirectoryPage:
        """ZCARD and ZRANGE REV WITHSCORES LIMIT offset limit of the index.
        Raises SubstrateUnavailable: Redis unreachable, or the last health probe found
        a command of the directory refused to this user (ACL; unsent, naming the grant:
        refused index writes leave a listing that answers, stale)."""
        refuses = self._refuses_view  # type: ignore[attr-defined]
        refused = refuses("directory", "the desktops directory")
        if refused is not None:
            raise refused
        async with self._session("list desktops") as s:  # type: ignore[attr-defined]
            total, raw = await s.execute(
                (b"ZCARD", INDEX_KEY),
                (b"ZRANGE", INDEX_KEY, b"+inf", b"-inf", b"BYSCORE", b"REV", b"LIMIT",
                 offset, limit, b"WITHSCORES"),
                timeout_s=self._command_timeout_s,  # type: ignore[attr-defined]
            )  # fmt: skip
            raise_any((total, raw))
        return DirectoryPage(int(total), tuple(scored_pairs(raw)))

    async def desktops_info(
        self, user_ids: Sequence[str]
    ) -> list[tuple[str | None, str | None, str | None, str | None]]:
        """For each user: (presence holder, desktop record, catalogue, asleep record),
        pipelined GETs. Raises SubstrateUnavailable."""
        if not user_ids:
            return []
        from ._substrate import tools_key

        commands = []
        for user_id in user_ids:
            commands += [
                (b"GET", presence_key(user_id)),
                (b"GET", desktop_key(user_id)),
                (b"GET", tools_key(user_id)),
                (b"GET", asleep_key(user_id)),
            ]
        async with self._session("desktops info") as s:  # type: ignore[attr-defined]
            replies = await s.execute(
                *commands,
                timeout_s=self._command_timeout_s,  # type: ignore[attr-defined]
            )
            raise_any(replies)
        rows = [tuple(_text(r) for r in replies[i : i + 4]) for i in range(0, len(replies), 4)]
        return rows  # type: ignore[return-value]


class MemoryDirectory:
    """Directory commands for ``MemorySubstrate`` (same contract, in process)."""

    async def record_desktop(
        self,
        user_id: str,
        info: str,
        *,
        at_s: float,
        session_id: str | None = None,
        ending: bool = False,
    ) -> None:
        now = await self._enter()  # type: ignore[attr-defined]
        index = memory_scores(self, "_directory_index")
        index[user_id] = at_s
        for user, when in list(index.items()):
            if when < at_s - RETENTION_S:
                del index[user]
        get = self._get  # type: ignore[attr-defined]
        if session_id is not None and _fenced_out(
            get(presence_key(user_id), now), get(desktop_key(user_id), now), session_id, ending
        ):
            return
        self._set(desktop_key(user_id), info, now, RETENTION_S)  # type: ignore[attr-defined]

    async def list_desktops(self, *, offset: int, limit: int) -> DirectoryPage:
        await self._enter()  # type: ignore[attr-defined]
        index = memory_scores(self, "_directory_index")
        rows = sorted(index.items(), key=lambda kv: (-kv[1], kv[0]))
        return DirectoryPage(len(rows), tuple(rows[offset : offset + limit]))

    async def desktops_info(
        self, user_ids: Sequence[str]
    ) -> list[tuple[str | None, str | None, str | None, str | None]]:
        from ._substrate import tools_key

        now = await self._enter()  # type: ignore[attr-defined]
        get = self._get  # type: ignore[attr-defined]
        return [
            (
                get(presence_key(u), now),
                get(desktop_key(u), now),
                get(tools_key(u), now),
                get(asleep_key(u), now),
            )
            for u in user_ids
        ]


def memory_scores(substrate: Any, name: str) -> dict[str, float]:
    """A ``MemorySubstrate``'s sorted set ``name`` (member -> score), made on first use
    (the directory's index, the revocations' index)."""
    index = substrate.__dict__.get(name)
    if index is None:
        index = substrate.__dict__[name] = {}
    typed: dict[str, float] = index
    return typed


def raise_any(replies: Sequence[Any]) -> None:
    """Raise the first exception among pipelined ``replies``."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def scored_pairs(raw: Any) -> list[tuple[str, float]]:
    """A ZRANGE ... WITHSCORES reply (RESP2 or RESP3) as ``(member, score / 1000)``:
    scores are Unix milliseconds, returned as seconds."""
    if raw and isinstance(raw[0], list | tuple):  # RESP3: [[member, score], ...]
        return [(_text(m) or "", float(sc) / 1000) for m, sc in raw]
    return [(_text(raw[i]) or "", float(raw[i + 1]) / 1000) for i in range(0, len(raw), 2)]


# -- session hooks -----------------------------------------------------------------------

#: The record of each session of this process that is open, by session id.
_open: dict[str, dict[str, Any]] = {}


async def connected(session: Any) -> None:
    """Record a session start (best effort, bounded by :data:`WRITE_TIMEOUT_S`)."""
    hello = session.hello
    info = {
        "session_id": session.session_id,
        "sidecar_version": getattr(hello, "sidecar_version", None),
        "tools": [t.name for t in getattr(hello, "tools", ()) or ()],
        "consumer": session.state.consumer,
        "connected_at": session.state.wall_clock(),
    }
    _open[session.session_id] = info
    await _write(session, info)


async def recorded_again(session: Any) -> None:
    """Write an open session's record again (best effort, bounded): a beat found its
    presence gone, so Redis may have lost the directory too (restarted empty), and the
    admin listing said "none of 0 desktops" while desktops were online."""
    info = _open.get(session.session_id)
    if info is not None:
        await _write(session, info)


async def disconnected(session: Any, code: int | None, reason: str | None) -> None:
    """Record a session end with its close code and reason (best effort, shielded)."""
    info = _open.pop(session.session_id, None)
    if info is None:
        return
    info.update(ended_at=session.state.wall_clock(), end={"code": code, "reason": reason})
    with trio.CancelScope(shield=True):
        await _write(session, info, ending=True)


async def _write(session: Any, info: dict[str, Any], *, ending: bool = False) -> None:
    substrate = session.state.substrate
    if not hasattr(substrate, "record_desktop"):
        return  # a test's substrate without the directory
    with trio.move_on_after(WRITE_TIMEOUT_S):
        try:
            at_s = info.get("ended_at") or info["connected_at"]
            await substrate.record_desktop(
                session.user_id,
                json.dumps(info),
                at_s=at_s,
                session_id=session.session_id,
                ending=ending,
            )
        except SubstrateUnavailable as exc:
            log.info("directory not updated for %s: %s", session.user_id, exc)
