"""MCP request bodies the tests send by hand (not through the SDK's client)."""

from __future__ import annotations

from typing import Any


def initialize_2025(client_name: str = "test") -> dict[str, Any]:
    """A 2025-era (handshake) ``initialize`` request, id 1, naming ``client_name``."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": client_name, "version": "1"},
        },
    }
