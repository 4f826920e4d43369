"""A tool whose catalogue entry is not valid Unicode (``--tools odd_catalogue_tools``):
its description and schema name a folder whose name is not UTF-8, as ``os.fsdecode``
gives it on Linux (a lone surrogate)."""

from __future__ import annotations

import os

from deskbridge_sidecar import tool

#: A Latin-1 folder name as Python sees it: ``b"caf\xe9"`` is not UTF-8.
ODD_FOLDER = os.fsdecode(b"caf\xe9")


@tool(
    description=f"Return NAME, a file of {ODD_FOLDER}.",
    args_schema={
        "type": "object",
        "properties": {"name": {"type": "string", "description": f"a file in {ODD_FOLDER}"}},
        "required": ["name"],
    },
)
async def in_odd_folder(name: str) -> dict:
    return {"name": name}
