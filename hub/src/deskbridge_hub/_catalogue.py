"""The caller's cached copy of each desktop's tool catalogue (issue 10 item 3).

The caller validates a call's tool and arguments against the catalogue it has cached and
sends the catalogue's SHA-1 with the job; the enqueue script compares it with the SHA-1
of the catalogue in Redis (``bridge:tools:{<user_id>}``, rewritten by the holder's
heartbeat) and enqueues only if they match. Otherwise it returns the current catalogue,
which replaces the cached one, and the call is validated and submitted again. So a
catalogue costs no round trip while it is unchanged, and a call is never enqueued after
being validated against a catalogue the desktop no longer offers. No I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import BadRequest
from ._schema import args_checker

#: Users whose catalogue one process keeps (least recently used ones are dropped).
MAX_CACHED_USERS = 10_000


@attrs.frozen
class KnownCatalogue:
    """One user's catalogue as last seen.

    Attributes:
        sha1: SHA-1 (hex) of the stored JSON text, "" when the desktop announced none.
        checkers: tool name -> compiled args check; None when there is no catalogue
            (an old sidecar: nothing is checked).
    """

    sha1: str
    checkers: dict[str, Callable[[dict[str, Any]], str | None]] | None

    @classmethod
    def parse(cls, text: str | None) -> KnownCatalogue:
        """From the stored JSON text (None or an empty array: no catalogue)."""
        if text is None:
            return cls("", None)
        sha1 = hashlib.sha1(text.encode("utf-8")).hexdigest()
        try:
            tools = json.loads(text)
        except ValueError:
            return cls(sha1, None)
        if not tools or not isinstance(tools, list):
            return cls(sha1, None)
        return cls(
            sha1,
            {t["name"]: args_checker(t.get("args_schema") or {}) for t in tools if "name" in t},
        )

    def problem(self, name: str, args: dict[str, Any]) -> BadRequest | None:
        """Why this catalogue refuses the call (unknown tool, args failing its schema),
        or None."""
        if self.checkers is None:
            return None
        check = self.checkers.get(name)
        if check is None:
            offers = ", ".join(sorted(self.checkers))
            return BadRequest(
                f"the desktop offers no tool {name!r} (it offers: {offers})", field="name"
            )
        message = check(args)
        if message is not None:
            return BadRequest(f"args do not match the schema of {name!r}: {message}", field="args")
        return None


@attrs.define(eq=False)
class CatalogueCache:
    """Per process: user id -> :class:`KnownCatalogue`, least recently used dropped."""

    max_users: int = MAX_CACHED_USERS
    _known: OrderedDict[str, KnownCatalogue] = attrs.Factory(OrderedDict)

    def get(self, user_id: str) -> KnownCatalogue | None:
        known = self._known.get(user_id)
        if known is not None:
            self._known.move_to_end(user_id)
        return known

    def put(self, user_id: str, text: str | None) -> KnownCatalogue:
        known = KnownCatalogue.parse(text)
        self._known[user_id] = known
        self._known.move_to_end(user_id)
        while len(self._known) > self.max_users:
            self._known.popitem(last=False)
        return known
