"""A Redis user refused only commands that operator views send (the desktops directory's
sorted set, a queue's XLEN) still serves calls: the hub refused every call before it
enqueued, as for a command the call path needs, so a missing dashboard grant took the
product down. Now those commands are a warning (start-up line at WARNING, ``/healthz``
200 with it in its body) and only the views that need them answer ``unavailable`` naming
the grant; a refused command the call path or its maintenance needs still refuses calls.
The classification (``VIEW_COMMANDS``) is pinned against the sources here."""

from __future__ import annotations

import logging
import re
import secrets
from pathlib import Path

import pytest
import trio
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._redis_health import (
    NEEDED_COMMANDS,
    VIEW_COMMANDS,
    Health,
    HealthMonitor,
    interpret,
    needed_command_name,
)

from ..procs import RedisServer
from .test_redis_health import LEAST_PRIVILEGE, PRIMARY
from .test_redis_health import redis_server as redis_server  # the fixture: its own server

HUB_SRC = Path(__file__).resolve().parents[2] / "hub" / "src" / "deskbridge_hub"
#: Modules that name commands without sending them for a purpose of their own: the
#: probe's list, the resend-safety and key-layout tables, the contract suite's raw reads.
_TABLES = {"_redis_health.py", "_redis_resend.py", "_redis_slots.py"}


def _senders(command: str) -> set[str]:
    """The hub modules that send ``command`` (its name quoted, as a command or inside a
    script: ``b"XLEN"``, ``'XLEN'``, ``b"XGROUP CREATE"``)."""
    word = re.compile(rf"""(["']){re.escape(command)}(\1| [A-Z]+\1)""")
    return {
        path.name
        for path in HUB_SRC.glob("*.py")
        if path.name not in _TABLES
        and not path.name.startswith("_contract")
        and word.search(path.read_text())
    }


# -- pure: the verdict ----------------------------------------------------------------------


def test_a_refused_operator_command_is_a_warning_not_a_cause() -> None:
    health = interpret(PRIMARY, "v", probe_value="v", refused=("ZCARD", "XLEN"))
    assert health.ok and health.refused == (), health
    assert health.views_refused == ("ZCARD", "XLEN")
    assert health.views_cause is not None
    assert "cannot run ZCARD" in health.views_cause
    assert "+zcard" in health.views_cause
    assert "desktops directory" in health.views_cause


def test_a_refused_call_path_command_stays_a_cause_beside_an_operator_one() -> None:
    health = interpret(PRIMARY, "v", probe_value="v", refused=("XREADGROUP", "XLEN"))
    assert not health.ok
    assert "XREADGROUP" in health.cause and "XLEN" not in health.cause, health.cause
    assert health.refused == ("XREADGROUP",) and health.views_refused == ("XLEN",)


def test_every_operator_command_is_asked_about_by_the_probe() -> None:
    names = {needed_command_name(c) for c in NEEDED_COMMANDS}
    for view, (_, commands) in VIEW_COMMANDS.items():
        assert set(commands) <= names, view


def test_the_revocation_index_commands_are_needed_for_calls() -> None:
    """ZADD / ZREMRANGEBYSCORE / ZRANGE keep the token revocation index as well as the
    directory: a user without them cannot have revoked sessions closed by the sweep, so
    they stay causes (fail closed), not warnings."""
    health = interpret(PRIMARY, "v", probe_value="v", refused=("ZRANGE",))
    assert not health.ok and health.refused == ("ZRANGE",), health
    assert _senders("ZRANGE") == {"_directory.py", "_revocation.py"}


@pytest.mark.parametrize(
    ("command", "modules"),
    [
        ("ZCARD", {"_directory.py"}),  # the listing
        ("XLEN", {"_redis_streams.py"}),  # queue_info only: admin API and /metrics
    ],
)
def test_operator_commands_are_sent_by_the_operator_views_only(
    command: str, modules: set[str]
) -> None:
    """A command moved into the call path while listed in VIEW_COMMANDS would let a
    user without it pass as serving, then fail calls: this fails first."""
    assert any(command in commands for _, commands in VIEW_COMMANDS.values()), command
    assert _senders(command) == modules


