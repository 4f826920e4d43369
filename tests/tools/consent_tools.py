"""A tool that needs the person's approval, for the real-process consent test
(``--tools consent_tools``). It records each start in the counting ledger
(``DESKBRIDGE_TEST_LEDGER``, see ``counting_tools``), the oracle of "it ran"."""

from __future__ import annotations

import time

from counting_tools import _append
from deskbridge_sidecar import needs_approval, tool


@needs_approval
@tool(side_effects=True, description="Pay invoice KEY (asks the person at the desktop first).")
async def pay(key: str) -> dict:
    _append("start", key, time.time())
    _append("end", key, time.time())
    return {"paid": key}
