"""Which command batches may be sent once more when the connection they went out on is
found dead (``_redis_session``: a reused connection answers "connection lost").

A dead connection does not say whether Redis ran what it carried: Redis may have read
and run the command and lost only the reply (a ``CLIENT KILL`` racing the command, a
proxy cutting after forwarding it, Redis crashing after an AOF-fsynced write). So a
batch is sent once more only when running it twice gives the same effect and an answer
as true as the first: reads, writes that set a value (``SET`` without ``NX``/``XX``/
``GET``, ``DEL``, ``PEXPIRE``), and the scripts registered here as safe to run twice
(:func:`resend_safe_script`). Everything else (the submit script, claims with ``NX``,
pops and group reads, pushes, XADD, the heartbeat and delivery-marking scripts) comes
back as the lost connection's error, which the command layer turns into
``SubstrateUnavailable``: the caller's own recovery runs (the wake-up loop drains every
attached user, a waiter looks at its result list, the reader drains the user's pending
entries, a submit in doubt is answered ``unavailable`` with its job id).

Pops are not resent although resending one adds no harm of its own: an item the first
pop took is lost with its reply either way, and a resend that succeeds hides the loss
from the recovery that the error starts. The table is docs/architecture.md's
"Sent once more on a new connection" in code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

#: Commands that give the same effect and an answer as true when run twice.
_SAFE = frozenset(
    {
        b"GET", b"MGET", b"EXISTS", b"TYPE", b"TTL", b"PTTL", b"STRLEN",
        b"LINDEX", b"LRANGE", b"LLEN",
        b"HGET", b"HMGET", b"HGETALL", b"HLEN", b"HEXISTS",
        b"XRANGE", b"XREVRANGE", b"XLEN", b"XINFO", b"XPENDING",
        b"PING", b"TIME", b"INFO", b"ROLE", b"ECHO", b"DBSIZE",
        b"DEL", b"UNLINK", b"PEXPIRE", b"EXPIRE", b"PEXPIREAT", b"EXPIREAT", b"PERSIST",
        # CREATE again answers BUSYGROUP, which every caller takes as "exists"
        b"XGROUP",
        b"MULTI", b"EXEC",
    }
)  # fmt: skip
#: ``SET`` options that make its reply or effect depend on what was there before.
_SET_CONDITIONAL = frozenset({b"NX", b"XX", b"GET"})
#: SHA-1s of the scripts registered as safe to run twice.
_SAFE_SCRIPTS: set[str] = set()


def resend_safe_script(text: str) -> str:
    """Register the Lua script ``text`` as safe to run twice (a second run, after a first
    whose reply was lost, has the first's effect and answers as truly). Returns ``text``."""
    _SAFE_SCRIPTS.add(hashlib.sha1(text.encode("utf-8")).hexdigest())
    return text


def _bytes(value: Any) -> bytes:
    return (value if isinstance(value, bytes) else str(value).encode()).upper()


def _command_safe(command: tuple[Any, ...]) -> bool:
    name = _bytes(command[0])
    if name == b"SET":
        return not any(_bytes(arg) in _SET_CONDITIONAL for arg in command[3:])
    if name == b"EVALSHA":
        return str(command[1]).lower() in _SAFE_SCRIPTS
    if name == b"EVAL":
        text = command[1]
        raw = text if isinstance(text, bytes) else str(text).encode("utf-8")
        return hashlib.sha1(raw).hexdigest() in _SAFE_SCRIPTS
    return name in _SAFE


def resend_safe(commands: Iterable[tuple[Any, ...]]) -> bool:
    """Whether every command of a batch may run twice (see the module docstring)."""
    return all(_command_safe(command) for command in commands)


__all__ = ["resend_safe", "resend_safe_script"]
