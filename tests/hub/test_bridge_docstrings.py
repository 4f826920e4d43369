"""``Bridge``'s docstrings are the Python caller's reference (``help(Bridge.call)``): each
names every answer the method can give. ``dispatch`` returned ``declined`` and
``in_doubt`` and raised ``IdempotencyKeyReused`` without saying so; ``call`` raised
``JobDeclined``, ``JobInDoubt`` and ``IdempotencyKeyReused`` unlisted; ``tools`` left out the
catalogue's ``approval_after_wait_s``."""

from __future__ import annotations

import inspect
import re

from deskbridge_hub import Bridge
from deskbridge_hub._outcome import _ERRORS


def _section(doc: str, name: str) -> str:
    found = re.search(rf"^{name}:\n(.*?)(?=^\S|\Z)", doc, re.S | re.M)
    assert found, f"no {name}: section"
    return found.group(1)


def test_dispatch_lists_every_status_it_returns_and_every_refusal() -> None:
    doc = inspect.getdoc(Bridge.dispatch) or ""
    returns = _section(doc, "Returns")
    assert [s for s in ["completed", *_ERRORS] if s not in returns] == []
    raises = _section(doc, "Raises")
    named = ["BadRequest", "JobIdInUse", "IdempotencyKeyReused", "SubstrateUnavailable"]
    assert [e for e in named if e not in raises] == []


def test_call_lists_every_exception_it_raises() -> None:
    raises = _section(inspect.getdoc(Bridge.call) or "", "Raises")
    named = [e.__name__ for e in _ERRORS.values()]
    named += ["BadRequest", "IdempotencyKeyReused", "SubstrateUnavailable"]
    assert [e for e in named if e not in raises] == []


def test_tools_names_every_catalogue_field() -> None:
    doc = inspect.getdoc(Bridge.tools) or ""
    fields = ["name", "description", "args_schema", "side_effects", "approval_after_wait_s"]
    assert [f for f in fields if f'"{f}"' not in doc] == []
