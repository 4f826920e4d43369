"""Tool argument schemas: vetting a sidecar's ``args_schema`` at hello and validating a
call's ``args`` against it before enqueueing, with the ``jsonschema`` library."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


#: Keywords the hub will not evaluate in a sidecar-supplied schema: references (could
#: point anywhere) and regular expressions (Python's ``re`` backtracks: a hostile pattern
#: would pin the event loop). Sidecars enforce those themselves.
UNSUPPORTED_KEYWORDS = frozenset(
    {"$ref", "$dynamicRef", "$recursiveRef", "pattern", "patternProperties"}
)
#: Deepest nesting accepted in a tool's ``args_schema``.
MAX_SCHEMA_DEPTH = 32


def check_tool_schema(schema: Any) -> str | None:
    """Vet a sidecar's ``args_schema`` before the hub ever validates against it.

    Returns:
        None if usable, else why not (an unsupported keyword, nesting deeper than
        ``MAX_SCHEMA_DEPTH``, or not a valid JSON Schema per its meta-schema).
    """

    def walk(node: Any, depth: int) -> str | None:
        if depth > MAX_SCHEMA_DEPTH:
            return f"nested deeper than {MAX_SCHEMA_DEPTH}"
        if isinstance(node, dict):
            for key, value in node.items():
                if key in UNSUPPORTED_KEYWORDS:
                    return f"keyword {key!r} is not supported by the hub"
                found = walk(value, depth + 1)
                if found:
                    return found
        elif isinstance(node, list):
            for value in node:
                found = walk(value, depth + 1)
                if found:
                    return found
        return None

    problem = walk(schema, 0)
    if problem:
        return problem
    try:
        text = json.dumps(schema, sort_keys=True)
    except Exception as exc:  # noqa: BLE001 - a hostile schema must not crash the hub
        return f"not a usable JSON Schema ({type(exc).__name__})"
    return _meta_check(text)


@functools.lru_cache(maxsize=1024)
def _meta_check(schema_json: str) -> str | None:
    """:func:`check_tool_schema`'s meta-schema check, once per distinct schema: 10,000
    desktops mostly announce the same few tools, and compiling the meta-schema validator
    was about 8 % of the hub's CPU while they connected (issue 10)."""
    schema = json.loads(schema_json)
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"[:200]
    except Exception as exc:  # noqa: BLE001 - a hostile schema must not crash the hub
        return f"not a usable JSON Schema ({type(exc).__name__})"
    return None


def validate_args(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """Validate ``args`` against a JSON Schema (the ``jsonschema`` library); return the
    first error's message with its path, or None when valid. A schema that is itself
    invalid is not enforced (the sidecar's own binding still checks the args)."""
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
    except Exception:  # noqa: BLE001 - schemas are vetted at hello; never crash a dispatch
        return None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where or '(root)'}: {error.message}"[:300]


def args_checker(schema: dict[str, Any]) -> Callable[[dict[str, Any]], str | None]:
    """Compile ``schema`` once and return a function with :func:`validate_args`'s answer
    (the caller's cached catalogue keeps one per tool: no schema work per call when the
    args are valid)."""
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except Exception:  # noqa: BLE001 - as validate_args: an unusable schema is not enforced
        return lambda args: None

    def check(args: dict[str, Any]) -> str | None:
        try:
            if validator.is_valid(args):
                return None
            error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        except Exception:  # noqa: BLE001 - never crash a dispatch
            return None
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where or '(root)'}: {error.message}"[:300]

    return check
