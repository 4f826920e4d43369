"""Valid Unicode text only, on every way out: a lone surrogate (U+D800-U+DFFF alone)
is what Python makes of bytes that are not UTF-8 (``os.fsdecode`` of a Linux file name,
``surrogateescape``), and JSON can carry it as an escape (``"\\udce9"``) that strict
parsers (Rust's serde_json, the MCP SDK's pydantic) refuse, so a caller got no answer.
The hub refuses such text in ``args`` (400); these helpers keep it out of results and
messages. No I/O.
"""

from __future__ import annotations

import json
from typing import Any


def holds_lone_surrogate(text: str) -> bool:
    """Whether JSON ``text`` decodes to a string (a value or a key) with a lone surrogate.

    Cheap for the usual text: only text holding a ``\\ud`` escape (or a surrogate
    character) is parsed again. A surrogate *pair* (``"\\ud83d\\ude00"``, how
    ``json.dumps`` writes U+1F600) is valid text.

    Args:
        text (str): JSON text (as ``json.dumps`` writes it).

    Returns:
        bool: True if some string in it cannot be encoded as UTF-8.

    Raises:
        ValueError: ``text`` is not JSON (only looked at when it has an escape).
    """
    if text.isascii():
        if "\\ud" not in text and "\\uD" not in text:
            return False
        text = json.dumps(json.loads(text), ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def replace_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a pair of surrogate
    characters becomes the character it encodes): for text meant for a person (an error
    or a progress message), which must reach them rather than be refused."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def replace_lone_surrogates_in(value: Any) -> Any:
    """A JSON value (as ``json.loads`` gives it) with :func:`replace_lone_surrogates`
    applied to every string in it, keys included: for a tool's catalogue entry (its
    description, its schema's texts), which must reach callers as valid text.

    Returns ``value`` itself when no string in it holds a lone surrogate (the usual case:
    one ``json.dumps``), else a copy. Values that are not JSON (tuples, numbers) are
    kept as they are, lists and tuples become lists.
    """
    if not holds_lone_surrogate(json.dumps(value, default=str)):
        return value
    return _replaced(value)


def _replaced(value: Any) -> Any:
    if isinstance(value, str):
        return replace_lone_surrogates(value)
    if isinstance(value, dict):
        return {_replaced(k): _replaced(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replaced(v) for v in value]
    return value


__all__ = ["holds_lone_surrogate", "replace_lone_surrogates", "replace_lone_surrogates_in"]
