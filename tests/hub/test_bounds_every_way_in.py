"""The same excessive value gets the same kind of answer whichever way it comes in: the
bounds HTTP puts on a job (``timeout_s`` at most a day, ``args`` at most
``DESKBRIDGE_MAX_ARGS_BYTES``) hold for ``Bridge.dispatch(deadline=...)`` from Python and
for ``deskbridge-hub call`` (exit 2, one line naming the option, nothing sent), and the
hub's own knobs (``serve --workers``, ``DESKBRIDGE_TOKEN_LEEWAY_S``,
``DESKBRIDGE_MAX_ARGS_BYTES``) have an upper bound."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Iterator

import pytest
from deskbridge_hub import BadRequest, Bridge, HubConfig, cli
from deskbridge_hub._errors import BadRequest as _BadRequest
from deskbridge_hub._http import bridge_error_answer
from deskbridge_hub._memory import MemorySubstrate

from tests.hub.test_session import wall


@pytest.fixture
def fake_hub() -> Iterator[tuple[str, list[bytes], list[tuple[int, bytes]]]]:
    """A hub stand-in: records each POST body, answers each POST, GET and DELETE with
    what the test put in ``replies`` (default: 500)."""
    seen: list[bytes] = []
    replies: list[tuple[int, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, body = replies.pop(0) if replies else (500, b"{}")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_DELETE = do_GET  # noqa: N815 (http.server's name)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen, replies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _one_line(capsys: pytest.CaptureFixture[str], prefix: str, option: str) -> str:
    """The line on stderr that names ``option`` (after argparse's usage, for its errors)."""
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    last = captured.err.splitlines()[-1]
    assert last.startswith(prefix) and option in last, captured.err
    return last


def test_call_with_args_over_the_size_limit_is_a_usage_error_nothing_sent(
    fake_hub, capsys, monkeypatch
):
    monkeypatch.delenv("DESKBRIDGE_MAX_ARGS_BYTES", raising=False)
    hub, seen, _ = fake_hub
    big = json.dumps({"s": "x" * (256 * 1024)})
    assert cli.main(["call", "alice", "echo", "--args", big, "--hub", hub]) == 2  # was 1
    line = _one_line(capsys, "deskbridge-hub call: ", "--args")
    assert "262144" in line
    assert seen == []


def test_call_refused_by_the_hub_for_its_args_is_a_usage_error_naming_the_option(fake_hub, capsys):
    """The hub's own limit may be lower than this environment's, or the args fail the
    tool's schema: its 400 names the field, and the CLI names the option (was exit 1)."""
    hub, seen, replies = fake_hub
    refused = _BadRequest("args larger than 1000 bytes", field="args")
    status, body = bridge_error_answer(refused)
    replies.append((status, json.dumps(body).encode()))
    assert cli.main(["call", "alice", "echo", "--args", '{"s": "x"}', "--hub", hub]) == 2
    assert _one_line(capsys, "deskbridge-hub call: --args: ", "args larger than 1000 bytes")
    assert len(seen) == 1  # sent once, and the hub's JSON not printed as an answer


def test_serve_refuses_more_workers_than_a_machine_should_fork(monkeypatch, capsys):
    import hypercorn.run
    from deskbridge_hub import _supervisor

    def refuse(*args: object) -> int:
        raise AssertionError("serve went on to serve")

    monkeypatch.setattr(hypercorn.run, "run", refuse)
    monkeypatch.setattr(_supervisor, "run", refuse)
    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 32)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", "redis://127.0.0.1:9/0")
    assert cli.main(["serve", "--bind", "127.0.0.1:1", "--workers", "100000"]) == 2
    _one_line(capsys, "deskbridge-hub serve: ", "--workers")
    assert cli.MAX_WORKERS >= 8  # a real machine's worth still serves


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DESKBRIDGE_TOKEN_LEEWAY_S", "1e12"),  # expired tokens accepted for 30,000 years
        ("DESKBRIDGE_TOKEN_LEEWAY_S", "3601"),
        ("DESKBRIDGE_MAX_ARGS_BYTES", str(1024 * 1024)),  # no job frame could carry it
        ("DESKBRIDGE_MAX_INFLIGHT", "99999999999999999999"),  # taken before (newcomer pass)
        ("DESKBRIDGE_REDIS_MAX_CONNECTIONS", "99999999999999999999"),
    ],
)
def test_hub_knobs_have_an_upper_bound_named_in_the_error(name, value):
    with pytest.raises(ValueError, match=name):
        HubConfig.from_env({name: value})


@pytest.mark.parametrize("name", ["DESKBRIDGE_MAX_INFLIGHT", "DESKBRIDGE_REDIS_MAX_CONNECTIONS"])
@pytest.mark.parametrize("value", ["0", "-1", "99999999999999999999"])
def test_an_integer_knob_out_of_range_says_what_is_accepted(name, value):
    """ "DESKBRIDGE_MAX_INFLIGHT must be positive" said neither the value nor the range; a
    newcomer (and DESKBRIDGE_REDIS_MAX_CONNECTIONS=0 said "positive" where 1 and 2 are
    refused too) needs both."""
    expected = rf"^{name} must be an integer in \[\d+, \d+\], got '{value}'$"
    with pytest.raises(ValueError, match=expected):
        HubConfig.from_env({name: value})


def test_verify_token_leeway_is_bounded_from_python_as_from_the_environment():
    """``verify_token(leeway_s=1e12)`` accepted a token expired 30,000 years ago, which
    DESKBRIDGE_TOKEN_LEEWAY_S refuses above an hour."""
    from deskbridge_hub import issue_token, verify_token

    token = issue_token("x" * 32, "alice", lifetime_s=60)
    with pytest.raises(ValueError, match=r"leeway_s must be .*3600"):
        verify_token(token, ("x" * 32,), leeway_s=1e12)
    assert verify_token(token, ("x" * 32,), leeway_s=3600) == "alice"


def test_hub_knobs_at_their_bound_are_taken():
    from deskbridge_hub._config import MAX_ARGS_BYTES_LIMIT

    env = {
        "DESKBRIDGE_TOKEN_LEEWAY_S": "3600",
        "DESKBRIDGE_MAX_ARGS_BYTES": str(MAX_ARGS_BYTES_LIMIT),
    }
    config = HubConfig.from_env(env)
    assert (config.token_leeway_s, config.max_args_bytes) == (3600.0, MAX_ARGS_BYTES_LIMIT)


@pytest.mark.parametrize(
    "ahead_s", [86_400 * 365, math.inf, math.nan], ids=["a year", "inf", "nan"]
)
async def test_dispatch_deadline_is_bounded_as_http_bounds_timeout_s(autojump_clock, ahead_s):
    bridge = Bridge(MemorySubstrate(clock=wall), wall_clock=wall)
    await bridge.substrate.set_presence("u1", "ghost", 3600)
    with pytest.raises(BadRequest) as refused:
        await bridge.dispatch("u1", "echo", {}, deadline=wall() + ahead_s, timeout_s=1)
    assert refused.value.field == "deadline"
    assert bridge.substrate.pending_count("u1") == 0  # nothing enqueued
