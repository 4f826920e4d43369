"""@tool, ToolRegistry and invoke(): no sockets."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
import trio
from deskbridge_common import encode_frame
from deskbridge_sidecar import (
    BAD_ARGS,
    BAD_RESULT,
    CRASHED,
    STATUS_TOOL,
    Tool,
    ToolError,
    ToolRegistry,
    invoke,
    tool,
    tool_of,
)


def test_bare_decorator_marks_and_returns_the_function():
    @tool
    async def click(selector: str, *, times: int = 1) -> dict:
        """Click an element.

        Long explanation that is not part of the description.
        """
        return {}

    found = tool_of(click)
    assert isinstance(found, Tool)
    assert found.name == "click" and found.is_async and not found.side_effects
    assert found.description == "Click an element."
    assert found.args_schema == {
        "type": "object",
        "properties": {
            "selector": {"type": "string"},
            "times": {"type": "integer", "default": 1},
        },
        "required": ["selector"],
        "additionalProperties": False,
    }


def test_decorator_with_options_and_explicit_schema():
    schema = {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}}

    @tool(name="browser.open", description="Open a page", side_effects=True, args_schema=schema)
    def open_page(url):
        return url

    found = tool_of(open_page)
    assert found is not None and found.name == "browser.open"
    assert found.side_effects and not found.is_async
    spec = found.spec()
    assert spec.args_schema == schema and spec.description == "Open a page"
    assert open_page("x") == "x"  # still a plain function


def test_var_keyword_tools_accept_anything():
    @tool
    def anything(**kwargs):
        return kwargs

    found = tool_of(anything)
    assert found.args_schema == {"type": "object", "properties": {}}
    assert found.check_args({"a": 1, "b": 2}) is None


@pytest.mark.parametrize("name", ["status", "", "has space", "x" * 65])
def test_bad_or_reserved_names_are_refused(name):
    with pytest.raises(ValueError):
        tool(name=name)(lambda: None)


def test_positional_only_parameters_are_refused():
    def f(a, /):
        return a

    with pytest.raises(ValueError, match="positional-only"):
        tool(f)


def test_registry_builtins_order_and_duplicates():
    @tool
    def alpha():
        return 1

    registry = ToolRegistry([alpha])
    assert registry.names() == ["echo", "sleep", "alpha"]
    assert STATUS_TOOL not in registry
    assert registry.add(alpha) is registry.get("alpha")  # same tool twice: no-op

    @tool(name="alpha")
    def other():
        return 2

    with pytest.raises(ValueError, match="two tools"):
        registry.add(other)
    assert ToolRegistry(builtins=False).names() == []


def test_a_name_clash_names_both_functions():
    """A newcomer pass: `run --tools a --tools b` with `greet` in both said only "two tools
    are named 'greet'": which two? With a built-in (`echo`) it did not say that one is the
    sidecar's own. Both are named, and how to rename one."""
    mine = types.ModuleType("mine")
    theirs = types.ModuleType("theirs")

    def greet() -> str:
        return "a"

    def greet_too() -> str:
        return "b"

    greet.__module__, greet_too.__module__ = "mine", "theirs"  # as if defined there
    greet.__qualname__, greet_too.__qualname__ = "greet", "greet_too"
    mine.greet = tool(greet)
    theirs.greet = tool(name="greet")(greet_too)
    registry = ToolRegistry()
    registry.add_module(mine)
    with pytest.raises(ValueError) as clash:
        registry.add_module(theirs)
    assert str(clash.value) == (
        "two tools are named 'greet': mine.greet and theirs.greet_too (give one another "
        "name: @tool(name=...))"
    )

    def echo() -> str:
        return "mine"

    echo.__module__, echo.__qualname__ = "mine", "echo"
    with pytest.raises(ValueError) as builtin:
        registry.add(echo)
    assert str(builtin.value) == (
        "two tools are named 'echo': the sidecar's own (deskbridge_sidecar._tools.echo) and "
        "mine.echo (give one another name: @tool(name=...))"
    )


def test_plain_functions_get_default_options():
    def plain(x: float) -> float:
        return x

    registry = ToolRegistry([plain], builtins=False)
    assert registry.get("plain").args_schema["properties"] == {"x": {"type": "number"}}


