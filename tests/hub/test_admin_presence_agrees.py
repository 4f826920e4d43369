"""The admin API's ``online`` is decided as a call's presence is (``Bridge.presence``):
the holder process's liveness (``bridge:proc:{h}``: a dead holder reads offline) and
this process's presence doubt (``_own_liveness``: no presence while its own writes are
in doubt is not "offline"). Was: the admin views read the raw presence key, so an
operator saw ``online`` for a desktop whose calls were answered ``offline``, and
``offline`` where calls were answered ``unavailable``."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

from deskbridge_hub import HubConfig, create_app
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._own_liveness import own_liveness

API = "/v1/admin"


@asynccontextmanager
async def _served():
    """The app on a fresh memory substrate, served in-process: yields (substrate, client)."""
    substrate = MemorySubstrate()
    app = create_app(HubConfig(secrets=("s" * 40,)), substrate=substrate)
    async with app.test_app() as test_app:
        yield substrate, test_app.test_client()


async def _admin_views(client, user: str) -> tuple[dict, dict]:
    one = await (await client.get(f"{API}/users/{user}")).get_json()
    page = await (await client.get(f"{API}/desktops", query_string={"limit": 500})).get_json()
    rows = [d for d in page["desktops"] if d["user_id"] == user]
    return one, rows[0] if rows else {}


async def test_a_dead_holder_s_desktop_is_offline_to_the_operator_too(autojump_clock):
    async with _served() as (substrate, client):
        user = "adm-dead"
        # a session of a process whose liveness key is gone (killed: kill -9)
        await substrate.set_presence(user, "deadprocess00001.abc", ttl_s=30)
        presence = await (await client.get(f"/v1/users/{user}/presence")).get_json()
        assert presence["online"] is False
        call = await client.post(f"/v1/users/{user}/jobs", json={"name": "echo", "timeout_s": 5})
        assert call.status_code == 503 and (await call.get_json())["status"] == "offline"
        one, _ = await _admin_views(client, user)
        assert one["online"] is False and one["session_id"] is None
        assert one["status"] == "offline"

        # its process alive again (a stalled one that came back): online everywhere
        await substrate.set_liveness("deadprocess00001", 30)
        autojump_clock.jump(2.0)  # past the dead-holder cache
        presence = await (await client.get(f"/v1/users/{user}/presence")).get_json()
        assert presence["online"] is True
        one, _ = await _admin_views(client, user)
        assert one["online"] is True and one["session_id"] == "deadprocess00001.abc"
        assert one["status"] == "online"


async def test_a_listed_dead_holder_s_desktop_is_offline(autojump_clock):
    async with _served() as (substrate, client):
        user = "adm-dead-listed"
        await substrate.set_presence(user, "deadprocess00002.abc", ttl_s=30)
        record = {"session_id": "deadprocess00002.abc", "connected_at": 1.0}
        await substrate.record_desktop(user, json.dumps(record), at_s=1.0)  # as a handshake
        _, row = await _admin_views(client, user)
        assert row["online"] is False and row["session_id"] is None
        assert "queue" not in row


async def test_no_presence_in_doubt_is_unknown_to_the_operator(autojump_clock):
    """While this process's own writes are in doubt a call finding no presence is
    answered ``unavailable`` (503), not ``offline``: the admin views say ``online:
    null``, status ``unknown``, not a confident offline."""
    async with _served() as (substrate, client):
        user = "adm-doubt"
        record = {"session_id": "p.s", "connected_at": 1.0, "ended_at": 2.0}
        await substrate.record_desktop(user, json.dumps(record), at_s=2.0)
        own_liveness().answered(kept=False)  # a refresh found its own key lapsed
        r = await client.get(f"/v1/users/{user}/presence")
        assert r.status_code == 503
        one, row = await _admin_views(client, user)
        assert one["online"] is None and one["status"] == "unknown"
        assert row["online"] is None and row["session_id"] is None


async def test_an_asleep_desktop_is_asleep_in_every_view(autojump_clock):
    """A desktop that said it went to sleep: presence says ``asleep``, a call is answered
    ``offline`` with ``detail.reason`` ``asleep``, the admin user view says ``asleep``;
    the desktops list (and ``inspect desktops``, which prints it) said ``offline``, as
    it had no ``status``: now every row has the user view's ``status``."""
    from deskbridge_hub._inspect_cli import desktops_table
    from deskbridge_hub._substrate_values import Asleep

    async with _served() as (substrate, client):
        user = "adm-asleep"
        record = {"session_id": "p.s", "connected_at": 1.0, "ended_at": 2.0}
        await substrate.record_desktop(user, json.dumps(record), at_s=2.0)
        await substrate.set_asleep(user, Asleep(2.0, "announced"), ttl_s=3600)
        presence = await (await client.get(f"/v1/users/{user}/presence")).get_json()
        assert presence["status"] == "asleep"
        call = await client.post(f"/v1/users/{user}/jobs", json={"name": "echo", "timeout_s": 5})
        assert (await call.get_json())["detail"]["reason"] == "asleep"
        one, row = await _admin_views(client, user)
        assert one["status"] == row["status"] == "asleep"
        assert row["online"] is False
        page = await (await client.get(f"{API}/desktops")).get_json()
        assert desktops_table(page).splitlines()[1].split()[:2] == [user, "asleep"]
        # the other states, as the user view says them
        await substrate.clear_asleep(user)
        one, row = await _admin_views(client, user)
        assert one["status"] == row["status"] == "offline"
        own_liveness().answered(kept=False)  # no presence while in doubt: unknown
        one, row = await _admin_views(client, user)
        assert one["status"] == row["status"] == "unknown"
