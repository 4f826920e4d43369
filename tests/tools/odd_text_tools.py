"""Tools whose text is not valid Unicode (``--tools odd_text_tools``): what a tool gets
from the file system or a C library on Linux, where a name need not be UTF-8 (Python
decodes it with lone surrogates, ``os.fsdecode``). Starts are appended to
``DESKBRIDGE_TEST_LEDGER`` like ``counting_tools``."""

from __future__ import annotations

import os
import time

from counting_tools import _append
from deskbridge_sidecar import Progress, ToolError, tool

#: A Latin-1 file name as Python sees it: ``b"caf\xe9.txt"`` is not UTF-8.
ODD_NAME = os.fsdecode(b"caf\xe9.txt")


@tool(side_effects=True, description="Record KEY, then return a file name that is not UTF-8.")
async def odd_name(key: str, progress: Progress) -> dict:
    _append("start", key, time.time())
    progress(1, total=1, message=f"found {ODD_NAME}")
    return {"key": key, "name": ODD_NAME}


@tool(description="Fail naming a file whose name is not UTF-8.")
async def odd_error() -> dict:
    raise ToolError(f"cannot open {ODD_NAME}")
