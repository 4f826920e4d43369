"""docs/tools.md's examples, executed as a tool author copies them: every ``python``
block of the page runs as one module, and each tool it defines is called through the
sidecar's own ``invoke`` with the arguments a caller would send. The blocks used names
they never defined (``invoices``: a ``NameError``, answered ``crashed``) and bodies of
``...`` (a tool typed ``-> dict`` that returned ``None``)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
from deskbridge_sidecar import ToolRegistry, invoke
from deskbridge_sidecar._progress import Progress, ProgressState

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


@pytest.fixture
def registry() -> ToolRegistry:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert len(blocks) >= 3
    module = types.ModuleType("tools_md_examples")
    exec(compile("\n".join(blocks), str(DOC), "exec"), module.__dict__)  # noqa: S102
    reg = ToolRegistry(builtins=False)
    reg.add_module(module)
    return reg


async def test_every_example_tool_is_offered(registry: ToolRegistry) -> None:
    assert sorted(registry.names()) == ["export_invoices", "pay", "submit_form", "submit_invoice"]
    specs = {spec.name: spec for spec in registry.specs()}
    assert specs["pay"].approval_after_wait_s == 0
    assert specs["submit_form"].approval_after_wait_s == 60
    schema = specs["submit_invoice"].args_schema
    assert schema["required"] == ["invoice", "portal"]
    assert schema["properties"]["retries"]["maximum"] == 5
    assert "progress" not in specs["export_invoices"].args_schema["properties"]


async def test_submit_invoice_returns_data_or_its_tool_error(registry: ToolRegistry) -> None:
    tool = registry.get("submit_invoice")
    assert tool is not None
    done = await invoke(tool, {"invoice": {"number": "A-1", "total_cents": 100}, "portal": "acme"})
    assert done.ok, done
    assert done.result == {"portal": "acme", "number": "A-1", "retries": 1}
    empty = await invoke(tool, {"invoice": {"number": "A-2", "total_cents": 0}, "portal": "acme"})
    assert not empty.ok and empty.error is not None and empty.error.code == "empty_invoice"
    typed = await invoke(tool, {"invoice": {"number": "A-3", "total_cents": "1"}, "portal": "x"})
    assert typed.error is not None and typed.error.code == "bad_args"


async def test_export_invoices_reports_progress_and_returns(
    registry: ToolRegistry, autojump_clock
) -> None:
    tool = registry.get("export_invoices")
    assert tool is not None
    state = ProgressState()
    done = await invoke(tool, {"month": "2026-11"}, progress=Progress(state))
    assert done.ok, done
    assert done.result == {"exported": 5}
    assert state.latest is not None
    assert (state.latest.progress, state.latest.total, state.latest.message) == (
        5,
        5,
        "2026-11-005",
    )


@pytest.mark.parametrize(
    ("name", "args"), [("pay", {"invoice": "A-1"}), ("submit_form", {"form": "f"})]
)
async def test_the_approval_examples_run_once_approved(
    registry: ToolRegistry, name: str, args: dict[str, str]
) -> None:
    tool = registry.get(name)
    assert tool is not None
    done = await invoke(tool, args)
    assert done.ok and isinstance(done.result, dict), done
