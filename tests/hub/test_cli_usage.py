"""Every ``deskbridge-hub`` option value out of range or malformed is a usage error: exit 2
with one line naming the option (as argparse says ``argument --x: ...``), before anything
is sent or served; never exit 1 (the hub's 400, or "cannot reach") nor a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from deskbridge_hub import cli

#: a port nothing listens on: a value that slipped through would exit 1 ("cannot reach")
HUB = "http://127.0.0.1:9"


@pytest.fixture
def no_serving(monkeypatch):
    """``serve`` must stop before Hypercorn runs (a value that slipped through served)."""
    import hypercorn.run

    def refuse(config: object) -> int:
        raise AssertionError("serve went on to serve")

    monkeypatch.setattr(hypercorn.run, "run", refuse)
    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 32)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", "memory://")


CALL = ["call", "alice", "echo", "--hub", HUB]
DESKTOPS = ["inspect", "desktops", "--hub", HUB]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ([*CALL, "--timeout-s", "0"], "--timeout-s"),
        ([*CALL, "--timeout-s", "-1"], "--timeout-s"),
        ([*CALL, "--timeout-s", "nan"], "--timeout-s"),  # was a traceback
        ([*CALL, "--timeout-s", "inf"], "--timeout-s"),  # was a traceback
        ([*CALL, "--timeout-s", "86401"], "--timeout-s"),  # one day at most, as the hub says
        ([*CALL, "--args", '{"a": NaN}'], "--args"),  # went to the hub: its 400, exit 1
        ([*CALL, "--args", '{"a": 1e400}'], "--args"),  # the same (a float's overflow)
        ([*CALL, "--idempotency-key", ""], "--idempotency-key"),  # was dropped silently
        ([*CALL, "--idempotency-key", "a b"], "--idempotency-key"),
        (["call", "alice", "no tool", "--hub", HUB], "TOOL"),
        (["call", "alice", "", "--hub", HUB], "TOOL"),
        (["call", "alice", "echo", "--hub", "http://[::1"], "--hub"),  # was a traceback
        (["call", "alice", "echo", "--hub", "http://127.0.0.1:x"], "--hub"),  # was a traceback
        (["call", "alice", "echo", "--hub", "http://127.0.0.1:99999"], "--hub"),
        ([*DESKTOPS, "--limit", "0"], "--limit"),
        ([*DESKTOPS, "--limit", "501"], "--limit"),
        ([*DESKTOPS, "--offset", "-1"], "--offset"),
        (["inspect", "desktops", "--hub", "http://[::1"], "--hub"),  # was a traceback
        (["inspect", "desktops", "alice", "--hub", HUB], "ID"),  # was ignored
        (["inspect", "user", "a b", "--hub", HUB], "USER_ID"),
        (["inspect", "job", "..", "--hub", HUB], "JOB_ID"),
        (["inspect", "job", "a/b", "--hub", HUB], "JOB_ID"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_usage_error_naming_it(capsys, argv, names):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.rstrip("\n").splitlines()[-1]
    assert names in last, err
    assert last.startswith(f"deskbridge-hub {argv[0]}: "), err


@pytest.mark.parametrize("grace", ["inf", "1e300", "86401"])
def test_serve_refuses_a_grace_out_of_range(no_serving, capsys, grace):
    # --graceful-timeout-s inf served, with a drain that never gave up
    assert cli.main(["serve", "--bind", "127.0.0.1:1", "--graceful-timeout-s", grace]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "deskbridge-hub serve: --graceful-timeout-s must be"
    )


def test_serve_refuses_a_certificate_it_cannot_load(no_serving, capsys, tmp_path: Path):
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    pem = str(tmp_path / "cert.pem")
    # was exit 1 and a 119-line traceback from Hypercorn's worker
    argv = ["serve", "--bind", "127.0.0.1:1", "--certfile", pem, "--keyfile", pem]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"deskbridge-hub serve: --certfile {pem}"), err


def test_serve_gives_hypercorn_a_listen_backlog_for_a_reconnect_storm(monkeypatch):
    """``serve`` sets the listen backlog (Hypercorn's default, 100, overflowed at ~500
    simultaneous connects: the desktops of a restarted pod all dial at once)."""
    import hypercorn.run

    seen: list[object] = []

    def capture(config: object) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(hypercorn.run, "run", capture)
    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 32)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", "memory://")
    assert cli.main(["serve", "--bind", "127.0.0.1:9"]) == 0
    (config,) = seen
    assert config.backlog == cli.LISTEN_BACKLOG >= 1024
