"""Typed tool arguments: a JSON Schema from a function's type hints, validation of a job's
``args`` against those hints before the tool runs, and JSON serialisation of results, all
with pydantic.

One pydantic model per tool, built from its signature (``pydantic.create_model``): a field
per keyword parameter, typed by its annotation (``Optional``, ``Literal``, ``Enum``,
``list[T]``, ``dict[str, T]``, dataclasses, ``TypedDict``, models, ``Annotated[...,
Field(...)]`` constraints), required unless it has a default, described from
``Annotated[..., Field(description=...)]`` or else from the docstring's ``Args:`` section
(Google style) or ``:param name:`` lines (Sphinx style).

Validation is pydantic's *strict* mode on the JSON text of ``args``: exactly what the
published schema says (``"1"`` is not an integer, ``1`` is not a string), with the
conversions JSON needs (an ISO string to ``datetime``, a value to its ``Enum`` member, an
object to a dataclass or model). The hub validates the same ``args`` against the same
schema before enqueueing; the sidecar's check is the authoritative one (it also enforces
what the hub does not evaluate: ``pattern``, recursion).

The published schema is self-contained, because the hub refuses references and regular
expressions in a sidecar's schemas (``deskbridge_hub._schema``): every ``$ref`` into
``$defs`` is inlined; a recursive type is inlined once and its recursion point becomes
``{}`` (any value; the sidecar still validates it); ``pattern`` and ``patternProperties``
are dropped (the sidecar still enforces them); generated ``title`` keywords are dropped.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pydantic
import pydantic_core
from pydantic.json_schema import PydanticJsonSchemaWarning

from ._errors import ArgsInvalid

#: Keywords dropped from published schemas (the hub will not evaluate them; pydantic
#: enforces them at the sidecar).
DROPPED_KEYWORDS = frozenset({"pattern", "patternProperties", "title"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_ONE = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "additionalItems",
    }
)
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
#: Most validation errors listed in one ``bad_args`` message.
MAX_ERRORS_REPORTED = 3


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Return ``schema`` with every local ``$ref`` replaced by its definition.

    Also drops :data:`DROPPED_KEYWORDS` in schema positions (never property names).

    Args:
        schema: a JSON Schema whose references point into its own ``$defs``.

    Returns:
        A new schema without ``$ref`` or ``$defs``. A reference met again while it is
        being expanded (a recursive type) becomes ``{"$comment": ...}``, which allows
        any value.

    Raises:
        ValueError: a ``$ref`` that does not point into ``#/$defs/``.
    """
    defs: Mapping[str, Any] = schema.get("$defs", {})

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/$defs/") or ref[8:] not in defs:
                raise ValueError(f"cannot inline the reference {ref!r}")
            name = ref[8:]
            if name in stack:
                return {"$comment": f"recursive {name}: checked by the sidecar"}
            target = walk(defs[name], (*stack, name))
            rest = {k: v for k, v in node.items() if k != "$ref"}
            merged = dict(target)
            merged.update(walk(rest, stack))  # a sibling description/default wins
            return merged
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DROPPED_KEYWORDS or key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: walk(v, stack) for k, v in value.items()}
            elif key in _SCHEMA_ONE:
                out[key] = walk(value, stack)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(v, stack) for v in value]
            else:
                out[key] = value  # data (default, enum, const, examples) or a scalar keyword
        return out

    inlined: dict[str, Any] = walk(schema, ())
    return inlined


_GOOGLE_HEADERS = re.compile(r"^(Args|Arguments|Parameters|Keyword Args|Keyword Arguments):\s*$")
_GOOGLE_ITEM = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")


