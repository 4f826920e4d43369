"""``deskbridge-hub call`` / ``inspect`` as a newcomer types them: a host without a scheme,
args that are not an object, a hub that is not running -> one line on stderr, no traceback."""

from __future__ import annotations

import socket

import pytest
from deskbridge_hub import cli

from tests.hub.test_bounds_every_way_in import fake_hub  # noqa: F401 - a fixture


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
        ["cancel", "job-1", "--hub", "127.0.0.1:8080"],
    ],
)
def test_hub_without_an_http_scheme_is_a_usage_error(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "expected an http:// or https:// URL" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "alice", "echo", "--hub", "http://127.0.0.1:8080/v1"],
        ["inspect", "desktops", "--hub", "http://127.0.0.1:8080/v1/"],
        ["cancel", "job-1", "--hub", "https://example.com/deskbridge/v1/users/alice/jobs"],
    ],
)
def test_hub_with_the_api_s_own_path_is_a_usage_error(capsys, argv):
    # was a 404 from /v1/v1/users/...: the commands add /v1/... to the base URL
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "without /v1" in err and "e.g. http://127.0.0.1:8080" in err


def test_hub_behind_a_path_prefix_is_accepted():
    from deskbridge_hub._cli_args import hub_url_problem

    assert hub_url_problem("https://example.com/deskbridge") is None
    assert hub_url_problem("https://example.com/v1x") is None


def test_call_args_must_be_an_object(capsys):
    assert cli.main(["call", "alice", "echo", "--args", "[1, 2]"]) == 2
    assert "--args must be a JSON object" in capsys.readouterr().err


def test_call_args_that_are_not_json_say_where(capsys):
    # was "--args is not valid JSON" alone: a newcomer's single quotes, with no hint
    assert cli.main(["call", "alice", "echo", "--args", "{'a': 1}"]) == 2
    assert capsys.readouterr().err == (
        "deskbridge-hub call: --args is not valid JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1))\n"
    )


def test_call_args_with_a_too_long_integer_say_so_in_the_cli_s_words(capsys):
    # was Python's "use sys.set_int_max_str_digits() to increase the limit"
    assert cli.main(["call", "alice", "echo", "--args", '{"a": ' + "9" * 5000 + "}"]) == 2
    assert capsys.readouterr().err == (
        "deskbridge-hub call: --args holds an integer of more than 4300 digits\n"
    )


def test_call_args_with_a_repeated_key_is_a_usage_error(capsys):
    # json keeps the last value: the hub refuses such a body, so the CLI says so first
    assert cli.main(["call", "alice", "echo", "--args", '{"a": {"b": 1, "b": 2}}']) == 2
    assert "--args has a duplicate key 'b' in a" in capsys.readouterr().err


