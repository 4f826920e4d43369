"""The desktop's part of the substrate contract (issue 12), split out of ``_substrate``
(which composes it into ``Substrate``): the daemon record and the instant takeover it
allows, and the asleep record. Implemented by ``_memory_desktop`` and ``_redis_desktop``;
checked by ``_contract_desktop``. Every method raises ``SubstrateUnavailable`` when the
store cannot be reached (as the whole contract does)."""

from __future__ import annotations

from typing import Protocol

from ._keys import asleep_key as asleep_key
from ._keys import daemons_key as daemons_key
from ._substrate_values import Asleep as Asleep
from ._substrate_values import Claimed


class DesktopSubstrate(Protocol):
    """What a desktop says about itself (issue 12): which daemon instance it is (the
    record of where a user's deliveries went, and the instant takeover it allows) and
    whether it went to sleep. Keys in the user's slot: ``bridge:daemons:{<user_id>}``
    (hash: consumer -> daemon id, ``?`` when unknown or mixed),
    ``bridge:asleep:{<user_id>}`` (``Asleep`` as JSON, with a TTL)."""

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
        """At a session's start, in one atomic step in the user's slot: if presence is
        still ``session_id``, XCLAIM (min idle 0) for ``consumer`` up to ``count``
        entries pending on *other* consumers whose record names ``daemon_id`` (their
        deliveries went to this very daemon, whose socket there is gone since it is
        here now); then record ``consumer`` -> ``daemon_id`` (or ``?`` when
        ``daemon_id`` is None, or when ``consumer`` still has entries pending that
        went to another daemon), drop the records of consumers taken over completely
        or gone from the group, and PEXPIRE the record ``record_ttl_s``.

        ``again``: the same step for a session that is already running, whose beat
        found presence lost and wrote it back (Redis lost its data, or the key was
        evicted): the record may have gone with it. A ``consumer`` with no record left
        is then recorded as ``daemon_id``'s even with entries pending: every delivery
        on it since the record was written went to this session (its process delivers
        a user's entries only to its current session of that user), and none older
        outlived a loss that took the record. A consumer still recorded keeps the
        start's rule (``?`` stays ``?``).

        Returns:
            ``Claimed("0-0", entries, deleted_ids)``: the entries now ours (delivery
            count + 1), and the IDs whose body is gone (removed from the pending
            entries list, as XCLAIM does). Nothing when presence is not ours.
        """

    async def set_asleep(self, user_id: str, asleep: Asleep, *, ttl_s: float) -> None:
        """SET ``bridge:asleep:{user_id}`` = ``asleep`` PX ttl_s."""

    async def get_asleep(self, user_id: str) -> Asleep | None:
        """GET ``bridge:asleep:{user_id}``, decoded; None if absent or not decodable."""

    async def clear_asleep(self, user_id: str) -> None:
        """DEL ``bridge:asleep:{user_id}`` (a session started: the desktop is awake)."""