def docstring_params(doc: str | None) -> dict[str, str]:
    """Per-parameter descriptions from a docstring.

    Understands Google style (an ``Args:`` / ``Arguments:`` / ``Parameters:`` section of
    ``name: text`` or ``name (type): text`` items, continuation lines indented further)
    and Sphinx style (``:param name: text`` / ``:param type name: text``).

    Returns:
        ``{parameter name: description}`` (whitespace collapsed), possibly empty.
    """
    if not doc:
        return {}
    lines = inspect.cleandoc(doc).splitlines()
    found: dict[str, str] = {}
    current: str | None = None
    section_indent: int | None = None
    item_indent: int | None = None
    for raw in lines:
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            current = sphinx.group(1)
            found[current] = sphinx.group(2)
            section_indent = None
            continue
        if _GOOGLE_HEADERS.match(stripped):
            section_indent, item_indent, current = indent, None, None
            continue
        if section_indent is None:
            if current is not None and stripped and not stripped.startswith(":"):
                found[current] += " " + stripped  # a Sphinx continuation line
            elif not stripped or stripped.startswith(":"):
                current = None
            continue
        if not stripped:
            continue
        if indent <= section_indent:  # the next section (Returns:, Raises:, ...)
            section_indent, current = None, None
            continue
        if item_indent is None:
            item_indent = indent
        item = _GOOGLE_ITEM.match(stripped) if indent == item_indent else None
        if item:
            current = item.group(1).lstrip("*")
            found[current] = item.group(3)
        elif current is not None:
            found[current] += " " + stripped
    return {k: " ".join(v.split()) for k, v in found.items() if v.strip()}


def _has_description(annotation: Any) -> bool:
    if typing.get_origin(annotation) is not typing.Annotated:
        return False
    return any(
        isinstance(m, pydantic.fields.FieldInfo) and m.description for m in annotation.__metadata__
    )


