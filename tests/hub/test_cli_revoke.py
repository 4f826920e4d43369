"""``deskbridge-hub revoke USER_ID`` against the test Redis (``DESKBRIDGE_REDIS_URL``):
it records the cut-off in the user's record and the index, tells the process holding
the user's session, says what it did, and exits 0; usage errors exit 2, an unreachable
Redis exits 1. The live session's close is tests/hub/test_revoke.py (in process) and
tests/integration/test_revoke.py (real processes)."""

from __future__ import annotations

import json
import secrets
import socket
import time

import pytest
import trio
from deskbridge_hub import cli

from ..conftest import RawRedis


def _raw(raw: RawRedis, *command: object) -> object:
    return trio.run(lambda: raw(*command))


@pytest.fixture
def user(raw_redis: RawRedis):
    user_id = f"revoke-{secrets.token_hex(4)}"
    yield user_id
    _raw(raw_redis, "DEL", f"bridge:revoked:{{{user_id}}}", f"bridge:presence:{{{user_id}}}")
    _raw(raw_redis, "ZREM", "bridge:revocations", user_id)


def test_revoke_records_the_cut_off_and_says_nobody_was_connected(
    user, raw_redis, redis_url, monkeypatch, capsys
):
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", redis_url)
    before = time.time()
    assert cli.main(["revoke", user]) == 0
    after = time.time()
    out = capsys.readouterr().out
    record = json.loads(str(_raw(raw_redis, "GET", f"bridge:revoked:{{{user}}}")))
    assert int(before) + 1 <= record["before"] <= int(after) + 1
    assert before <= record["at"] <= after
    assert time.time() >= record["before"]  # a token issued after the command returned works
    assert _raw(raw_redis, "ZSCORE", "bridge:revocations", user) is not None
    assert user in out and "revoked" in out and "no sidecar" in out


def test_revoke_tells_the_process_holding_the_session(
    user, raw_redis, redis_url, monkeypatch, capsys
):
    holder = f"p{secrets.token_hex(6)}"
    session = f"{holder}.{secrets.token_hex(8)}"
    _raw(raw_redis, "SET", f"bridge:presence:{{{user}}}", session, "PX", 30000)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", redis_url)
    try:
        assert cli.main(["revoke", user]) == 0
        items = _raw(raw_redis, "LRANGE", f"bridge:wake:{{{holder}}}", 0, -1)
        assert isinstance(items, list) and len(items) == 1
        notice = json.loads(items[0])
        assert notice["user"] == user and isinstance(notice["revoked"], float | int)
        assert session in capsys.readouterr().out
    finally:
        _raw(raw_redis, "DEL", f"bridge:wake:{{{holder}}}")


@pytest.mark.parametrize(
    ("env", "argv", "needle"),
    [
        ({}, ["revoke", "alice"], "DESKBRIDGE_REDIS_URL"),
        ({"DESKBRIDGE_REDIS_URL": "memory://"}, ["revoke", "alice"], "memory://"),
        ({"DESKBRIDGE_REDIS_URL": "redis://127.0.0.1:9/0"}, ["revoke", "al ice"], "USER_ID"),
        ({"DESKBRIDGE_REDIS_URL": "http://x"}, ["revoke", "alice"], "DESKBRIDGE_REDIS_URL"),
    ],
)
def test_revoke_usage_errors_exit_2_naming_the_problem(monkeypatch, capsys, env, argv, needle):
    monkeypatch.delenv("DESKBRIDGE_REDIS_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_revoke_exits_1_when_redis_cannot_be_reached(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    assert cli.main(["revoke", "alice"]) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1" in err and "hunter2" not in err and "nothing was revoked" in err


@pytest.mark.parametrize("unsent", [True, False])
def test_revoke_says_nothing_was_revoked_only_when_nothing_was_sent(
    monkeypatch, capsys, redis_url, unsent
):
    """A write whose reply was lost (Redis stalled, the connection cut after sending) may
    have been recorded: seen with real Redis behind a proxy swallowing replies, the CLI
    said "nothing was revoked" while the record was there. Only an unsent write proves
    that; otherwise it says the revocation may be recorded and that repeating is safe."""
    from deskbridge_hub import _revocation
    from deskbridge_hub._errors import SubstrateUnavailable

    async def lost(*args: object, **kwargs: object) -> object:
        exc = SubstrateUnavailable("Redis at 127.0.0.1:1 unavailable (revoke tokens): timed out")
        exc.unsent = unsent
        raise exc

    monkeypatch.setattr(_revocation, "revoke_user", lost)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", redis_url)
    assert cli.main(["revoke", "alice"]) == 1
    err = capsys.readouterr().err
    if unsent:
        assert "nothing was revoked" in err
    else:
        assert "nothing was revoked" not in err
        assert "may" in err and "revoke alice" in err and "again" in err


def test_revoke_keeps_a_later_cut_off_says_so_and_does_not_wait_for_it(
    user, raw_redis, redis_url, monkeypatch, capsys
):
    """A revocation made on a clock 10 min ahead of this machine's is kept (its tokens
    stay refused), the command says its own clock may be behind, and it returns once
    its own cut-off has passed, not the kept one."""
    later = float(int(time.time()) + 600)
    stored = json.dumps({"before": later, "at": later - 0.5})
    _raw(raw_redis, "SET", f"bridge:revoked:{{{user}}}", stored)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", redis_url)
    start = time.monotonic()
    assert cli.main(["revoke", user]) == 0
    assert time.monotonic() - start < 10
    assert json.loads(str(_raw(raw_redis, "GET", f"bridge:revoked:{{{user}}}"))) == {
        "before": later,
        "at": later - 0.5,
    }
    out = capsys.readouterr().out
    assert "kept" in out and "behind" in out
