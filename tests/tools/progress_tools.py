"""A long tool that reports progress (``--tools progress_tools``)."""

from __future__ import annotations

import trio
from deskbridge_sidecar import Progress, tool


@tool(description="Count to N, one step every DELAY_S seconds, reporting progress.")
async def count(n: int, delay_s: float, progress: Progress) -> dict:
    for i in range(n):
        await trio.sleep(delay_s)
        progress(i + 1, total=n, message=f"{i + 1}/{n}")
    return {"counted": n}
