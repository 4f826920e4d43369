"""An agent that uses a user's desktop through MCP: it lists the desktop's tools, then
fills and submits a web form in the user's own browser (the sidecar's browser toolset).

    python examples/mcp_agent.py --hub http://127.0.0.1:8080 --user alice \\
        --url http://127.0.0.1:8123/form --name Ada

The API key comes from ``--api-key`` or ``DESKBRIDGE_API_KEY``. The steps are scripted
here; a model-driven agent makes the same MCP calls, choosing them from the listed tools.
Exit status: 0 when the form was submitted and the confirmation read back, 1 otherwise
(one line on stderr saying why: hub unreachable, API key refused, no browser toolset).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from urllib.parse import urlsplit

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

#: The browser toolset's tools this agent calls.
NEEDED = ("browser_open", "browser_fill", "browser_click", "browser_text")


class Refused(Exception):
    """Why the agent cannot start, in one line."""


async def preflight(hub: str, user: str, api_key: str, url: str) -> None:
    """One plain HTTP call first, so a newcomer's usual mistakes are one line each
    (through MCP they were a traceback: "Server returned an error response")."""
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=10.0) as http:
        try:
            r = await http.get(f"{hub.rstrip('/')}/v1/users/{user}/tools")
        except httpx2.HTTPError as exc:
            raise Refused(f"cannot reach the hub at {hub}: {exc or type(exc).__name__}") from None
    if r.status_code == 401:
        raise Refused("the hub refused the API key (401): pass --api-key or DESKBRIDGE_API_KEY")
    if r.status_code != 200:
        raise Refused(f"the hub answered {r.status_code}: {r.text[:200]}")
    body = r.json()
    offered = {t["name"] for t in body.get("tools") or []}
    if not body.get("online"):
        raise Refused(f"{user}'s desktop is offline: start its sidecar (README)")
    missing = [n for n in NEEDED if n not in offered]
    if missing:
        parts = urlsplit(url)
        raise Refused(
            f"{user}'s desktop offers no {', '.join(missing)}: start its sidecar with "
            f"--browser-origin {parts.scheme}://{parts.netloc}"
        )


async def run(hub: str, user: str, api_key: str, url: str, name: str) -> int:
    await preflight(hub, user, api_key, url)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {api_key}"}, timeout=60.0)
    endpoint = f"{hub.rstrip('/')}/v1/users/{user}/mcp"
    async with http, Client(streamable_http_client(endpoint, http_client=http)) as client:
        tools = (await client.list_tools()).tools
        print(f"{len(tools)} tools on {user}'s desktop:")
        for t in tools:
            changes = (
                "read-only" if t.annotations and t.annotations.read_only_hint else "changes things"
            )
            print(f"  {t.name:<20} {changes:<15} {(t.description or '-').splitlines()[0][:60]}")

        async def call(tool: str, **args: object) -> dict:
            result = await client.call_tool(tool, args)
            shown = json.dumps(result.structured_content)[:120]
            print(f"-> {tool}({', '.join(f'{k}={v!r}' for k, v in args.items())}): {shown}")
            if result.is_error:
                raise RuntimeError(result.content[0].text)
            return result.structured_content

        await call("browser_open", url=url)
        await call("browser_fill", selector="#name", value=name)
        landed = await call("browser_click", selector="#send")
        confirmation = await call("browser_text", selector="#r")
    print(f"submitted; the page at {landed['url']} says: {confirmation['text']!r}")
    return 0 if name in confirmation["text"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", default="http://127.0.0.1:8080", help="hub HTTP URL")
    parser.add_argument("--user", required=True, help="whose desktop")
    parser.add_argument("--api-key", default=os.environ.get("DESKBRIDGE_API_KEY", ""))
    parser.add_argument("--url", required=True, help="the form page (an allowed origin)")
    parser.add_argument("--name", default="Ada", help="what to type in the form")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args.hub, args.user, args.api_key, args.url, args.name))
    except Refused as exc:
        print(f"mcp_agent: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"the desktop said: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
