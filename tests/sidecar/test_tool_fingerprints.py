"""A tool's fingerprint (``Tool.fingerprint``) covers everything that decides what a queued
call does, so a restart that changes it refuses the jobs validated before
(``catalogue_changed``), and nothing else: options that only change *how* a tool runs
leave it alone."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from deskbridge_sidecar import Tool, ToolRegistry
from deskbridge_sidecar.toolsets import BrowserToolset
from deskbridge_sidecar.toolsets.files import FilesToolset

#: any executable file: the browser starts only at the first browser tool
EXECUTABLE = sys.executable


def _browser(tmp_path: Path, origins: list[str], **kw: object) -> dict[str, str]:
    kw.setdefault("profile_dir", str(tmp_path / "profile"))
    toolset = BrowserToolset(origins, executable_path=EXECUTABLE, headless=True, **kw)  # type: ignore[arg-type]
    return {t.name: t.fingerprint() for t in toolset.tools()}


def test_the_browser_tools_change_with_the_allowed_origins(tmp_path):
    """Before: a browser_open queued while only https://a.example was allowed ran after a
    restart with another --browser-origin list (and the other way round)."""
    a = _browser(tmp_path, ["https://a.example"])
    assert _browser(tmp_path, ["https://a.example"]) == a
    for other in (["https://b.example"], ["https://a.example", "https://b.example"],
                  ["https://*.example"]):  # fmt: skip
        b = _browser(tmp_path, other)
        assert all(a[name] != b[name] for name in a), other


def test_the_browser_tools_change_with_the_profile_they_act_as(tmp_path):
    """--browser-profile is whose signed-in sessions a click acts with."""
    a = _browser(tmp_path, ["https://a.example"], profile_dir=str(tmp_path / "alice"))
    b = _browser(tmp_path, ["https://a.example"], profile_dir=str(tmp_path / "bob"))
    assert all(a[name] != b[name] for name in a)


def test_how_the_browser_runs_does_not_change_its_tools(tmp_path):
    """A window or not, and which binary: the same calls do the same things."""
    a = _browser(tmp_path, ["https://a.example"])
    toolset = BrowserToolset(
        ["https://a.example"], profile_dir=str(tmp_path / "profile"),
        executable_path="/bin/sh", headless=False,
    )  # fmt: skip
    assert {t.name: t.fingerprint() for t in toolset.tools()} == a


def test_the_order_of_the_origins_does_not_change_the_browser_tools(tmp_path):
    one = _browser(tmp_path, ["https://a.example", "https://b.example"])
    assert _browser(tmp_path, ["https://b.example", "https://a.example"]) == one


def test_the_files_tools_change_with_their_size_limits(tmp_path):
    a = {t.name: t.fingerprint() for t in FilesToolset([tmp_path]).tools()}
    b = {t.name: t.fingerprint() for t in FilesToolset([tmp_path], max_write_bytes=10).tools()}
    assert a["files_write"] != b["files_write"]


@pytest.fixture
def two_modules(tmp_path, monkeypatch):
    """Two --tools modules offering a ``submit`` with the same entry (name, docstring,
    schema, side effects) that does something else."""
    for name, does in (("shop_a", "order"), ("shop_b", "cancel")):
        (tmp_path / f"{name}.py").write_text(
            textwrap.dedent(
                f'''
                from deskbridge_sidecar import tool

                @tool(side_effects=True)
                def submit(order_id: str) -> str:
                    """Submit the order."""
                    return "{does}"
                '''
            )
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("shop_a", "shop_b"):
        sys.modules.pop(name, None)


def test_a_tool_of_another_tools_module_is_another_tool(two_modules):
    """Before: `--tools shop_a` restarted as `--tools shop_b` ran shop_a's queued
    submits with shop_b's function: the catalogue entries were identical."""
    a, b = ToolRegistry(), ToolRegistry()
    a.add_module("shop_a")
    b.add_module("shop_b")
    assert a.get("submit").spec() == b.get("submit").spec()  # type: ignore[union-attr]
    assert a.get("submit").fingerprint() != b.get("submit").fingerprint()  # type: ignore[union-attr]
    again = ToolRegistry()
    again.add_module("shop_a")
    assert again.get("submit").fingerprint() == a.get("submit").fingerprint()  # type: ignore[union-attr]


def test_a_bound_method_keeps_its_fingerprint_across_instances(tmp_path):
    """A toolset's tools are bound methods: a new instance (a restart) with the same
    configuration is the same tool."""
    assert [t.fingerprint() for t in FilesToolset([tmp_path]).tools()] == [
        t.fingerprint() for t in FilesToolset([tmp_path]).tools()
    ]


def test_a_plain_tool_fingerprint_is_stable_and_names_its_function():
    def one(x: int) -> int:
        """Same entry."""
        return x

    def two(x: int) -> int:
        """Same entry."""
        return -x

    assert Tool.from_function(one).fingerprint() == Tool.from_function(one).fingerprint()
    a = Tool.from_function(one, name="t").fingerprint()
    assert a != Tool.from_function(two, name="t").fingerprint()
