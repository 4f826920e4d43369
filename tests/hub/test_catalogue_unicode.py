"""A catalogue holding text that is not valid Unicode (a lone surrogate, as an older
sidecar sends a description or schema built from a file name that is not UTF-8): the
hub stores it with U+FFFD in its place, so ``GET /v1/users/{id}/tools`` answers valid
text and MCP ``tools/list`` answers at all (it failed for the user in both protocol
modes). Refusing the hello (1007) instead would leave the whole desktop unusable: the
sidecar would say the same hello at every reconnect."""

from __future__ import annotations

import json
import types as pytypes

import trio
from deskbridge_common import ToolSpec
from deskbridge_hub._mcp import UserEndpoint

from tests.hub.test_outcomes import bridge, connect, ignore, sidecar, state  # noqa: F401
from tests.sidecar.test_outcome_unicode import ODD, ODD_SCHEMA


async def test_an_older_sidecars_catalogue_with_a_lone_surrogate_is_stored_as_valid_text(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    async with trio.open_nursery() as nursery:
        spec = ToolSpec("pick", f"Pick a file in {ODD}", ODD_SCHEMA, False)
        peer = await connect(nursery, state, [spec, ToolSpec("plain", "plain")])
        nursery.start_soon(sidecar, peer, ignore)
        catalogue = await bridge.tools("u1")
        assert catalogue is not None
        json.dumps(catalogue, ensure_ascii=False).encode("utf-8")  # valid text only
        pick = next(t for t in catalogue if t["name"] == "pick")
        assert pick["description"] == "Pick a file in caf\ufffd"
        assert pick["args_schema"]["properties"]["caf\ufffd"] == {"enum": ["caf\ufffd", "plain"]}
        listed = await UserEndpoint("u1", bridge)._list_tools(
            pytypes.SimpleNamespace(session=None),  # type: ignore[arg-type]
            None,
        )
        assert sorted(t.name for t in listed.tools) >= ["pick", "plain"]
        listed.model_dump_json().encode("utf-8")
        nursery.cancel_scope.cancel()
