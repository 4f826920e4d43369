"""Fixtures for sidecar tests: a FakeHub on the test's nursery, a fake wall clock, and a
factory that starts a Daemon against it and returns the first hub-side session.

Deterministic tests request pytest-trio's ``autojump_clock``; only the real-socket tests
run on the real clock (each bounded with ``fail_after``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
import trio
from deskbridge_common import Timings
from deskbridge_sidecar import Daemon, ToolRegistry
from deskbridge_sidecar.testing import FakeHub, FakeHubSession, FakeWallClock

TOKEN = "t0k3n"
HUB_URL = "ws://hub.test:8080"

StartDaemon = Callable[..., Awaitable[tuple[Daemon, FakeHubSession]]]


@pytest.fixture
def wall() -> FakeWallClock:
    return FakeWallClock()


@pytest.fixture
async def hub(nursery: trio.Nursery, wall: FakeWallClock) -> FakeHub:
    fake = FakeHub(token=TOKEN, wall_clock=wall)
    await nursery.start(fake.serve)
    return fake


def make_daemon(
    hub: FakeHub,
    wall: FakeWallClock,
    *,
    tools: Iterable[Any] = (),
    timings: Timings | None = None,
    random: Callable[[], float] = lambda: 0.5,
    token: str = TOKEN,
    **extra: Any,
) -> Daemon:
    return Daemon(
        HUB_URL,
        token,
        registry=ToolRegistry(tools),
        timings=timings or Timings(),
        wall_clock=wall,
        connector=hub,
        random=random,
        **extra,
    )


@pytest.fixture
def start_daemon(nursery: trio.Nursery, hub: FakeHub, wall: FakeWallClock) -> StartDaemon:
    """``daemon, session = await start_daemon(tools=[...], timings=..., random=...)``."""

    async def start(**kwargs: Any) -> tuple[Daemon, FakeHubSession]:
        daemon = make_daemon(hub, wall, **kwargs)
        session_id = await nursery.start(daemon.run)
        session = await hub.next_session()
        assert session.session_id == session_id
        return daemon, session

    return start


async def settle() -> None:
    """Let every task run until all are blocked (no virtual time passes)."""
    await trio.testing.wait_all_tasks_blocked()
