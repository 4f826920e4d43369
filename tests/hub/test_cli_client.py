"""``deskbridge-hub call`` / ``inspect`` as a newcomer types them: a host without a scheme,
args that are not an object, a hub that is not running -> one line on stderr, no traceback."""

from __future__ import annotations

import socket

import pytest
from deskbridge_hub import cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "alice", "echo", "--hub", "127.0.0.1:8080"],
        ["inspect", "desktops", "--hub", "127.0.0.1:8080"],
        ["inspect", "user", "alice", "--hub", "ws://127.0.0.1:8080"],
    ],
)
def test_hub_without_an_http_scheme_is_a_usage_error(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "expected an http:// or https:// URL" in err


def test_call_args_must_be_an_object(capsys):
    assert cli.main(["call", "alice", "echo", "--args", "[1, 2]"]) == 2
    assert "--args must be a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["call", "alice", "echo"], ["inspect", "desktops"]])
def test_hub_not_running_is_one_plain_line(capsys, command):
    hub = f"http://127.0.0.1:{_closed_port()}"
    assert cli.main([*command, "--hub", hub]) == 1
    err = capsys.readouterr().err
    assert err == f"deskbridge-hub {command[0]}: cannot reach hub at {hub}: Connection refused\n"
