"""State shared by every session of one hub process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from deskbridge_common import Timings

from ._shutdown import Draining
from ._substrate import Substrate

if TYPE_CHECKING:
    from ._session import HubSession


@attrs.define(eq=False)
class HubState:
    """Process-wide state shared by every session in this hub process.

    Attributes:
        substrate: the shared substrate.
        timings: timing knobs.
        consumer: this process's consumer name in group ``bridge-workers`` (unique per
            process).
        wall_clock: Unix time source (deadlines).
        max_inflight_per_session: most unanswered deliveries per socket.
        inflight: per user, entry IDs being served in this process right now.
        sessions: the open sessions of this process, by session id.
        drain: graceful shutdown: whether it began, and the requests waiting.
    """

    substrate: Substrate
    timings: Timings
    consumer: str
    wall_clock: Callable[[], float]
    max_inflight_per_session: int = 32
    inflight: dict[str, set[str]] = attrs.field(factory=dict)
    sessions: dict[str, HubSession] = attrs.field(factory=dict)
    drain: Draining = attrs.field(factory=Draining)
