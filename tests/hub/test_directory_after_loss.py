"""Redis lost its data (restarted empty) while desktops stayed connected: presence and
catalogues were rewritten within a second, but the admin directory, written only at a
session's start and end, stayed empty ("none of 0 desktops", ``inspect user`` said
"since -") until each desktop reconnected. A beat that retakes presence now records the
session again. MemorySubstrate, memory sockets, MockClock (autojump)."""

from __future__ import annotations

import json

import trio
import trio.testing

from .test_session_end_log import connect, make_state


async def listed(state) -> dict[str, str]:
    page = await state.substrate.list_desktops(offset=0, limit=10)
    users = [u for u, _ in page.rows]
    infos = await state.substrate.desktops_info(users)
    pairs = zip(users, infos, strict=True)
    return {u: json.loads(info)["session_id"] for u, (_, info, _, _) in pairs if info}


async def test_the_directory_is_written_again_when_presence_is_retaken(autojump_clock):
    state = make_state()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, sid = await connect(nursery, state)
            await trio.testing.wait_all_tasks_blocked()  # its start is recorded
            assert await listed(state) == {"u1": sid}
            state.substrate._kv.clear()  # Redis restarted empty
            state.substrate.__dict__["_directory_index"].clear()
            assert await listed(state) == {}
            await trio.sleep(3)  # the liveness loop finds its key gone: a full beat
            assert await state.substrate.get_presence("u1") == sid
            assert await listed(state) == {"u1": sid}
            nursery.cancel_scope.cancel()
