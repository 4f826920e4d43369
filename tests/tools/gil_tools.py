"""Tools for the process-isolation tests (``--tools gil_tools``)."""

from __future__ import annotations

import os

from deskbridge_sidecar import ToolError, isolated, tool


@isolated
@tool(description="Sum range(n) in one C call that holds the GIL throughout.")
def crunch(n: int) -> dict:
    return {"sum": sum(range(n)), "pid": os.getpid()}


@isolated
@tool(description="Fail the way a tool fails.")
def refuse(why: str) -> None:
    raise ToolError(why, code="refused")


@tool(description="Sum range(n) in this process (a worker thread).")
def crunch_here(n: int) -> dict:
    return {"sum": sum(range(n)), "pid": os.getpid()}