def test_every_command_the_probe_asks_about_is_sent_by_the_hub() -> None:
    """LLEN was in the list (seen with MONITOR under the contract suite, whose own raw
    reads use it) though the hub never sends it: a user without it had every call
    refused for a command nothing runs."""
    unsent = [needed_command_name(c) for c in NEEDED_COMMANDS if not _senders(c[0])]
    assert unsent == []


def test_the_start_up_line_is_a_warning_and_the_grant_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = [interpret(PRIMARY, "v", probe_value="v", refused=("ZCARD",))]

    async def probe() -> Health:
        await trio.lowlevel.checkpoint()
        return found[0]

    async def main() -> None:
        monitor = HealthMonitor("h:1", probe)
        caplog.set_level(logging.INFO, "deskbridge.hub.redis")
        await monitor.check()
        assert monitor.degraded is None and monitor.refused is None
        assert monitor.views_refused("directory") is not None
        assert monitor.views_refused("queue") is None
        (start,) = caplog.records
        assert start.levelno == logging.WARNING, start.getMessage()
        assert "+zcard" in start.getMessage()
        assert "cannot serve the hub" not in start.getMessage()
        await monitor.check()  # unchanged: no second line
        assert len(caplog.records) == 1
        found[0] = interpret(PRIMARY, "v", probe_value="v")
        await monitor.check()
        assert monitor.views_refused("directory") is None
        assert len(caplog.records) == 2 and caplog.records[1].levelno == logging.INFO
        assert "operator views" in caplog.records[1].getMessage()

    trio.run(main)


# -- real redis-server ------------------------------------------------------------------


async def test_a_user_lacking_only_the_directory_reads_serves_calls(
    redis_server: RedisServer,
) -> None:
    denied = ("-zcard",)
    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE, *denied)
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    user, holder = f"acl-{secrets.token_hex(4)}", f"h{secrets.token_hex(4)}"
    with trio.fail_after(20):
        async with s:
            health = await s.health_check()
            assert health is not None and health.ok, health
            (warning,) = s.health_warnings()
            assert "ACL SETUSER <user> +zcard" in warning
            await s.ping()  # readiness passes
            await s.set_liveness(holder, 30, consumer="c1", max_pending=32)
            await s.set_presence(user, f"{holder}.s1", 30)
            # enqueued (no reader here: it times out queued), not refused before enqueue
            outcome = await Bridge(s).dispatch(user, "echo", {}, timeout_s=0.5)
            assert outcome.status == "timeout", outcome
            assert (await s.queue_info(user)).length == 1  # XLEN: granted
            with pytest.raises(SubstrateUnavailable) as refused:
                await s.list_desktops(offset=0, limit=10)
            assert "+zcard" in str(refused.value) and refused.value.unsent
            assert "NOPERM" not in str(refused.value)  # said before sending
            redis_server.command("ACL", "SETUSER", "hub", "+zcard")
            await s.health_check()
            assert s.health_warnings() == ()
            assert (await s.list_desktops(offset=0, limit=10)).total == 0


async def test_a_user_lacking_xlen_gets_queue_views_refused_naming_the_grant(
    redis_server: RedisServer,
) -> None:
    redis_server.command("ACL", "SETUSER", "hub", "on", ">pw", *LEAST_PRIVILEGE, "-xlen")
    s = RedisSubstrate.from_url(f"redis://hub:pw@127.0.0.1:{redis_server.port}/0")
    with trio.fail_after(20):
        async with s:
            health = await s.health_check()
            assert health is not None and health.ok and health.views_refused == ("XLEN",)
            with pytest.raises(SubstrateUnavailable, match=r"ACL SETUSER <user> \+xlen"):
                await s.queue_info("someone")
            assert (await s.list_desktops(offset=0, limit=10)).total == 0
