"""Typed tools: schemas from type hints (pydantic), validation before the tool runs,
conversion to the annotated types, results serialised the same way.

Every case is checked on both sides: the sidecar's verdict (``invoke``) and the hub's
(its schema vetting at hello and its ``validate_args`` before enqueueing) must agree.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest
from deskbridge_hub._schema import check_tool_schema, validate_args
from deskbridge_sidecar import BAD_ARGS, BAD_RESULT, ToolRegistry, invoke, tool, tool_of
from typing_extensions import TypedDict


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Address(TypedDict):
    street: str
    zip: str


class Person(pydantic.BaseModel):
    name: str
    code: str = pydantic.Field("abc", pattern=r"^[a-z]+$")
    home: Point
    address: Address | None = None


class Tree(pydantic.BaseModel):
    label: str
    children: list[Tree] = []


class Receipt(pydantic.BaseModel):
    person: Person
    colour: Colour
    at: datetime.datetime


seen: list[dict[str, Any]] = []


@tool
async def typed(
    name: Optional[str],  # noqa: UP045 - the spelling the issue names
    mode: Literal["a", "b"],
    colour: Colour,
    tags: list[str],
    counts: dict[str, int],
    point: Point,
    address: Address,
    person: Person,
    when: datetime.datetime,
    limit: Annotated[int, pydantic.Field(ge=1, le=10, description="at most ten")] = 3,
    note: str | None = None,
) -> Receipt:
    """Every supported kind of argument.

    Args:
        name: a name, or null.
        mode: the mode;
            one of two.
        colour: a colour by value.
        limit: this text loses to the Annotated description.
    """
    seen.append(
        {
            "name": name,
            "mode": mode,
            "colour": colour,
            "tags": tags,
            "counts": counts,
            "point": point,
            "address": address,
            "person": person,
            "when": when,
            "limit": limit,
            "note": note,
        }
    )
    return Receipt(person=person, colour=colour, at=when)


VALID: dict[str, Any] = {
    "name": None,
    "mode": "a",
    "colour": "blue",
    "tags": ["x", "y"],
    "counts": {"a": 1},
    "point": {"x": 1},
    "address": {"street": "Main St", "zip": "12345"},
    "person": {"name": "Ann", "home": {"x": 2, "y": 3}},
    "when": "2026-11-30T18:00:00+00:00",
}


def test_schema_is_typed_self_contained_and_passes_the_hubs_vetting():
    schema = tool_of(typed).args_schema
    assert check_tool_schema(schema) is None
    text = repr(schema)
    assert "$ref" not in text and "$defs" not in text and "'pattern'" not in text
    props = schema["properties"]
    assert props["name"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "description": "a name, or null.",
    }
    assert props["mode"] == {
        "enum": ["a", "b"],
        "type": "string",
        "description": "the mode; one of two.",
    }
    assert props["colour"]["enum"] == ["red", "blue"]
    assert props["colour"]["description"] == "a colour by value."
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["point"]["properties"]["y"] == {"type": "integer", "default": 0}
    assert props["point"]["required"] == ["x"]
    assert props["address"]["required"] == ["street", "zip"]
    assert props["person"]["properties"]["home"]["properties"]["x"] == {"type": "integer"}
    assert props["when"] == {"type": "string", "format": "date-time"}
    assert props["limit"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
        "default": 3,
        "description": "at most ten",
    }
    assert props["note"]["default"] is None
    assert schema["required"] == [
        "name",
        "mode",
        "colour",
        "tags",
        "counts",
        "point",
        "address",
        "person",
        "when",
    ]
    assert schema["additionalProperties"] is False


async def test_valid_args_are_converted_to_the_annotated_types():
    seen.clear()
    outcome = await invoke(tool_of(typed), VALID)
    assert outcome.ok, outcome.error
    (got,) = seen
    assert got["colour"] is Colour.BLUE
    assert got["point"] == Point(x=1, y=0)
    assert got["person"] == Person(name="Ann", home=Point(2, 3))
    assert got["when"] == datetime.datetime(2026, 11, 30, 18, tzinfo=datetime.UTC)
    assert got["address"] == {"street": "Main St", "zip": "12345"}
    assert got["limit"] == 3 and got["note"] is None  # omitted: the function's defaults
    # The returned model is serialised as pydantic's JSON mode does.
    assert outcome.result == {
        "person": {"name": "Ann", "code": "abc", "home": {"x": 2, "y": 3}, "address": None},
        "colour": "blue",
        "at": "2026-11-30T18:00:00Z",
    }
    assert validate_args(tool_of(typed).args_schema, VALID) is None


INVALID = [
    ("name", 5, "name: Input should be a valid string"),
    ("mode", "c", "mode: Input should be 'a' or 'b'"),
    ("colour", "green", "colour: Input should be 'red' or 'blue'"),
    ("colour", "RED", "colour: Input should be 'red' or 'blue'"),
    ("tags", [1, 2], "tags/0: Input should be a valid string"),
    ("tags", "xy", "tags: Input should be a valid array"),
    ("counts", {"a": "1"}, "counts/a: Input should be a valid integer"),
    ("counts", [1], "counts: Input should be an object"),
    ("point", {"y": 1}, "point/x: Field required"),
    ("point", {"x": "1"}, "point/x: Input should be a valid integer"),
    ("point", {"x": 1, "z": 1}, "point/z: Unexpected keyword argument"),
    ("address", {"street": "s"}, "address/zip: Field required"),
    (
        "person",
        {"name": "A", "home": {"x": True}},
        "person/home/x: Input should be a valid integer",
    ),
    ("when", "yesterday", "when: Input should be a valid datetime"),
    ("limit", 11, "limit: Input should be less than or equal to 10"),
    ("limit", 2.5, "limit: Input should be a valid integer"),
    ("note", ["x"], "note: Input should be a valid string"),
]


@pytest.mark.parametrize(("field", "value", "message"), INVALID)
async def test_invalid_args_are_refused_before_the_tool_runs(field, value, message):
    seen.clear()
    args = {**VALID, field: value}
    outcome = await invoke(tool_of(typed), args)
    assert outcome.code == BAD_ARGS
    assert outcome.error.message.startswith(f"typed: {message}"), outcome.error.message
    assert seen == []  # never ran
    # The hub refuses the same args from the published schema, except where only the
    # sidecar can tell: JSON Schema's "format" is an annotation, not an assertion.
    hub_verdict = validate_args(tool_of(typed).args_schema, args)
    assert (hub_verdict is None) == (field == "when"), hub_verdict


async def test_missing_and_unexpected_arguments():
    args = {k: v for k, v in VALID.items() if k != "tags"}
    outcome = await invoke(tool_of(typed), args)
    assert outcome.error.message == "typed: tags: Field required"
    outcome = await invoke(tool_of(typed), {**VALID, "tagz": []})
    assert outcome.error.message.startswith("typed: tagz: unexpected argument (this tool takes [")
    for bad in ({**VALID, "tagz": []}, args):
        assert validate_args(tool_of(typed).args_schema, bad) is not None


async def test_what_the_hub_does_not_evaluate_the_sidecar_still_enforces():
    """``pattern`` is dropped from the published schema (the hub refuses regexes), so the
    hub lets it through; the sidecar's pydantic check refuses it."""
    args = {**VALID, "person": {"name": "A", "code": "ABC", "home": {"x": 1}}}
    assert validate_args(tool_of(typed).args_schema, args) is None
    outcome = await invoke(tool_of(typed), args)
    assert outcome.code == BAD_ARGS and "person/code: String should match pattern" in (
        outcome.error.message
    )


