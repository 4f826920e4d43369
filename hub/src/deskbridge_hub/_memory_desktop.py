"""What a desktop says about itself, in ``MemorySubstrate`` (mixed in): the daemon
record and the instant takeover it allows, and the asleep record (contract:
``_substrate.DesktopSubstrate``), with the semantics of ``_redis_desktop``'s script."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ._memory_streams import StreamID, _format_id, _Stream
from ._substrate import Asleep, Claimed, Entry, asleep_key

#: The record's value for a consumer whose deliveries went to an unknown daemon, or to
#: more than one.
UNKNOWN_DAEMON = "?"


class MemoryDesktopCommands:
    """Daemon record, takeover and asleep methods of ``MemorySubstrate``."""

    _streams: dict[str, _Stream]
    _kv: dict[str, tuple[str, float]]
    _daemon_records: dict[str, tuple[dict[str, str], float]]
    _index: dict[str, dict[StreamID, str]]
    _enter: Callable[[], Any]
    _get: Callable[[str, float], str | None]
    _set: Callable[[str, str, float, float | None], None]
    _reply: Callable[[_Stream, StreamID], Entry]

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
        """See :meth:`DesktopSubstrate.take_over` (one step: no checkpoint inside).

        Raises:
            ValueError: ``count`` < 1 or ``record_ttl_s`` not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        if count < 1 or not record_ttl_s > 0:
            raise ValueError("take_over needs count >= 1 and record_ttl_s > 0")
        if self._get(f"bridge:presence:{{{user_id}}}", now) != session_id:
            return Claimed("0-0", (), ())
        held = self._daemon_records.get(user_id)
        record = {} if held is None or now >= held[1] else held[0]
        stream = self._streams.get(user_id)
        claimed: list[Entry] = []
        deleted: list[str] = []
        mine = 0
        if stream is not None:
            by_consumer: dict[str, list[StreamID]] = {}
            for sid in sorted(stream.pel):
                by_consumer.setdefault(stream.pel[sid].consumer, []).append(sid)
            mine = len(by_consumer.get(consumer, ()))
            for name, sids in by_consumer.items():
                if name == consumer or daemon_id is None or record.get(name) != daemon_id:
                    continue
                taken = sids[: count - len(claimed) - len(deleted)]
                for sid in taken:
                    if sid not in stream.entries:  # XCLAIM drops a body-less entry
                        del stream.pel[sid]
                        deleted.append(_format_id(sid))
                        continue
                    nack = stream.pel[sid]
                    nack.consumer, nack.delivery_time = consumer, now
                    nack.delivery_count += 1
                    claimed.append(self._reply(stream, sid))
                if len(taken) == len(sids):
                    record.pop(name, None)
            if claimed or deleted:
                stream.seen[consumer] = now
            for name in [n for n in record if n not in stream.seen and n != consumer]:
                del record[name]  # consumer gone from the group
        same = daemon_id is not None and record.get(consumer) == daemon_id
        lost = again and consumer not in record  # every delivery since went to us
        mixed = daemon_id is None or (not same and not lost and mine > 0)
        record[consumer] = UNKNOWN_DAEMON if mixed else str(daemon_id)
        self._daemon_records[user_id] = (record, now + record_ttl_s)
        quiet = not self._index.get(user_id) and (
            stream is None
            or (
                not stream.pel
                and stream.max_deleted <= stream.last_delivered  # else Redis has no lag
                and all(sid <= stream.last_delivered for sid in stream.entries)
            )
        )
        return Claimed("0-0", tuple(claimed), tuple(deleted), quiet)

    async def set_asleep(self, user_id: str, asleep: Asleep, *, ttl_s: float) -> None:
        """SET ``bridge:asleep:{user_id}`` PX ttl_s.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            SubstrateUnavailable: marked unavailable.
        """
        now = await self._enter()
        self._set(asleep_key(user_id), encode_asleep(asleep), now, ttl_s)

    async def get_asleep(self, user_id: str) -> Asleep | None:
        """GET ``bridge:asleep:{user_id}``. Raises SubstrateUnavailable when marked so."""
        return decode_asleep(self._get(asleep_key(user_id), await self._enter()))

    async def clear_asleep(self, user_id: str) -> None:
        """DEL ``bridge:asleep:{user_id}``. Raises SubstrateUnavailable when marked so."""
        await self._enter()
        self._kv.pop(asleep_key(user_id), None)


def encode_asleep(asleep: Asleep) -> str:
    """The stored text of ``asleep`` (both substrates)."""
    return json.dumps({"since": asleep.since, "source": asleep.source}, separators=(",", ":"))


def decode_asleep(text: str | None) -> Asleep | None:
    """The :class:`Asleep` of a stored text, or None (absent, or not one: then the
    desktop simply reads ``offline``)."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        since, source = float(data["since"]), str(data["source"])
    except (ValueError, TypeError, KeyError):
        return None
    return Asleep(since, source) if math.isfinite(since) else None
