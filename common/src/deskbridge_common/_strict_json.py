"""Strict JSON parsing shared by the frame codec and the hub's HTTP bodies: an object with
the same key twice is refused, naming the key and where it is.

RFC 8259 only says names SHOULD be unique, and Python's ``json`` keeps the last value
silently, so ``{"name": "echo", "name": "sleep"}`` would run ``sleep`` while a log or a
proxy that keeps the first value shows ``echo``. Refusing it means every reader of the
text agrees on what it says. No I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class DuplicateKey(ValueError):
    """An object in the text has ``key`` twice.

    Attributes:
        key: the repeated key.
        member: the top-level member whose value holds that object, or None when it is
            the top-level object itself (then ``key`` is a top-level member).
    """

    def __init__(self, key: str, member: str | None) -> None:
        where = "the top-level object" if member is None else member
        super().__init__(f"duplicate key {key[:64]!r} in {where}")
        self.key = key
        self.member = member

    @property
    def field(self) -> str:
        """The top-level field to name in an error: ``member``, else ``key``."""
        return self.key if self.member is None else self.member


def loads(
    data: str | bytes,
    *,
    parse_float: Callable[[str], Any],
    parse_constant: Callable[[str], Any],
) -> Any:
    """``json.loads`` that refuses an object with a repeated key.

    Args:
        data: the JSON text.
        parse_float, parse_constant: as for ``json.loads`` (the callers' own strictness
            about non-finite numbers).

    Returns:
        The parsed value (objects as dicts).

    Raises:
        DuplicateKey: some object has a key twice (the first such object to close).
        ValueError, RecursionError: what ``json.loads`` and the two callbacks raise.
    """
    repeated: list[tuple[str, dict[str, Any]]] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs) and not repeated:
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    repeated.append((key, obj))
                    break
                seen.add(key)
        return obj

    value = json.loads(
        data, object_pairs_hook=pairs_hook, parse_float=parse_float, parse_constant=parse_constant
    )
    if repeated:
        key, obj = repeated[0]
        raise DuplicateKey(key, _member_holding(value, obj))
    return value


def _member_holding(top: Any, target: dict[str, Any]) -> str | None:
    """The top-level member of ``top`` whose value contains ``target`` (by identity), or
    None when ``target`` is ``top``. Iterative: a deeply nested value must not recurse."""
    if target is top or not isinstance(top, dict):
        return None
    for member, value in top.items():  # the top level of a parsed object: str keys
        stack = [value]
        while stack:
            item = stack.pop()
            if item is target:
                return str(member)
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None
