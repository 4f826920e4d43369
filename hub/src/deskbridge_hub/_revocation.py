"""Revoking one user's sidecar tokens: "every token of user U issued before T is refused"
(docs/security.md; the design and its cost: docs/architecture.md, "Token revocation").

Tokens carry ``sub``, ``iat`` and ``exp`` and no id of their own, and a user holds one
token per desktop, re-issued by ``deskbridge-hub token``: a cut-off on ``iat`` per user
revokes every token a stolen laptop could hold at once, and a token issued after it
works. The record outlives any token it refuses (no TTL; a later revocation replaces it).

Where it is checked, and what it costs:

* **at the handshake**, after the token verified and before the upgrade: one GET of
  ``bridge:revoked:{<user_id>}``. A revoked token is refused with HTTP 401, which makes
  the sidecar stop (as for an expired one); the store unreachable: 503 (retried).
* **a live session**: ``revoke_user`` (the CLI) reads presence in the same write and
  pushes a :class:`Revoked` notice onto the holder process's wake list, which that
  process already pops (``_reader``): it closes its sessions of the user whose token's
  ``iat`` is earlier with 4003 and the reason :data:`REVOKED_REASON`, at once.
* **the safety net** (a lost notice, a handshake that read the record just before it
  was written): every hub process reads the index of recent revocations
  (``bridge:revocations``, a sorted set by cut-off) once per heartbeat, one command for
  the whole process (:class:`RevocationWatch`), and applies what it finds to its own
  sessions. Nothing is read per desktop on the idle path, nor on the call path.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from ._directory import memory_scores, raise_any, scored_pairs
from ._errors import SubstrateUnavailable
from ._keys import REVOCATIONS_KEY, holder_of, presence_key, revoked_key
from ._substrate_values import Revocation, Revoked

log = logging.getLogger("deskbridge.hub.revocation")

#: The close reason of a session whose token was revoked (close code 4003, the code of
#: a token whose lifetime ended: the sidecar reconnects, is refused 401 and stops).
REVOKED_REASON = "token revoked; issue a new one"
#: How far back each process's sweep looks, seconds (by the cut-off, on the hub's clock):
#: covers a notice lost and clocks of the revoking machine and the hub up to 10 min apart.
SWEEP_WINDOW_S = 600.0
#: Index entries older than this (seconds before the newest cut-off) are dropped at each
#: revocation: the sweep never looks that far back; the per-user records stay.
INDEX_RETENTION_S = 86_400.0


class RevocationSubstrate(Protocol):
    """The store's part (``MemoryRevocations``, ``RedisRevocations``; contract checks in
    ``_contract_revoke``). Every method raises ``SubstrateUnavailable`` when the store
    cannot be reached."""

    async def revoke_tokens(
        self, user_id: str, revocation: Revocation
    ) -> tuple[str | None, Revocation]:
        """Write ``bridge:revoked:{user_id}`` (no TTL) unless the record there has a
        cut-off at least as late (:data:`KEEP_LATER`: a second revocation made on a
        clock behind the first's must not let the tokens it refused back in), ZADD the
        index with ``GT`` (score: the cut-off in ms), drop index entries older than
        ``INDEX_RETENTION_S`` before it, and GET the user's presence, in one round
        trip. Returns the session presence names (or None) and the record in force
        (``revocation``, or the later one kept)."""

    async def get_revocation(self, user_id: str) -> Revocation | None:
        """GET ``bridge:revoked:{user_id}``, decoded; None if absent."""

    async def recent_revocations(self, *, since_s: float) -> list[tuple[str, float]]:
        """``(user_id, cut-off)`` of every indexed revocation whose cut-off is at or
        after ``since_s`` (Unix seconds): ZRANGE BYSCORE, one command."""

    async def notify_revoked(
        self, holder_id: str, user_id: str, before_s: float, *, ttl_s: float
    ) -> None:
        """RPUSH onto ``bridge:wake:{holder_id}`` a notice that ``user_id``'s tokens
        issued before ``before_s`` are revoked (:class:`Revoked` from ``wait_wakes``),
        and PEXPIRE it ``ttl_s`` (one round trip)."""


#: The record's write: SET KEYS[1] = ARGV[1] unless the stored record's cut-off is at
#: least ARGV[2] (a record that does not decode is replaced: the operator revoking now
#: asks for "refused up to now", which it says); returns the record in force. Found with
#: faketime: a second ``revoke`` on a clock 10 min behind replaced the first's record and
#: a token the first had refused connected again.
KEEP_LATER = """
local old = redis.call('GET', KEYS[1])
if old then
  local ok, rec = pcall(cjson.decode, old)
  if ok and type(rec) == 'table' then
    local before = tonumber(rec['before'])
    if before and before >= tonumber(ARGV[2]) then return old end
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


@functools.cache
def _keep_later() -> Any:
    """:data:`KEEP_LATER` as a ``_redis_base.Script`` (imported here: ``_redis_base``
    imports the substrate module, which imports this one). Safe to run twice."""
    from ._redis_base import Script

    return Script(KEEP_LATER, resend_safe=True)


def keeps(stored: Revocation | None, new: Revocation) -> bool:
    """True if ``stored`` stays in force against ``new`` (its cut-off is at least as
    late): :data:`KEEP_LATER`'s rule, for the in-memory substrate. A record that did not
    decode (cut-off +inf) is replaced, as the script does."""
    return stored is not None and math.isfinite(stored.before_s) and (
        stored.before_s >= new.before_s
    )


class RedisRevocations:
    """Revocation commands of ``RedisSubstrate`` (uses its session and call plumbing)."""

    async def revoke_tokens(
        self, user_id: str, revocation: Revocation
    ) -> tuple[str | None, Revocation]:
        """See :class:`RevocationSubstrate` (under Cluster the index is written to its
        own slot in the same write). Raises SubstrateUnavailable."""
        before_ms = int(revocation.before_s * 1000)
        oldest_ms = before_ms - int(INDEX_RETENTION_S * 1000)
        async with self._session("revoke tokens") as s:  # type: ignore[attr-defined]
            replies = await self._script(  # type: ignore[attr-defined]
                s,
                _keep_later(),
                [revoked_key(user_id)],
                [revocation.encode(), repr(revocation.before_s)],
                after=(
                    (b"ZADD", REVOCATIONS_KEY, b"GT", before_ms, user_id),
                    (b"ZREMRANGEBYSCORE", REVOCATIONS_KEY, b"-inf", f"({oldest_ms}"),
                    (b"GET", presence_key(user_id)),
                ),
            )
            raise_any(replies)  # inside the session: mapped to SubstrateUnavailable
        kept = Revocation.decode(replies[0]) or revocation
        holder = replies[3]
        return (holder.decode() if isinstance(holder, bytes) else holder), kept

    async def get_revocation(self, user_id: str) -> Revocation | None:
        """GET the record. Raises SubstrateUnavailable."""
        async with self._session("GET revocation") as s:  # type: ignore[attr-defined]
            raw = await self._call(s, b"GET", revoked_key(user_id))  # type: ignore[attr-defined]
        return Revocation.decode(raw)

    async def recent_revocations(self, *, since_s: float) -> list[tuple[str, float]]:
        """ZRANGE the index BYSCORE from ``since_s``. Raises SubstrateUnavailable."""
        since_ms = math.ceil(since_s * 1000)
        async with self._session("ZRANGE revocations") as s:  # type: ignore[attr-defined]
            raw = await self._call(  # type: ignore[attr-defined]
                s, b"ZRANGE", REVOCATIONS_KEY, since_ms, b"+inf", b"BYSCORE", b"WITHSCORES"
            )
        return scored_pairs(raw)

    async def notify_revoked(
        self, holder_id: str, user_id: str, before_s: float, *, ttl_s: float
    ) -> None:
        """As ``wake``, with the notice (JSON ``{"revoked": before_s, "user": user_id}``)
        as the item. Raises ValueError (``ttl_s`` not positive), SubstrateUnavailable."""
        notice = Revoked(user_id, before_s)
        await self._push_wake("RPUSH revoked", holder_id, encode_notice(notice), ttl_s)  # type: ignore[attr-defined]


def encode_notice(notice: Revoked) -> str:
    """The wake list item of ``notice`` (``_redis_presence._wake_item`` decodes it)."""
    import json

    return json.dumps({"revoked": notice.before_s, "user": notice.user_id})


#: The index's attribute on a ``MemorySubstrate`` (``_directory.memory_scores``).
_MEMORY_INDEX = "_revocation_index"


class MemoryRevocations:
    """Revocation commands of ``MemorySubstrate`` (same contract, in process)."""

    async def revoke_tokens(
        self, user_id: str, revocation: Revocation
    ) -> tuple[str | None, Revocation]:
        """See :class:`RevocationSubstrate`. Raises SubstrateUnavailable."""
        now = await self._enter()  # type: ignore[attr-defined]
        stored = Revocation.decode(self._get(revoked_key(user_id), now))  # type: ignore[attr-defined]
        kept = stored if stored is not None and keeps(stored, revocation) else revocation
        if kept is revocation:
            self._set(revoked_key(user_id), revocation.encode(), now, None)  # type: ignore[attr-defined]
        index = memory_scores(self, _MEMORY_INDEX)
        score = float(int(revocation.before_s * 1000)) / 1000
        index[user_id] = max(score, index.get(user_id, score))  # ZADD GT
        oldest_s = revocation.before_s - INDEX_RETENTION_S
        for user, before_s in list(index.items()):
            if before_s < oldest_s:
                del index[user]
        holder: str | None = self._get(presence_key(user_id), now)  # type: ignore[attr-defined]
        return holder, kept

    async def get_revocation(self, user_id: str) -> Revocation | None:
        """The record. Raises SubstrateUnavailable."""
        now = await self._enter()  # type: ignore[attr-defined]
        return Revocation.decode(self._get(revoked_key(user_id), now))  # type: ignore[attr-defined]

    async def recent_revocations(self, *, since_s: float) -> list[tuple[str, float]]:
        """The index from ``since_s``, by cut-off. Raises SubstrateUnavailable."""
        await self._enter()  # type: ignore[attr-defined]
        rows = sorted(
            memory_scores(self, _MEMORY_INDEX).items(), key=lambda kv: (kv[1], kv[0])
        )
        return [(user, before_s) for user, before_s in rows if before_s >= since_s]

    async def notify_revoked(
        self, holder_id: str, user_id: str, before_s: float, *, ttl_s: float
    ) -> None:
        """Append a :class:`Revoked` notice to the holder's wake list (as ``wake``).
        Raises ValueError (``ttl_s`` not positive), SubstrateUnavailable."""
        now = await self._enter_ttl(ttl_s)  # type: ignore[attr-defined]
        self._wake_now(holder_id, Revoked(user_id, before_s), now, ttl_s)  # type: ignore[attr-defined]


# -- the operator's step -------------------------------------------------------------------


@attrs.frozen
class Revoking:
    """What :func:`revoke_user` did.

    Attributes:
        revocation: the record in force: the one asked for, or a stored one whose
            cut-off is later (kept: a revocation never lets a refused token back in).
        holder: the session presence named when it was written, or None.
        notified: its process was told (False: nobody held presence, the session id
            names no process, or the notice could not be written: the sweep closes it
            within a heartbeat).
        asked: the record this call asked for (its cut-off is on the caller's clock).
    """

    revocation: Revocation
    holder: str | None
    notified: bool
    asked: Revocation

    @property
    def kept_later(self) -> bool:
        """A stored revocation with a later cut-off was kept (the caller's clock may be
        behind the one that made it)."""
        return self.revocation.before_s > self.asked.before_s


def cut_off(now_s: float) -> float:
    """The cut-off of a revocation made at ``now_s``: the next whole second. ``iat`` is
    whole seconds, so every token issued up to the revoking second is refused, and one
    issued from the next second on is not."""
    return float(math.floor(now_s) + 1)


async def revoke_user(
    substrate: Any, user_id: str, *, now_s: float, notice_ttl_s: float = 90.0
) -> Revoking:
    """Revoke every token of ``user_id`` issued up to ``now_s`` (see :func:`cut_off`;
    a stored revocation with a later cut-off stays in force), and tell the process
    holding the user's session, if any.

    Args:
        substrate: the shared substrate (a :class:`RevocationSubstrate`).
        user_id: whose tokens (validated by the caller).
        now_s: the revoking machine's wall clock, Unix seconds.
        notice_ttl_s: how long the notice may wait in the holder's wake list, seconds
            (the presence TTL: a wake list's TTL is set again by every push).

    Raises:
        SubstrateUnavailable: the record could not be written (nothing was revoked). A
            failed notice is not raised: ``notified`` says so.

    Cancellation: the record may or may not have been written.
    """
    asked = Revocation(before_s=cut_off(now_s), at_s=now_s)
    holder, revocation = await substrate.revoke_tokens(user_id, asked)
    process = holder_of(holder) if holder else None
    notified = False
    if process is not None:
        try:
            await substrate.notify_revoked(
                process, user_id, revocation.before_s, ttl_s=notice_ttl_s
            )
            notified = True
        except SubstrateUnavailable as exc:
            log.warning("could not tell %s's process of the revocation: %s", user_id, exc)
    return Revoking(revocation, holder, notified, asked)


# -- the hub process's side ----------------------------------------------------------------


@attrs.define(eq=False)
class RevocationWatch:
    """Applies revocations to this process's sessions: at once for a :class:`Revoked`
    notice (the wake-up loop hands it here), and from the index once per ``interval_s``
    (the safety net: one command per process, see the module docstring).

    Attributes:
        substrate: the shared substrate.
        interval_s: seconds between sweeps (the heartbeat).
        wall_clock: Unix time (the sweep's window is on it).
        on_revoked: called with ``(user_id, cut-off)``; closes the sessions of that user
            whose token was issued earlier (``HubState.revoke_sessions``). Must not block.
    """

    substrate: Any
    interval_s: float
    wall_clock: Callable[[], float]
    on_revoked: Callable[[str, float], object]

    def notice(self, notice: Revoked) -> None:
        """A notice popped from this process's wake list."""
        self.on_revoked(notice.user_id, notice.before_s)

    async def sweep(self) -> None:
        """Read the recent revocations once and apply them.

        Raises:
            SubstrateUnavailable: the index could not be read.
        """
        since_s = self.wall_clock() - SWEEP_WINDOW_S
        for user_id, before_s in await self.substrate.recent_revocations(since_s=since_s):
            self.on_revoked(user_id, before_s)

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled (a failed sweep is tried again at
        the next one)."""
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.sweep()
            except SubstrateUnavailable as exc:
                log.debug("revocation sweep failed: %s", exc)


async def refusal(substrate: Any, user_id: str, issued_at: float | None) -> Revocation | None:
    """The handshake's check: the user's revocation if it refuses a token issued at
    ``issued_at`` (None: the token has no ``iat``), else None. One read.

    Raises:
        SubstrateUnavailable: the record could not be read.
    """
    revocation: Revocation | None = await substrate.get_revocation(user_id)
    if revocation is not None and revocation.refuses(issued_at):
        return revocation
    return None
