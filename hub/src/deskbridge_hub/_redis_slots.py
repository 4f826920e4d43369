"""Redis Cluster hash slots of the commands the hub sends (pure, no I/O).

A key's slot is CRC16 (XMODEM) of the key, or of its hash tag (the text between the
first ``{`` and the next ``}``, when not empty), modulo 16384 (Redis Cluster
specification, "Keys distribution model"). Every key of one user is tagged ``{user}``,
so one user's keys share a slot; a batch (a pipeline or MULTI ... EXEC) or a script
touching keys of two slots is refused here (:class:`CrossSlot`) before it reaches a
server, which would refuse it anyway under Cluster (CROSSSLOT).
"""

from __future__ import annotations

from typing import Any

SLOTS = 16384

#: Commands with no key (routed to any node).
_KEYLESS = frozenset(
    {
        b"PING", b"INFO", b"MULTI", b"EXEC", b"DISCARD", b"PUBLISH", b"SUBSCRIBE",
        b"PSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE", b"TIME", b"HELLO", b"SELECT",
        b"CLIENT", b"CLUSTER", b"ASKING", b"ACL", b"COMMAND", b"SCRIPT", b"FUNCTION",
        b"READONLY", b"READWRITE", b"DBSIZE", b"ECHO", b"WAIT", b"WAITAOF", b"CONFIG",
        b"AUTH",
    }
)  # fmt: skip
#: Commands whose keys are all arguments but the last (a timeout).
_ALL_BUT_LAST = frozenset({b"BLPOP", b"BRPOP", b"BZPOPMIN", b"BZPOPMAX"})
#: Commands whose every argument is a key.
_ALL = frozenset({b"DEL", b"UNLINK", b"EXISTS", b"MGET", b"TOUCH", b"WATCH"})


class CrossSlot(ValueError):
    """A batch or script names keys of more than one hash slot."""


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: Any) -> int:
    """The hash slot of ``key`` (str or bytes)."""
    data = _bytes(key)
    start = data.find(b"{")
    if start > -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % SLOTS


def command_keys(command: tuple[Any, ...]) -> list[Any]:
    """The keys ``command`` names (first word may hold a subcommand, ``b"XGROUP CREATE"``)."""
    words = _bytes(command[0]).upper().split()
    name, args = words[0], list(command[1:])
    if len(words) > 1:  # "XGROUP CREATE" sent as one word
        args = [words[1], *args]
    if name in _KEYLESS or not args:
        return []
    if name in (b"EVAL", b"EVALSHA", b"FCALL", b"EVAL_RO", b"EVALSHA_RO", b"FCALL_RO"):
        return args[2 : 2 + int(args[1])]
    if name in (b"XREAD", b"XREADGROUP"):
        upper = [_bytes(a).upper() for a in args]
        at = upper.index(b"STREAMS") + 1
        streams = args[at:]
        return streams[: len(streams) // 2]
    if name in (b"BLMPOP", b"BZMPOP"):
        return args[2 : 2 + int(args[1])]
    if name in (b"LMPOP", b"ZMPOP"):
        return args[1 : 1 + int(args[0])]
    if name in (b"XGROUP", b"XINFO"):
        return args[1:2]
    if name in _ALL_BUT_LAST:
        return args[:-1]
    if name in _ALL:
        return args
    return args[:1]


def batch_slot(commands: tuple[tuple[Any, ...], ...]) -> int | None:
    """The one slot every key of ``commands`` hashes to, or None when they name no key.

    Raises:
        CrossSlot: keys of two slots (names both keys).
    """
    slot: int | None = None
    first: Any = None
    for command in commands:
        for key in command_keys(command):
            s = key_slot(key)
            if slot is None:
                slot, first = s, key
            elif s != slot:
                raise CrossSlot(
                    f"{_bytes(command[0]).decode()} touches {key!r} (slot {s}) in a batch "
                    f"with {first!r} (slot {slot}): illegal under Redis Cluster"
                )
    return slot
