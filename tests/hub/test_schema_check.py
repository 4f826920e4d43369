"""Vetting a sidecar's tool schemas at hello (``_schema.check_tool_schema``): refusals
name why, and the meta-schema check runs once per distinct schema (10,000 desktops
announce the same few tools; issue 10)."""

from __future__ import annotations

from deskbridge_hub._schema import _meta_check, check_tool_schema


def test_usable_schema_passes_and_refusals_say_why():
    assert check_tool_schema({"type": "object", "properties": {"a": {"type": "string"}}}) is None
    assert check_tool_schema({"$ref": "#/x"}) == "keyword '$ref' is not supported by the hub"
    assert check_tool_schema({"type": 5}).startswith("not a valid JSON Schema: ")
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["items"] = {}
        node = node["items"]
    assert check_tool_schema(deep) == "nested deeper than 32"


def test_the_meta_schema_check_runs_once_per_distinct_schema():
    _meta_check.cache_clear()
    a = {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}}
    same_other_order = {
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
        "type": "object",
    }
    for schema in (a, same_other_order, a):
        assert check_tool_schema(schema) is None
    info = _meta_check.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    assert check_tool_schema({"type": 5}) is not None  # a refusal is remembered too
    assert check_tool_schema({"type": 5}) is not None
    assert _meta_check.cache_info().misses == 2