@pytest.mark.parametrize("user", ["a b", "é", "bob/../alice", ""])
def test_call_refuses_a_user_id_the_hub_would_in_one_line(capsys, user):
    # a space or an é was a urllib traceback (exit 1); a / went into the path unescaped
    assert cli.main(["call", user, "echo", "--hub", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "deskbridge-hub call: USER_ID must be 1-128 characters of A-Z a-z 0-9 _ . @ : -\n"
    )


@pytest.mark.parametrize(
    "command", [["call", "alice", "echo"], ["inspect", "desktops"], ["cancel", "job-1"]]
)
def test_hub_not_running_is_one_plain_line(capsys, command):
    hub = f"http://127.0.0.1:{_closed_port()}"
    assert cli.main([*command, "--hub", hub]) == 1
    err = capsys.readouterr().err
    assert err == f"deskbridge-hub {command[0]}: cannot reach hub at {hub}: Connection refused\n"


@pytest.mark.parametrize("job_id", ["a b", "..", ""])
def test_cancel_refuses_a_job_id_the_hub_would_in_one_line(capsys, job_id):
    assert cli.main(["cancel", job_id, "--hub", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deskbridge-hub cancel: JOB_ID ") and err.count("\n") == 1


@pytest.mark.parametrize("url", [None, "memory://"])
def test_two_workers_on_the_in_memory_substrate_ask_for_a_redis_url(monkeypatch, capsys, url):
    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 32)
    if url is None:
        monkeypatch.delenv("DESKBRIDGE_REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("DESKBRIDGE_REDIS_URL", url)
    assert cli.main(["serve", "--bind", "127.0.0.1:1", "--workers", "2"]) == 2
    assert "set DESKBRIDGE_REDIS_URL to a redis:// URL" in capsys.readouterr().err


def test_call_refuses_a_zero_timeout_without_sending_it(capsys, fake_hub):  # noqa: F811
    """``--timeout-s 0`` used to be dropped (falsy), so the call silently waited 90 s; then
    it went to the hub, whose 400 exited 1 where ``--help`` promises 2 for usage errors.
    Now it is refused here, as argparse refuses ``abc``: exit 2, nothing sent."""
    hub, seen, _ = fake_hub
    assert cli.main(["call", "alice", "echo", "--timeout-s", "0", "--hub", hub]) == 2
    assert seen == []
    assert capsys.readouterr().err.splitlines()[-1] == (
        "deskbridge-hub call: error: argument --timeout-s: must be a number of seconds in "
        "(0, 86400], got '0'"
    )


def test_a_reader_that_leaves_early_is_no_traceback():
    # `deskbridge-hub inspect user alice | head -3` printed a BrokenPipeError traceback
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "DESKBRIDGE_SECRET": "s" * 32}
    hub = Path(sys.executable).parent / "deskbridge-hub"
    proc = subprocess.Popen(
        [str(hub), "token", "alice"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.close()  # before the child prints: its write meets a closed pipe
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == 1


def test_ctrl_c_while_call_waits_is_one_line_not_a_traceback():
    """A newcomer pass: Ctrl-C on ``deskbridge-hub call`` waiting for a long tool printed
    urllib's KeyboardInterrupt traceback (40 lines). Now one line saying what became of
    the call, exit 130 (as the sidecar's Ctrl-C)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    hub = Path(sys.executable).parent / "deskbridge-hub"
    with socket.socket() as listening:  # a hub that takes the request and never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(60)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        env = {**os.environ, "DESKBRIDGE_API_KEY": "k"}
        proc = subprocess.Popen(
            [str(hub), "call", "alice", "sleep", "--args", '{"seconds": 30}', "--hub", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            conn, _ = listening.accept()  # the call is on its way: it waits for the answer
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.communicate(timeout=10)  # reaps it and closes its pipes
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode == 130
    assert out == b""
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("deskbridge-hub call: interrupted")
    assert "job may still run" in lines[0] and "--idempotency-key" in lines[0]


@pytest.mark.parametrize("command", ["revoke", "cancel"])
def test_ctrl_c_while_a_write_is_out_says_it_may_be_recorded(command):
    """A newcomer pass: Ctrl-C on ``revoke`` (or ``cancel``) while its write was out said
    only "interrupted": the revocation may have been recorded or not, and the one line
    should say that running it again is safe, as its Redis-failure message does."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    hub = Path(sys.executable).parent / "deskbridge-hub"
    with socket.socket() as listening:  # a Redis / hub that takes the connection, silent
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(60)
        port = listening.getsockname()[1]
        env = {
            **os.environ,
            "DESKBRIDGE_API_KEY": "k",
            "DESKBRIDGE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
        }
        argv = (
            ["revoke", "alice"]
            if command == "revoke"
            else ["cancel", "job-1", "--hub", f"http://127.0.0.1:{port}"]
        )
        proc = subprocess.Popen(
            [str(hub), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        try:
            conn, _ = listening.accept()
            with conn:
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.communicate(timeout=10)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode == 130
    (line,) = err.decode().splitlines()
    assert line.startswith(f"deskbridge-hub {command}: interrupted; ")
    assert "may or may not" in line and "again (repeating it is safe)" in line


def test_inspect_refused_for_want_of_a_key_says_the_key_is_not_set(
    monkeypatch, capsys, fake_hub  # noqa: F811
):
    # a newcomer pass: ``call`` says "DESKBRIDGE_API_KEY is not set" after a 401 sent
    # without a key; ``inspect`` printed the 401 alone
    hub, _, replies = fake_hub
    replies.append((401, b'{"error": {"code": "unauthorized", "message": "missing key"}}'))
    monkeypatch.delenv("DESKBRIDGE_API_KEY", raising=False)
    assert cli.main(["inspect", "desktops", "--hub", hub]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "deskbridge-hub inspect: 401 unauthorized: missing key",
        "deskbridge-hub inspect: DESKBRIDGE_API_KEY is not set",
    ]


HTML = b"<!DOCTYPE html><html><body><h1>It works</h1></body></html>"


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        (["cancel", "job-1"], (404, b"")),
        (["cancel", "job-1"], (404, HTML)),
        (["inspect", "job", "job-1"], (404, b"")),
        (["inspect", "desktops"], (200, HTML)),
        (["call", "alice", "echo"], (404, HTML)),
        (["call", "alice", "echo"], (200, HTML)),
        (["call", "alice", "echo"], (502, b"Bad Gateway")),
    ],
    ids=["cancel 404", "cancel 404 html", "inspect 404", "inspect 200 html", "call 404 html",
         "call 200 html", "call 502"],  # fmt: skip
)
def test_an_answer_that_is_not_the_hub_s_is_one_line_naming_it(
    capsys,
    fake_hub,  # noqa: F811
    command,
    answer,
):
    """A newcomer pass: --hub at another web server's port. `cancel` took its bare 404 for
    "no such job" (exit 4), `inspect` said "404 : Not Found", `call` printed the server's
    HTML (exit 0 on a 200 page: "completed"). The hub answers JSON objects only: anything
    else is one line saying the answer is not the hub's, exit 1, nothing on stdout."""
    hub, _, replies = fake_hub  # another web server where the hub should be
    replies.append(answer)
    assert cli.main([*command, "--hub", hub]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"deskbridge-hub {command[0]}: HTTP {answer[0]} from {hub}")
    assert "not a deskbridge hub's answer" in captured.err and "--hub" in captured.err


def test_cancel_says_no_such_job_only_for_the_hub_s_own_404(fake_hub):  # noqa: F811
    """A JSON 404 from another server (an API gateway's ``{"message": "Not Found"}``) is
    not the hub's ``not_found``: exit 1, not 4 ("no such job")."""
    hub, _, replies = fake_hub
    replies.append((404, b'{"message": "Not Found"}'))
    assert cli.main(["cancel", "job-1", "--hub", hub]) == 1
    replies.append((404, b'{"error": {"code": "not_found", "message": "no job"}}'))
    assert cli.main(["cancel", "job-1", "--hub", hub]) == 4


def test_help_names_every_variable_the_client_commands_read_and_inspect_s_exits(capsys):
    # a fresh-clone pass: --help did not list DESKBRIDGE_HUB_HTTP (read by call, inspect
    # and cancel without --hub) and inspect --help gave no exit statuses (call's and
    # cancel's do)
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    assert "DESKBRIDGE_HUB_HTTP" in top and "DESKBRIDGE_API_KEY" in top
    assert cli.main(["inspect", "--help"]) == 0
    assert "Exit 0 answered" in " ".join(capsys.readouterr().out.split())