@attrs.frozen(eq=False)
class Arguments:
    """How one tool's ``args`` are described, checked and converted.

    Attributes:
        schema: the published JSON Schema of ``args`` (self-contained: no ``$ref``).
        model: the pydantic model the args are validated with.
        names: keyword parameter name -> model field name.
        extra: validator of ``**kwargs`` values (a ``dict[str, T]`` adapter), None when
            the function takes no ``**kwargs`` (unknown arguments are refused).
        injected: parameter names the sidecar supplies itself (never in ``args``).
    """

    schema: dict[str, Any]
    model: type[pydantic.BaseModel]
    names: dict[str, str]
    extra: pydantic.TypeAdapter[Any] | None
    injected: frozenset[str] = frozenset()

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        signature: inspect.Signature,
        *,
        injected: tuple[type, ...] = (),
    ) -> Arguments:
        """Build the model and schema for ``fn``.

        Args:
            fn: the tool function.
            signature: ``inspect.signature(fn)``.
            injected: types of parameters the sidecar passes itself (a parameter annotated
                with one of them is left out of the schema and never taken from ``args``).

        Raises:
            TypeError: an annotation cannot be resolved (a forward reference to a name
                not defined at decoration time) or pydantic cannot build a schema for it
                (the message names the parameter).
        """
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:  # noqa: BLE001 - NameError, TypeError, SyntaxError...
            raise TypeError(
                f"cannot resolve the type hints of {getattr(fn, '__name__', fn)!r}: {exc!r} "
                "(define the types used in a tool's signature before the tool)"
            ) from exc
        described = docstring_params(inspect.getdoc(fn))
        fields: dict[str, Any] = {}
        names: dict[str, str] = {}
        skipped: set[str] = set()
        extra: pydantic.TypeAdapter[Any] | None = None
        extra_type: Any = None
        for index, param in enumerate(signature.parameters.values()):
            annotation = hints.get(param.name, Any)
            if param.kind is param.VAR_POSITIONAL:
                continue
            if _is_injected(annotation, injected):
                skipped.add(param.name)
                continue
            if param.kind is param.VAR_KEYWORD:
                extra_type = annotation
                continue
            if param.kind is param.POSITIONAL_ONLY:
                continue  # has a default (checked by Tool); never passed by keyword
            info: dict[str, Any] = {"alias": param.name}
            if param.default is not param.empty:
                info["default"] = param.default
            if param.name in described and not _has_description(annotation):
                info["description"] = described[param.name]
            field_name = f"p{index}"
            fields[field_name] = (annotation, pydantic.Field(**info))
            names[param.name] = field_name
        open_ended = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        config = pydantic.ConfigDict(
            extra="allow" if open_ended else "forbid",
            arbitrary_types_allowed=False,
            strict=True,
        )
        try:
            model = pydantic.create_model(
                f"{getattr(fn, '__name__', 'tool')}_args", __config__=config, **fields
            )
            if open_ended and extra_type is not Any:
                extra = pydantic.TypeAdapter(dict[str, extra_type])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PydanticJsonSchemaWarning)  # default not JSON
                raw = model.model_json_schema(by_alias=True)
                extra_schema = None if extra is None else extra.json_schema()
        except pydantic.PydanticUserError as exc:
            raise TypeError(f"{getattr(fn, '__name__', fn)!r}: {exc}") from exc
        except pydantic.errors.PydanticSchemaGenerationError as exc:
            raise TypeError(f"{getattr(fn, '__name__', fn)!r}: {exc}") from exc
        if extra_schema is not None:
            raw["additionalProperties"] = extra_schema.get("additionalProperties", {})
            raw.setdefault("$defs", {}).update(extra_schema.get("$defs", {}))
        schema = inline_refs(raw)
        if open_ended and extra is None:
            schema.pop("additionalProperties", None)  # **kwargs: Any takes anything
        schema.setdefault("properties", {})
        return cls(
            schema=schema, model=model, names=names, extra=extra, injected=frozenset(skipped)
        )

    def validate(self, tool_name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``args`` and convert them to the annotated types.

        Args:
            tool_name: for the error message.
            args: the job's ``args`` object (JSON values).

        Returns:
            Keyword arguments for the function: the arguments the caller gave, converted
            (a model, dataclass, Enum member, datetime...); omitted ones are left to the
            function's own defaults.

        Raises:
            ArgsInvalid: naming up to :data:`MAX_ERRORS_REPORTED` offending fields by
                their path (``tags/1: Input should be a valid string``).
        """
        try:
            text = json.dumps(dict(args), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ArgsInvalid(f"{tool_name}: args are not JSON: {exc}") from exc
        unknown = [k for k in args if k in self.injected]
        if unknown:
            raise ArgsInvalid(f"{tool_name}: {unknown[0]}: supplied by the sidecar, not by args")
        try:
            validated = self.model.model_validate_json(text, strict=True)
            kwargs = {
                alias: getattr(validated, field)
                for alias, field in self.names.items()
                if field in validated.model_fields_set
            }
            extras = dict(validated.model_extra or {})
            if self.extra is not None and extras:
                extras = self.extra.validate_json(json.dumps(extras), strict=True)
        except pydantic.ValidationError as exc:
            raise ArgsInvalid(f"{tool_name}: {_describe(exc, list(self.names))}") from None
        kwargs.update(extras)
        return kwargs


def _is_injected(annotation: Any, injected: tuple[type, ...]) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return any(annotation is t for t in injected)


def _describe(exc: pydantic.ValidationError, names: list[str]) -> str:
    parts = []
    errors = exc.errors(include_url=False)
    for error in errors[:MAX_ERRORS_REPORTED]:
        where = "/".join(str(p) for p in error["loc"]) or "(root)"
        message, got = error["msg"], ""
        if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            message = f"unexpected argument (this tool takes {names or 'no arguments'})"
        elif error["type"] not in ("missing", "extra_forbidden") and "input" in error:
            got = f" (got {_short(error['input'])})"
        parts.append(f"{where}: {message}{got}")
    more = len(errors) - MAX_ERRORS_REPORTED
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def to_json_value(value: Any) -> Any:
    """A tool's return value as plain JSON data (models, dataclasses, Enums, datetimes,
    sets and tuples serialised the way pydantic's JSON mode does).

    Raises:
        TypeError: the value holds something pydantic cannot serialise, or nests too
            deeply (pydantic's serialisation depth limit).
    """
    try:
        return pydantic_core.to_jsonable_python(value)
    except (ValueError, TypeError, RecursionError) as exc:  # incl. PydanticSerializationError
        raise TypeError(str(exc)) from None


__all__ = ["ArgsInvalid", "Arguments", "docstring_params", "inline_refs", "to_json_value"]
