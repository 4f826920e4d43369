"""A hub process imports the MCP SDK only when its first MCP request arrives (issue 16):
the SDK and its models were about 40 % of a pod's start-up, which churn pays on every
restart (``_mcp_mount._mcp_module``)."""

from __future__ import annotations

import subprocess
import sys


def test_the_hub_app_and_cli_import_no_mcp_sdk():
    code = (
        "import sys, deskbridge_hub, deskbridge_hub.cli, deskbridge_hub._app;"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types'));"
        "print(loaded[:5]); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
