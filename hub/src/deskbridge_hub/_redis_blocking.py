"""Which Redis commands block their connection, for how long, and their polling form.

Pure functions over a command tuple (``(b"BLPOP", key, "1.500")``); no I/O. The
connection layer (``_redis_conn``) uses them to send blocking commands on dedicated
connections (a blocking command stalls every later command on its connection: Redis
serves one connection's commands in order) and, when every dedicated connection is busy,
to poll with the command's non-blocking form instead of opening more connections.

Block times follow the Redis command reference: BLPOP / BRPOP / BLMPOP / BZPOPMIN /
BZPOPMAX / BZMPOP / BLMOVE / BRPOPLPUSH take a timeout in seconds (decimal, 0 = forever),
XREAD / XREADGROUP take ``BLOCK milliseconds`` (0 = forever), WAIT / WAITAOF take
milliseconds as their last argument.
"""

from __future__ import annotations

import math
from typing import Any

#: Commands whose blocking timeout (seconds) is their last argument.
_TIMEOUT_LAST = frozenset({b"BLPOP", b"BRPOP", b"BZPOPMIN", b"BZPOPMAX", b"BLMOVE", b"BRPOPLPUSH"})
#: Commands whose blocking timeout (seconds) is their first argument.
_TIMEOUT_FIRST = frozenset({b"BLMPOP", b"BZMPOP"})
#: Commands that block only with a ``BLOCK ms`` option.
_BLOCK_OPTION = frozenset({b"XREAD", b"XREADGROUP"})
#: Commands whose timeout (milliseconds) is their last argument.
_WAIT_MS_LAST = frozenset({b"WAIT", b"WAITAOF"})
#: The non-blocking form of the blocking commands that can be polled.
_POLL_FORM = {
    b"BLPOP": b"LPOP",
    b"BRPOP": b"RPOP",
    b"BLMPOP": b"LMPOP",
    b"BZPOPMIN": b"ZPOPMIN",
    b"BZPOPMAX": b"ZPOPMAX",
    b"BZMPOP": b"ZMPOP",
}


def _name(command: tuple[Any, ...]) -> bytes:
    head = command[0]
    return (head if isinstance(head, bytes) else str(head).encode()).upper()


def _token(value: Any) -> bytes:
    return (value if isinstance(value, bytes) else str(value).encode()).upper()


def _block_index(command: tuple[Any, ...]) -> int | None:
    """Index of the ``BLOCK`` option's value in an XREAD / XREADGROUP, or None."""
    i = 1
    while i < len(command) - 1:
        token = _token(command[i])
        if token == b"STREAMS":
            return None
        if token == b"BLOCK":
            return i + 1
        i += 3 if token == b"GROUP" else 2 if token == b"COUNT" else 1
    return None


def block_s(command: tuple[Any, ...]) -> float | None | bool:
    """How long ``command`` may block its connection.

    Returns:
        False if it never blocks; the block time in seconds; None if it may block
        forever (a timeout of 0).
    """
    name = _name(command)
    if name in _TIMEOUT_LAST or name in _TIMEOUT_FIRST:
        raw = command[-1] if name in _TIMEOUT_LAST else command[1]
        seconds = float(raw)
        return None if seconds == 0 else seconds
    if name in _BLOCK_OPTION:
        at = _block_index(command)
        if at is None:
            return False
        ms = int(command[at])
        return None if ms == 0 else ms / 1000
    if name in _WAIT_MS_LAST:
        ms = int(command[-1])
        return None if ms == 0 else ms / 1000
    return False


def poll_form(command: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The non-blocking command that answers what ``command`` would answer now, or None
    when there is none that returns the same reply shape.

    Single-key BLPOP / BRPOP (``BLPOP k t`` -> ``LPOP k``, whose reply the caller must
    pair with the key), BLMPOP / BZMPOP (timeout dropped: same reply) and XREAD /
    XREADGROUP (``BLOCK`` dropped: same reply) have one. :func:`poll_reply` gives a
    pop's reply the blocking command's shape.
    """
    name = _name(command)
    if name in _BLOCK_OPTION:
        at = _block_index(command)
        if at is None:
            return None
        return command[: at - 1] + command[at + 1 :]
    if name in (b"BLPOP", b"BRPOP") and len(command) == 3:
        return (_POLL_FORM[name], command[1])
    if name in (b"BLMPOP", b"BZMPOP"):
        return (_POLL_FORM[name], *command[2:])
    return None


def poll_reply(command: tuple[Any, ...], reply: Any) -> Any:
    """``reply`` to :func:`poll_form` ``(command)`` in the shape ``command`` replies with
    (a single-key BLPOP answers ``[key, value]`` or nil)."""
    if _name(command) in (b"BLPOP", b"BRPOP"):
        return None if reply is None else [command[1], reply]
    return reply


def with_block_s(command: tuple[Any, ...], seconds: float) -> tuple[Any, ...]:
    """``command`` with its block time replaced by ``seconds`` (> 0; rounded up to the
    command's unit, at least one unit, so it never becomes "forever")."""
    name = _name(command)
    if name in _TIMEOUT_LAST:
        return (*command[:-1], f"{max(0.001, math.ceil(seconds * 1000) / 1000):.3f}")
    if name in _TIMEOUT_FIRST:
        return (command[0], f"{max(0.001, math.ceil(seconds * 1000) / 1000):.3f}", *command[2:])
    if name in _BLOCK_OPTION:
        at = _block_index(command)
        if at is not None:
            return (*command[:at], max(1, math.ceil(seconds * 1000)), *command[at + 1 :])
    if name in _WAIT_MS_LAST:
        return (*command[:-1], max(1, math.ceil(seconds * 1000)))
    raise ValueError(f"{name.decode()} does not block")
