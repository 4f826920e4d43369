"""``deskbridge-sidecar``: argument handling in-process, and the real entry point as a
subprocess against a tiny trio-websocket hub on loopback (real clock, bounded)."""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from deskbridge_common import Hello, Job, JobResult, Welcome, decode_frame, encode_frame
from deskbridge_sidecar import _status, cli
from deskbridge_sidecar.cli import build_parser, load_registry, main
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

BIN = Path(sys.executable).parent / "deskbridge-sidecar"
DEADLINE_S = 30


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("DESKBRIDGE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DESKBRIDGE_DATA_DIR", str(tmp_path / "ledger-dir"))  # not the user's


def test_help(capsys):
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    needles = ["--hub URL", "--token TOKEN", "--tools MODULE", "--ca-file PATH", "--log-level"]
    needles += ["DESKBRIDGE_HUB_URL", "DESKBRIDGE_TOKEN", "exit status"]
    for needle in needles:
        assert needle in out
    assert build_parser().prog == "deskbridge-sidecar"


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["run", "--token", "t"], {}, "the hub URL is required"),
        (["run", "--hub", "ws://h:1"], {}, "a token is required"),
        (["run"], {"DESKBRIDGE_HUB_URL": "ws://h:1"}, "a token is required"),
        (["run", "--hub", "ftp://h", "--token", "t"], {}, "must start with ws://"),
        (["run", "--hub", "ws://h:1", "--token", "t", "--ca-file", "ca.pem"], {}, "needs a wss://"),
        (["run", "--hub", "wss://h:1", "--token", "t", "--ca-file", "/nonexistent.pem"], {},
         "--ca-file /nonexistent.pem"),
        (["run", "--hub", "ws://h:1", "--token", "t", "--tools", "no_such_module_xyz"], {},
         "cannot import"),
        (["run", "--hub", "ws://h:1", "--token", "t", "--tools", "json"], {}, "no @tool"),
        (["run", "--hub", "ws://h:1", "--token", "t"], {"DESKBRIDGE_PING_TIMEOUT_S": "soon"},
         "DESKBRIDGE_PING_TIMEOUT_S"),
        (["run", "--hub", "ws://h:1", "--token", "t", "--log-level", "LOUD"], {}, "invalid choice"),
        (["run", "--hub", "ws://h:1", "--token", "ab c"], {}, "has whitespace at position 3 of 4"),
        (["run", "--hub", "ws://h:1"], {"DESKBRIDGE_TOKEN": "ab\x01c"}, "U+0001 at position 3"),
        (["run", "--hub", "ws://h:1"], {"DESKBRIDGE_TOKEN": " \n"}, "a token is required"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2(capsys, monkeypatch, argv, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_load_registry_collects_tools_from_modules(tmp_path, monkeypatch):
    (tmp_path / "cli_tools_a.py").write_text(
        textwrap.dedent(
            """
            from deskbridge_sidecar import tool

            @tool(side_effects=True)
            def fill(form: str) -> str:
                return form

            def not_a_tool():
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry(["cli_tools_a"])
    assert registry.names() == ["echo", "sleep", "fill"]
    assert registry.get("fill").side_effects


# -- the real entry point ----------------------------------------------------------------


class CliHub:
    def __init__(self, token: str) -> None:
        self.token = token
        self.hello: Hello | None = None
        self.result: JobResult | None = None
        self.answered = trio.Event()
        self.closed = trio.Event()
        self.close_code: int | None = None

    async def handle(self, request: WebSocketRequest) -> None:
        headers = {k.lower(): v for k, v in request.headers}
        if headers.get(b"authorization") != f"Bearer {self.token}".encode():
            await request.reject(401)
            return
        ws = await request.accept()
        self.hello = decode_frame(await ws.get_message())
        welcome = Welcome(session_id="cli-1", heartbeat_s=10, ping_interval_s=10, ping_timeout_s=10)
        await ws.send_message(encode_frame(welcome))
        job = Job(
            id="d-1",
            job_id="j-1",
            name="shout",
            args={"text": "hi"},
            idempotency_key="k-1",
            deadline=4_000_000_000.0,
        )
        await ws.send_message(encode_frame(job))
        try:
            while True:
                frame = decode_frame(await ws.get_message())
                if isinstance(frame, JobResult):
                    self.result = frame
                    self.answered.set()
        except ConnectionClosed as exc:
            self.close_code = exc.reason.code
            self.closed.set()


async def _serve(nursery: trio.Nursery, hub: CliHub) -> int:
    server = await nursery.start(
        functools.partial(serve_websocket, hub.handle, "127.0.0.1", 0, ssl_context=None)
    )
    return server.port


async def test_entry_point_runs_tools_from_cwd_and_stops_on_sigterm(nursery, tmp_path):
    (tmp_path / "cli_tools_b.py").write_text(
        "from deskbridge_sidecar import tool\n\n"
        "@tool\ndef shout(text: str) -> str:\n    return text.upper()\n"
    )
    log_path = tmp_path / "sidecar.log"
    with trio.fail_after(DEADLINE_S):
        hub = CliHub("cli-token")
        port = await _serve(nursery, hub)
        env = {**os.environ, "DESKBRIDGE_HUB_URL": f"ws://127.0.0.1:{port}",
               "DESKBRIDGE_TOKEN": "cli-token\n",  # a paste's newline is stripped
               "DESKBRIDGE_PING_INTERVAL_S": "5"}  # fmt: skip
        with log_path.open("wb") as log_file:
            proc = await trio.lowlevel.open_process(
                [str(BIN), "run", "--tools", "cli_tools_b"],
                cwd=str(tmp_path),
                env=env,
                stdout=log_file,
                stderr=log_file,
            )
            try:
                await hub.answered.wait()
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
            finally:
                proc.kill()
                await proc.wait()
        await hub.closed.wait()
    assert [t.name for t in hub.hello.tools] == ["status", "echo", "sleep", "shout"]
    assert (hub.result.id, hub.result.ok, hub.result.result) == ("d-1", True, "HI")
    assert hub.close_code == 1001
    log = log_path.read_text()
    assert "welcomed by hub: session cli-1" in log
    assert "SIGTERM: stopping" in log


async def test_entry_point_exits_2_when_the_token_is_refused(nursery, tmp_path):
    with trio.fail_after(DEADLINE_S):
        port = await _serve(nursery, CliHub("right-token"))
        result = await trio.run_process(
            [str(BIN), "run", "--hub", f"ws://127.0.0.1:{port}", "--token", "wrong-token"],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    assert (
        b"token refused by hub (401): issue a new one with `deskbridge-hub token USER_ID`"
        in result.stderr
    )


async def test_under_launchd_a_refused_token_exits_0_and_status_says_why(nursery, tmp_path):
    data_dir = tmp_path / "data"
    with trio.fail_after(DEADLINE_S):
        port = await _serve(nursery, CliHub("right-token"))
        result = await trio.run_process(
            [str(BIN), "run", "--hub", f"ws://127.0.0.1:{port}", "--token", "wrong-token",
             "--data-dir", str(data_dir), "--launchd"],
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err  # launchd's KeepAlive restarts any non-zero exit
    assert "token refused by hub (401)" in err
    assert "stopped for good (exit status 2); exiting 0 instead (--launchd)" in err
    code, text = _status.report(data_dir / "status.json")
    assert code == 3 and "last error: rejected" in text and "token refused" in text, text


class SupersedingHub:
    """Welcomes the sidecar, then closes it with 4001 as when a newer one connects."""

    def __init__(self) -> None:
        self.sessions = 0

    async def handle(self, request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # hello
        self.sessions += 1
        welcome = Welcome(
            session_id=f"s-{self.sessions}", heartbeat_s=10, ping_interval_s=10, ping_timeout_s=10
        )
        await ws.send_message(encode_frame(welcome))
        await trio.sleep(0.2)
        await ws.aclose(code=4001, reason="superseded by a newer sidecar session")


@pytest.mark.parametrize(("flags", "expected"), [([], 3), (["--launchd"], 0)])
async def test_a_superseded_sidecar_exits_3_or_0_under_launchd(nursery, tmp_path, flags, expected):
    hub = SupersedingHub()
    with trio.fail_after(DEADLINE_S):
        server = await nursery.start(
            functools.partial(serve_websocket, hub.handle, "127.0.0.1", 0, ssl_context=None)
        )
        result = await trio.run_process(
            [str(BIN), "run", "--hub", f"ws://127.0.0.1:{server.port}", "--token", "t",
             "--data-dir", str(tmp_path / "data"), *flags],
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == expected, err
    assert hub.sessions == 1  # not reconnected
    assert ("exiting 0 instead (--launchd)" in err) == bool(flags)


def test_under_launchd_a_usage_error_exits_0_and_a_crash_does_not(capsys):
    assert main(["run", "--launchd", "--hub", "ws://h:1"]) == 0  # no token anywhere
    err = capsys.readouterr().err
    assert "a token is required" in err and "stopped for good (exit status 2)" in err
    assert main(["run", "--hub", "ws://h:1"]) == 2  # without the flag: as documented
    assert [cli._for_launchd(s) for s in (0, 1, 2, 3, 130)] == [0, 1, 0, 0, 130]


async def test_a_second_sidecar_on_one_ledger_exits_2_with_one_line(tmp_path):
    from deskbridge_sidecar._ledger import LEDGER_FILE, Ledger

    holder = Ledger.open(tmp_path / "data" / LEDGER_FILE)  # the first sidecar
    # ... which is connected and says so in its status file
    status_file = tmp_path / "data" / "status.json"
    first_status = {
        "pid": os.getpid(), "version": "0.1.0", "hub": "ws://h", "connected": True,
        "session_id": "s-first", "since": time.time(), "last_error": None, "tools": ["echo"],
        "running": None, "updated_at": time.time(),
    }  # fmt: skip
    _status.write(status_file, first_status)
    before = status_file.read_bytes()
    try:
        with trio.fail_after(DEADLINE_S):
            result = await trio.run_process(
                [
                    str(BIN),
                    "run",
                    "--hub",
                    "ws://127.0.0.1:9",
                    "--token",
                    "t",
                    "--data-dir",
                    str(tmp_path / "data"),
                ],  # fmt: skip
                capture_stderr=True,
                check=False,
            )
    finally:
        holder.close()
    assert result.returncode == 2
    assert b"another sidecar is using the ledger" in result.stderr
    assert b"Traceback" not in result.stderr
    # The refused sidecar never held the data directory: it left the first one's status
    # alone (it used to write its own "stopped" record over it: `status` said not running).
    assert status_file.read_bytes() == before
    assert _status.report(status_file)[0] == 0
    assert not list((tmp_path / "data").glob("status.json.*.tmp"))


def _unusable_data_dirs(tmp_path: Path) -> list[Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    dirs = [a_file, a_file / "below"]
    if Path("/proc/self").is_dir():  # a directory nobody can create anything in
        dirs.append(Path("/proc/deskbridge-no-such-dir"))
    return dirs


@pytest.mark.parametrize("which", [0, 1, 2], ids=["a-file", "below-a-file", "in-proc"])
async def test_a_data_dir_that_cannot_be_used_is_one_error_line_and_exit_2(tmp_path, which):
    dirs = _unusable_data_dirs(tmp_path)
    if which >= len(dirs):
        pytest.skip("no /proc here")
    data_dir = dirs[which]
    with trio.fail_after(DEADLINE_S):
        result = await trio.run_process(
            [str(BIN), "run", "--hub", "ws://127.0.0.1:9", "--token", "t",
             "--data-dir", str(data_dir)],
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "Traceback" not in err and "Exception Group" not in err, err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot create the data directory" in errors[0], err
    assert str(data_dir) in errors[0]
    assert (tmp_path / "a-file").read_text() == "not a directory"  # untouched


def test_a_log_file_that_cannot_be_opened_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_configure_logging", lambda *a: None)  # leave pytest's alone
    (tmp_path / "a-file").write_text("")
    log_file = tmp_path / "a-file" / "sidecar.log"
    argv = ["run", "--hub", "ws://h:1", "--token", "t", "--log-file", str(log_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--log-file {log_file}: " in err and "Traceback" not in err


def test_help_names_the_data_dir(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--data-dir DIR" in out and "DESKBRIDGE_DATA_DIR" in out


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def broken(:\n", "SyntaxError: invalid syntax"),
        ("x = 1\nundefined_name\n", "NameError: name 'undefined_name' is not defined"),
    ],
)
def test_a_tools_module_that_fails_to_import_is_one_line_not_a_traceback(
    capsys, tmp_path, monkeypatch, source, needle
):
    (tmp_path / "newcomer_tools.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--hub", "ws://h:1", "--token", "t", "--tools", "newcomer_tools"]) == 2
    err = capsys.readouterr().err
    assert "--tools: cannot import: " + needle in err
    assert "newcomer_tools.py" in err and "line " in err
    assert "Traceback" not in err


def test_a_tools_module_missing_a_dependency_names_the_module_and_this_python(
    capsys, tmp_path, monkeypatch
):
    """A newcomer pass: ``--tools my_tools`` whose ``import requests`` failed said only
    "--tools: cannot import: No module named 'requests'", which reads as "my_tools was not
    found"; the dependency was installed in another Python than the sidecar's."""
    (tmp_path / "newcomer_tools.py").write_text("import newcomer_missing_dep\n")
    (tmp_path / "other_tools.py").write_text(
        "from deskbridge_sidecar import tool\n@tool\ndef other() -> int:\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["run", "--hub", "ws://h:1", "--token", "t"]
    assert main([*argv, "--tools", "other_tools", "--tools", "newcomer_tools"]) == 2
    last = capsys.readouterr().err.rstrip("\n").splitlines()[-1]
    assert "--tools newcomer_tools: cannot import" in last, last
    assert "No module named 'newcomer_missing_dep'" in last and "newcomer_tools.py" in last
    assert sys.executable in last  # where to install it
    # the module itself not found: named as before, no install hint about it
    assert main([*argv, "--tools", "newcomer_nowhere"]) == 2
    last = capsys.readouterr().err.rstrip("\n").splitlines()[-1]
    assert "--tools newcomer_nowhere: cannot import: No module named 'newcomer_nowhere'" in last


@pytest.mark.parametrize("given", ["./newcomer_tools.py", "sub/newcomer_tools.py", "/abs/x.py"])
def test_a_tools_path_instead_of_a_module_name_says_so(capsys, tmp_path, monkeypatch, given):
    """A newcomer pass: ``--tools ./my_tools.py`` said "TypeError: the 'package' argument is
    required to perform a relative import for './my_tools.py' (.../importlib/__init__.py)"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "newcomer_tools.py").write_text("x = 1\n")
    assert main(["run", "--hub", "ws://h:1", "--token", "t", "--tools", given]) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"deskbridge-sidecar run: error: --tools {given!r}: ") and (
        "a module name" in last
    ), err
    assert "importlib" not in err and "Traceback" not in err


def test_a_tools_module_that_exits_at_import_is_a_usage_error(capsys, tmp_path, monkeypatch):
    """``sys.exit(3)`` in a tools module at import made ``run`` exit 3, the status of a
    superseded sidecar (not restarted), with no line at all."""
    (tmp_path / "exiting_tools.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--hub", "ws://h:1", "--token", "t", "--tools", "exiting_tools"]) == 2
    err = capsys.readouterr().err
    assert "--tools: cannot import: SystemExit: 3 (" in err and "exiting_tools.py" in err, err


def test_a_misspelt_variable_is_named_with_the_nearest_known_one(monkeypatch, caplog, tmp_path):
    """A newcomer pass: the hub warns about DESKBRIDGE_PING_TIMEOUT (no _S) at start; the
    sidecar, which reads the same timings, ignored it without a word."""
    monkeypatch.setattr(cli, "_configure_logging", lambda *a: None)  # leave pytest's alone
    monkeypatch.setenv("DESKBRIDGE_PING_TIMEOUT", "5")
    monkeypatch.setenv("DESKBRIDGE_DATA_DIR", str(tmp_path / "d"))
    seen: list[object] = []

    async def serve(daemon: object) -> int:
        seen.append(daemon)
        return 0

    monkeypatch.setattr(cli, "_serve", serve)
    with caplog.at_level("WARNING"):
        assert main(["run", "--hub", "ws://h:1", "--token", "t"]) == 0
    assert seen
    assert (
        "unknown environment variable DESKBRIDGE_PING_TIMEOUT is ignored; "
        "did you mean DESKBRIDGE_PING_TIMEOUT_S?"
    ) in caplog.messages


@pytest.mark.parametrize(("code", "status"), [(errno.EIO, 75), (errno.EMFILE, 75),
                                              (errno.EACCES, 2), (errno.ENOTDIR, 2)])  # fmt: skip
def test_a_log_file_the_disk_fails_to_open_exits_by_its_kind(
    capsys, monkeypatch, tmp_path, code, status
):
    """As for the ledger: an I/O error opening --log-file (the service's default) exited 2,
    "stopped for good", whatever it was; a disk or machine fault is temporary (75)."""
    monkeypatch.setattr(cli, "_configure_logging", lambda *a: None)  # leave pytest's alone

    def refuse(path: str) -> None:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(cli._service_cli, "log_to_file", refuse)
    log_file = str(tmp_path / "sidecar.log")
    argv = ["run", "--hub", "ws://h:1", "--token", "t", "--log-file", log_file]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert f"--log-file {log_file}: " in err and "Traceback" not in err