def test_add_module_collects_marked_functions_only():
    module = types.ModuleType("fake_tools_mod")

    @tool
    def one():
        return 1

    def helper():
        return 2

    module.one, module.helper = one, helper
    registry = ToolRegistry(builtins=False)
    added = registry.add_module(module)
    assert [t.name for t in added] == ["one"] and registry.names() == ["one"]
    with pytest.raises(ValueError, match="no @tool"):
        ToolRegistry().add_module(types.ModuleType("empty_mod"))


def test_tool_error_code_validation():
    assert ToolError("m").code == "tool_error"
    assert ToolError("m", code="not_found").code == "not_found"
    assert ToolError("m", code="has space").code == "tool_error"
    assert ToolError("m", code="").code == "tool_error"


async def test_invoke_outcomes():
    @tool
    async def ok(x: int) -> dict[str, Any]:
        return {"x": x, "t": (1, 2)}

    @tool
    async def fails() -> None:
        raise ToolError("portal said no", code="portal_refused")

    @tool
    async def crashes() -> None:
        raise RuntimeError("boom " * 1000)

    @tool
    async def unserialisable() -> object:
        return object()

    @tool
    async def nan() -> float:
        return float("nan")

    @tool
    async def huge() -> str:
        return "x" * (1024 * 1024)

    result = await invoke(tool_of(ok), {"x": 3})
    assert result.ok and result.result == {"x": 3, "t": [1, 2]}  # normalised to JSON

    result = await invoke(tool_of(ok), {"x": 3, "y": 4})
    assert result.code == BAD_ARGS and result.error.message == (
        "ok: y: unexpected argument (this tool takes ['x'])"
    )

    result = await invoke(tool_of(fails), {})
    assert (result.code, result.error.message) == ("portal_refused", "portal said no")

    result = await invoke(tool_of(crashes), {})
    assert result.code == CRASHED
    assert result.error.message.startswith("RuntimeError('boom boom")
    assert len(result.error.message) == 2000 and result.error.message.endswith("...")

    @tool
    async def deep() -> list:
        value: list = []
        for _ in range(5000):
            value = [value]
        return value

    @tool
    async def nested_900() -> list:
        value: list = []
        for _ in range(900):
            value = [value]
        return value

    for bad in (unserialisable, nan, huge, deep):
        assert (await invoke(tool_of(bad), {})).code == BAD_RESULT
    outcome = await invoke(tool_of(nested_900), {})
    if outcome.ok:  # whatever the verdict, an ok outcome must be sendable
        encode_frame(outcome.reply("d"))


async def test_sync_tools_run_in_a_worker_thread():
    @tool
    def where() -> int:
        return threading.get_ident()

    outcome = await invoke(tool_of(where), {})
    assert outcome.ok and outcome.result != threading.get_ident()


async def test_builtin_sleep_and_echo(autojump_clock):
    registry = ToolRegistry()
    start = trio.current_time()
    outcome = await invoke(registry.get("sleep"), {"seconds": 2.5})
    assert outcome.result == {"slept_s": 2.5} and trio.current_time() - start == 2.5
    for bad in (-1, "1", True, float("inf"), 1e308, 86_400.5):
        assert (await invoke(registry.get("sleep"), {"seconds": bad})).code == BAD_ARGS
    # the longest call (one day) is the longest sleep that can still be waited for
    assert (await invoke(registry.get("sleep"), {"seconds": 86_400})).ok
    args = {"a": [1, {"b": None}], "c": "d"}
    assert (await invoke(registry.get("echo"), args)).result == args


def test_a_catalogue_that_does_not_fit_in_hello_is_refused_early():
    from deskbridge_sidecar import Daemon

    tools = []
    for i in range(300):

        def f() -> None:
            return None

        tools.append(tool(name=f"t{i}")(f))
    with pytest.raises(ValueError, match="catalogue"):
        Daemon("ws://h:1", "t", registry=ToolRegistry(tools))
    with pytest.raises(ValueError, match="ws://"):
        Daemon("h:1", "t")