async def test_recursive_models_are_inlined_once_and_validated_in_full():
    @tool
    async def walk(tree: Tree) -> int:
        def count(t: Tree) -> int:
            return 1 + sum(count(c) for c in t.children)

        return count(tree)

    schema = tool_of(walk).args_schema
    assert check_tool_schema(schema) is None
    tree_schema = schema["properties"]["tree"]
    assert tree_schema["properties"]["children"]["items"] == {
        "$comment": "recursive Tree: checked by the sidecar"
    }
    good = {"tree": {"label": "r", "children": [{"label": "a", "children": [{"label": "b"}]}]}}
    assert (await invoke(tool_of(walk), good)).result == 3
    bad = {"tree": {"label": "r", "children": [{"label": "a", "children": [{"label": 7}]}]}}
    outcome = await invoke(tool_of(walk), bad)
    assert outcome.code == BAD_ARGS
    assert "tree/children/0/children/0/label: Input should be a valid string" in (
        outcome.error.message
    )


async def test_typed_var_keyword_arguments():
    @tool
    def scores(label: str, **marks: int) -> dict[str, Any]:
        return {"label": label, **marks}

    schema = tool_of(scores).args_schema
    assert schema["additionalProperties"] == {"type": "integer"}
    assert check_tool_schema(schema) is None
    assert (await invoke(tool_of(scores), {"label": "l", "a": 1})).result == {"label": "l", "a": 1}
    outcome = await invoke(tool_of(scores), {"label": "l", "a": "1"})
    assert outcome.code == BAD_ARGS and outcome.error.message.startswith("scores: a: ")


def test_sphinx_docstrings_and_unannotated_parameters():
    @tool
    def legacy(path, depth=2):
        """List a folder.

        :param path: the folder
            to list.
        :param int depth: how deep.
        :returns: names.
        """

    schema = tool_of(legacy).args_schema
    assert schema["properties"] == {
        "path": {"description": "the folder to list."},
        "depth": {"default": 2, "description": "how deep."},
    }
    assert schema["required"] == ["path"]


def test_unresolvable_or_unsupported_hints_are_refused_at_decoration():
    def forward(x: NotDefinedAnywhere) -> None:  # noqa: F821
        return None

    with pytest.raises(TypeError, match="cannot resolve the type hints of 'forward'"):
        tool(forward)

    class Opaque:
        pass

    def opaque(x: Opaque) -> None:
        return None

    opaque.__annotations__ = {"x": Opaque}
    with pytest.raises(TypeError, match="opaque"):
        tool(opaque)


async def test_results_that_pydantic_cannot_serialise_are_bad_results():
    class Opaque:
        pass

    @tool
    async def junk() -> Any:
        return {"x": Opaque()}

    @tool
    async def friendly() -> Any:
        return {"when": datetime.date(2026, 1, 2), "colours": (Colour.RED,), "p": Point(1, 2)}

    assert (await invoke(tool_of(junk), {})).code == BAD_RESULT
    assert (await invoke(tool_of(friendly), {})).result == {
        "when": "2026-01-02",
        "colours": ["red"],
        "p": {"x": 1, "y": 2},
    }


def test_builtin_schemas_pass_the_hubs_vetting():
    for spec in ToolRegistry().specs():
        assert check_tool_schema(spec.args_schema) is None, spec.name
    sleep_schema = ToolRegistry().get("sleep").args_schema
    assert sleep_schema["properties"]["seconds"]["minimum"] == 0
