"""Tools that misbehave on purpose (``--tools stubborn_tools``): one that never returns
and ignores cancellation. Starts are appended to ``DESKBRIDGE_TEST_LEDGER`` like
``counting_tools`` (``tests.procs.Ledger`` reads them)."""

from __future__ import annotations

import time

import trio
from counting_tools import _append
from deskbridge_sidecar import tool


@tool(side_effects=True, description="Record KEY, then never return, whatever happens.")
async def stubborn(key: str) -> dict:
    _append("start", key, time.time())
    with trio.CancelScope(shield=True):  # ignores cancellation on purpose
        await trio.sleep_forever()
    raise AssertionError("unreachable")
