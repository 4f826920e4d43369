"""The daemon's hello fields of issue 12 (``daemon_id``, ``slept_s``) and its
``going_to_sleep`` (``sleeping`` then close 1000, then wait for the wake-up), against
the FakeHub on MockClock; the instance id's life in the ledger file."""

from __future__ import annotations

import logging

import pytest
import trio
from deskbridge_common import Sleeping
from deskbridge_sidecar._ledger import Ledger
from deskbridge_sidecar._sleep import SLEEP_PAUSE_S

from .conftest import make_daemon


def test_the_instance_id_lives_as_long_as_the_ledger_file(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    first = Ledger.open(path)
    first_id = first.instance_id
    first.close()
    again = Ledger.open(path)
    assert again.instance_id == first_id  # a restart with the same data dir: the same daemon
    again.close()
    other = Ledger.open(tmp_path / "other" / "ledger.sqlite3")
    assert other.instance_id != first_id
    other.close()
    assert Ledger.memory().instance_id != Ledger.memory().instance_id


def test_a_corrupt_ledger_moved_aside_gets_a_new_instance_id(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger.open(path)
    old = ledger.instance_id
    ledger.close()
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.ERROR):
        fresh = Ledger.open(path)
    assert fresh.moved_aside is not None
    assert fresh.instance_id != old  # its records are gone: it must not vouch for them
    fresh.close()


async def test_hello_names_the_daemon_instance_on_every_connection(
    autojump_clock, nursery, hub, wall, tmp_path
):
    daemon = make_daemon(hub, wall, data_dir=tmp_path)
    await nursery.start(daemon.run)
    first = await hub.next_session()
    assert first.hello is not None and first.hello.daemon_id
    assert first.hello.slept_s is None
    await first.close(1001, "going away")
    second = await hub.next_session()
    assert second.hello is not None and second.hello.daemon_id == first.hello.daemon_id
    daemon.stop()
    await trio.sleep(1)
    restarted = make_daemon(hub, wall, data_dir=tmp_path)  # same data dir: same ledger
    nursery.start_soon(restarted.run)
    third = await hub.next_session()
    assert third.hello is not None and third.hello.daemon_id == first.hello.daemon_id


async def test_a_clock_gap_is_told_in_the_next_hello_once(autojump_clock, start_daemon, hub, wall):
    daemon, s = await start_daemon()
    await trio.sleep(3.5)
    wall.jump(12)  # the lid was closed for 12 s
    await s.wait_closed()
    second = await hub.next_session()
    assert second.hello is not None and second.hello.slept_s == pytest.approx(12.0)
    await second.close(1001, "going away")
    third = await hub.next_session()
    assert third.hello is not None and third.hello.slept_s is None  # told once, welcomed


async def test_the_gap_is_kept_until_a_session_is_welcomed(autojump_clock, start_daemon, hub, wall):
    daemon, s = await start_daemon()
    await trio.sleep(3.5)
    hub.reject_status = 503  # the network is not back yet after the wake-up
    wall.jump(20)
    await s.wait_closed()
    await hub.wait_attempts(3)
    hub.reject_status = None
    back = await hub.next_session()
    assert back.hello is not None and back.hello.slept_s == pytest.approx(20.0)


async def test_going_to_sleep_says_sleeping_closes_then_waits_for_the_wake_up(
    autojump_clock, start_daemon, hub, wall
):
    daemon, s = await start_daemon()
    daemon.going_to_sleep()
    closed = await s.wait_closed()
    assert (closed.by, closed.code, closed.reason) == ("sidecar", 1000, "going to sleep")
    assert isinstance(s.received[-1], Sleeping)
    asleep_at = trio.current_time()
    await trio.sleep(10)
    assert len(hub.sessions) == 1  # no reconnect while the machine goes to sleep
    wall.jump(3600)  # slept an hour
    back = await hub.next_session()
    assert trio.current_time() - asleep_at < 15  # reconnected at the wake-up
    assert back.hello is not None and back.hello.slept_s == pytest.approx(3600.0, abs=2)


async def test_a_sleep_that_never_comes_reconnects_after_the_pause(
    autojump_clock, start_daemon, hub
):
    daemon, s = await start_daemon()
    daemon.going_to_sleep()
    await s.wait_closed()
    asleep_at = trio.current_time()
    back = await hub.next_session()
    assert SLEEP_PAUSE_S <= trio.current_time() - asleep_at < SLEEP_PAUSE_S + 2
    assert back.hello is not None and back.hello.slept_s is None


async def test_going_to_sleep_between_sessions_does_nothing(autojump_clock, nursery, hub, wall):
    daemon = make_daemon(hub, wall)
    daemon.going_to_sleep()  # no session yet: nothing to tell
    await nursery.start(daemon.run)
    assert len(hub.sessions) == 1
