"""The desktop directory (admin API index), one contract on both substrates: written at
session start and end, paged newest first, old entries dropped, info read in one go.
Real Redis uses its own database (15) so the suite's other hubs do not share the index."""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from deskbridge_hub import SubstrateUnavailable
from deskbridge_hub._directory import INDEX_KEY, RETENTION_S
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._memory_desktop import encode_asleep
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate_values import Asleep

from tests.conftest import REDIS_URL, RawRedis

DB15 = urlunsplit(urlsplit(REDIS_URL)._replace(path="/15"))


@pytest.fixture(params=["memory", "redis"])
async def substrate(request) -> AsyncIterator[object]:
    if request.param == "memory":
        yield MemorySubstrate()
        return
    await RawRedis(DB15)("DEL", INDEX_KEY)
    sub = RedisSubstrate(DB15)
    async with sub:
        yield sub


async def test_record_list_and_info(substrate) -> None:
    tag = secrets.token_hex(3)
    users = [f"dir-{tag}-{i}" for i in range(5)]
    for i, user in enumerate(users):
        await substrate.record_desktop(user, json.dumps({"n": i}), at_s=1_800_000_000.0 + i)
    page = await substrate.list_desktops(offset=0, limit=2)
    assert page.total == 5
    assert page.rows == ((users[4], 1_800_000_004.0), (users[3], 1_800_000_003.0))
    page = await substrate.list_desktops(offset=4, limit=2)
    assert page.rows == ((users[0], 1_800_000_000.0),)
    # A newer session start moves a user to the front; one row per user.
    await substrate.record_desktop(users[0], json.dumps({"n": "again"}), at_s=1_800_000_010.5)
    page = await substrate.list_desktops(offset=0, limit=10)
    assert [u for u, _ in page.rows] == [users[0], users[4], users[3], users[2], users[1]]
    assert page.rows[0][1] == 1_800_000_010.5
    await substrate.set_presence(users[1], "sess-1", 30.0)
    await substrate.set_catalogue(users[1], '[{"name": "echo"}]')
    asleep = Asleep(1_800_000_011.0, "announced")
    await substrate.set_asleep(users[0], asleep, ttl_s=30.0)
    info = await substrate.desktops_info([users[1], users[0], "nobody-" + tag])
    assert info == [
        ("sess-1", json.dumps({"n": 1}), '[{"name": "echo"}]', None),
        (None, json.dumps({"n": "again"}), None, encode_asleep(asleep)),
        (None, None, None, None),
    ]
    assert await substrate.desktops_info([]) == []


async def test_entries_older_than_the_retention_are_dropped(substrate) -> None:
    tag = secrets.token_hex(3)
    await substrate.record_desktop(f"old-{tag}", "{}", at_s=1_000.0)
    await substrate.record_desktop(f"new-{tag}", "{}", at_s=1_000.0 + RETENTION_S + 1)
    page = await substrate.list_desktops(offset=0, limit=10)
    assert [u for u, _ in page.rows] == [f"new-{tag}"]


async def test_unavailable_is_mapped() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sub = RedisSubstrate(f"redis://127.0.0.1:{port}/0", connect_timeout_s=1.0)
    with pytest.raises(SubstrateUnavailable):
        await sub.list_desktops(offset=0, limit=1)
    with pytest.raises(SubstrateUnavailable):
        await sub.record_desktop("u", "{}", at_s=1.0)


async def test_a_stale_session_never_overwrites_a_newer_sessions_record(substrate) -> None:
    """A hub process stopped for 40 s (SIGSTOP, a paused VM) resumes and ends its old
    sessions (4002) after their desktops reconnected elsewhere: its end writes must not
    replace the newer sessions' records (the listing said online on the stopped
    process, since null, with the old session's end). Fenced on presence and the
    record's own session id."""
    user = f"stale-{secrets.token_hex(3)}"

    def record(session_id: str, **extra: object) -> str:
        return json.dumps({"session_id": session_id, "consumer": f"hub-{session_id}", **extra})

    await substrate.set_presence(user, "old", 30.0)
    await substrate.record_desktop(user, record("old"), at_s=1_800_000_000.0, session_id="old")
    await substrate.set_presence(user, "new", 30.0)  # the desktop moved
    await substrate.record_desktop(user, record("new"), at_s=1_800_000_050.0, session_id="new")
    # the old session ends late: presence names the new one
    await substrate.record_desktop(
        user, record("old", ended_at=1_800_000_060.0), at_s=1_800_000_060.0,
        session_id="old", ending=True,
    )  # fmt: skip
    # a late start (or a beat's rewrite) of the old session: refused the same way
    await substrate.record_desktop(user, record("old"), at_s=1_800_000_061.0, session_id="old")
    (info,) = await substrate.desktops_info([user])
    assert json.loads(info[1])["session_id"] == "new"
    # the new session ends (its presence cleared first): recorded
    await substrate.clear_presence(user, "new")
    ended = record("new", ended_at=1_800_000_070.0)
    await substrate.record_desktop(user, ended, at_s=1_800_000_070.0, session_id="new", ending=True)
    # presence gone now, but the record is the new session's: the old end stays refused
    await substrate.record_desktop(
        user, record("old", ended_at=1_800_000_080.0), at_s=1_800_000_080.0,
        session_id="old", ending=True,
    )  # fmt: skip
    (info,) = await substrate.desktops_info([user])
    assert info[1] == ended


async def test_a_resumed_process_ending_its_old_session_keeps_the_new_record(substrate) -> None:
    """The session hooks end to end: the old session's end (``disconnected``, after its
    presence was taken by the desktop's new session on another process) leaves the new
    session's record, so the admin row names the process that holds the desktop."""
    from types import SimpleNamespace

    from deskbridge_hub import _directory

    user = f"resumed-{secrets.token_hex(3)}"

    def session(session_id: str, consumer: str, at_s: float) -> SimpleNamespace:
        state = SimpleNamespace(substrate=substrate, consumer=consumer, wall_clock=lambda: at_s)
        return SimpleNamespace(user_id=user, session_id=session_id, hello=None, state=state)

    old = session("old-sess", "stopped-hub", 1_800_000_000.0)
    await substrate.set_presence(user, old.session_id, 30.0)
    await _directory.connected(old)
    new = session("new-sess", "other-hub", 1_800_000_040.0)
    await substrate.set_presence(user, new.session_id, 30.0)
    await _directory.connected(new)
    old.state.wall_clock = lambda: 1_800_000_041.0  # the stopped process resumes
    await _directory.disconnected(old, 4002, "nothing from the sidecar")
    (info,) = await substrate.desktops_info([user])
    assert json.loads(info[1])["consumer"] == "other-hub"
    await substrate.clear_presence(user, new.session_id)
    await _directory.disconnected(new, 1000, "socket closed")
    (info,) = await substrate.desktops_info([user])
    assert json.loads(info[1])["end"] == {"code": 1000, "reason": "socket closed"}
