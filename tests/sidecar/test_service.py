"""Issue 14 item 5: the sidecar as a desktop service: TOML config, token storage outside
it (keyring, else a 0600 file), the systemd unit / launchd agent it installs (checked with
``systemd-analyze verify`` where present), and ``status`` from the local status file."""

from __future__ import annotations

import base64
import io
import json
import os
import plistlib
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from deskbridge_sidecar import _config, _service, _status
from deskbridge_sidecar.cli import main


def UNIT_NAME_IN(output: str) -> list[str]:  # noqa: N802 - reads as a constant check
    return [line for line in output.splitlines() if "deskbridge-sidecar.service" in line]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every platformdirs location and $HOME under tmp_path; no keyring."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("DESKBRIDGE_CONFIG", raising=False)
    monkeypatch.setenv("DESKBRIDGE_NO_KEYRING", "1")
    return tmp_path


def test_config_file_is_read_with_types_checked(home: Path) -> None:
    assert _config.load_config() == _config.SidecarConfig()  # no file: defaults
    path = _config.default_config_path()
    assert path == home / "xdg_config_home" / "deskbridge" / "sidecar.toml"
    path.parent.mkdir(parents=True)
    path.write_text('hub = "wss://hub.example"\ntools = ["a", "b"]\nlog_file = "~/x.log"\n')
    cfg = _config.load_config()
    assert cfg.hub == "wss://hub.example" and cfg.tools == ("a", "b")
    assert cfg.log_file == str(home / "x.log")
    for bad, message in [
        ("hub = 3\n", "hub must be a string"),
        ('hbu = "x"\n', "unknown key 'hbu'"),
        ("tools = [1]\n", "tools must be a list of module names"),
        ("hub = \n", "sidecar.toml"),
    ]:
        path.write_text(bad)
        with pytest.raises(_config.ConfigError, match=message):
            _config.load_config()
    with pytest.raises(_config.ConfigError, match="no such file"):
        _config.load_config(home / "missing.toml", required=True)


def test_config_mistakes_a_newcomer_makes_are_one_line_naming_the_key(home: Path) -> None:
    """A newcomer pass: a config file that is not UTF-8 (saved as UTF-16 by an editor) was
    a UnicodeDecodeError traceback and exit 1; "hub must be a str" spoke Python."""
    path = home / "c.toml"
    path.write_bytes('hub = "ws://h:1"\n'.encode("utf-16"))
    with pytest.raises(_config.ConfigError, match=r"c\.toml: not UTF-8 text \(TOML is UTF-8\)"):
        _config.load_config(path, required=True)
    path.write_text("hub = 3\n")
    with pytest.raises(_config.ConfigError, match=r"c\.toml: hub must be a string, got 3$"):
        _config.load_config(path, required=True)
    path.write_text('tools = "my_tools"\n')
    with pytest.raises(_config.ConfigError, match=r"tools must be a list of module names, got "):
        _config.load_config(path, required=True)


def test_a_config_named_by_the_variable_that_is_missing_is_an_error(home, monkeypatch, capsys):
    """DESKBRIDGE_CONFIG=/typo/sidecar.toml was ignored without a word (the run went on
    with no config), unlike --config naming a missing file."""
    monkeypatch.setenv("DESKBRIDGE_CONFIG", str(home / "typo.toml"))
    with pytest.raises(_config.ConfigError, match=r"^DESKBRIDGE_CONFIG: .*typo.toml: no such"):
        _config.load_config()
    assert main(["run", "--hub", "ws://h:1", "--token", "t"]) == 2
    assert "DESKBRIDGE_CONFIG: " in capsys.readouterr().err


def test_token_falls_back_to_a_0600_file(home: Path) -> None:
    assert _config.load_token() is None
    where = _config.store_token("tok-1")
    path = Path(where)
    assert path == _config.token_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _config.load_token() == "tok-1"
    os.chmod(path, 0o644)
    with pytest.raises(_config.ConfigError, match="chmod 600"):
        _config.load_token()
    _config.store_token("tok-2")  # rewriting fixes the mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and _config.load_token() == "tok-2"


def test_systemd_unit_is_written_and_verified(home: Path) -> None:
    config = home / "sidecar.toml"
    config.write_text('hub = "ws://127.0.0.1:1"\n')
    path, text, commands = _service.install(config, home / "log", platform="linux")
    assert path == home / "xdg_config_home" / "systemd" / "user" / "deskbridge-sidecar.service"
    assert path.read_text() == text
    assert (
        f"run --config {config} --log-file {home / 'log'}" in text
        and "RestartPreventExitStatus=2 3" in text
    )
    assert commands[-1] == ["systemctl", "--user", "enable", "--now", "deskbridge-sidecar"]
    exec_start = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    assert Path(exec_start.split("=", 1)[1].split()[0]).is_file()
    if shutil.which("systemd-analyze"):
        runtime = home / "run"
        runtime.mkdir(mode=0o700)
        done = subprocess.run(
            ["systemd-analyze", "verify", "--user", str(path)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        )  # fmt: skip
        # verify exits 0 on unknown keys too, but names the file in a warning line.
        output = done.stdout + done.stderr
        assert done.returncode == 0 and UNIT_NAME_IN(output) == [], output
    removed, existed, _ = _service.uninstall(platform="linux")
    assert removed == path and existed and not path.exists()
    assert _service.uninstall(platform="linux")[1] is False


def test_launchd_agent_is_a_valid_plist(home: Path) -> None:
    path, text, commands = _service.install(home / "c.toml", home / "s.log", platform="darwin")
    assert path == home / "Library" / "LaunchAgents" / "dev.deskbridge.sidecar.plist"
    agent = plistlib.loads(path.read_bytes())
    assert agent["Label"] == "dev.deskbridge.sidecar"
    assert agent["ProgramArguments"][1:] == [
        "run", "--config", str(home / "c.toml"), "--log-file", str(home / "s.log"), "--launchd"
    ]  # fmt: skip
    # launchd restarts on any non-zero exit: only crashes exit non-zero under --launchd
    # (token refused, superseded: 0), so the two sidecars of one user do not take turns.
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["ThrottleInterval"] == 5 and agent["ExitTimeOut"] == 30
    assert agent["RunAtLoad"] is True
    assert commands[0][:2] == ["launchctl", "bootstrap"]
    if shutil.which("plutil"):  # macOS
        done = subprocess.run(["plutil", "-lint", str(path)], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stdout
    # the arguments it runs are the CLI's own
    from deskbridge_sidecar.cli import build_parser

    parsed = build_parser().parse_args(agent["ProgramArguments"][1:])
    assert parsed.launchd is True and parsed.config == str(home / "c.toml")


def test_status_report(home: Path) -> None:
    path = home / "data" / "status.json"
    code, text = _status.report(path)
    assert code == 3 and "not running" in text
    body = {
        "pid": os.getpid(), "version": "0.1.0", "hub": "ws://h", "connected": True,
        "session_id": "s1", "since": time.time() - 5, "last_error": None, "tools": ["echo"],
        "running": None, "updated_at": time.time(),
    }  # fmt: skip
    _status.write(path, body)
    code, text = _status.report(path)
    assert code == 0 and "connected to ws://h since" in text and "tools: echo" in text
    _status.write(path, {**body, "connected": False, "last_error": "closed: 4003 expired"})
    code, text = _status.report(path)
    assert code == 1 and "NOT connected" in text and "4003 expired" in text
    _status.write(path, {**body, "pid": 2**22 + 12345})  # no such process
    assert _status.report(path)[0] == 3


def _jwt(header: object, payload: object, signature: str = "c2ln") -> str:
    def part(value: object) -> str:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part(header)}.{part(payload)}.{signature}"


HEADER = {"alg": "HS256", "typ": "JWT", "kid": "0123456789abcdef"}


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("tok-abc", "expected a JWT, three base64url parts"),
        ("a.b", "expected a JWT, three base64url parts"),
        ("a.b.c.d", "expected a JWT, three base64url parts"),
        ("Bearer x.y.z", "expected a JWT, three base64url parts"),
        ("a..c", "expected a JWT, three base64url parts"),
        ("a+b.c/d.e", "expected a JWT, three base64url parts"),  # base64, not base64url
        ("e30.e30.!!", "expected a JWT, three base64url parts"),
        ("bm90IGpzb24.e30.c2ln", "its header is not a base64url JSON object"),
        (_jwt([1], {"sub": "alice", "exp": 4_000_000_000}), "header is not a base64url JSON"),
        (_jwt(HEADER, b"\xff\xfe"), "its payload is not a base64url JSON object"),
        (_jwt({"typ": "JWT"}, {"sub": "alice", "exp": 4_000_000_000}), "names no alg"),
        (_jwt(HEADER, {"exp": 4_000_000_000}), "no user id (sub claim)"),
        (_jwt(HEADER, {"sub": "", "exp": 4_000_000_000}), "no user id (sub claim)"),
        (_jwt(HEADER, {"sub": "alice"}), "no expiry (exp claim)"),
        (_jwt(HEADER, {"sub": "alice", "exp": "soon"}), "no expiry (exp claim)"),
        (_jwt(HEADER, {"sub": "alice", "exp": True}), "no expiry (exp claim)"),
        (_jwt(HEADER, {"sub": "alice", "exp": 1_000_000}), "expired at"),
    ],
)
def test_set_token_refuses_what_is_not_a_sidecar_token(
    home: Path, capsys: pytest.CaptureFixture[str], token: str, message: str
) -> None:
    assert main(["set-token", token]) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing stored" in err
    assert token not in err  # never echoed: it may be a real secret pasted wrongly
    assert _config.load_token() is None


def test_set_token_stores_a_token_the_hub_issued(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deskbridge_hub._tokens import issue_token

    token = issue_token("s" * 32, "alice")
    assert main(["set-token", token]) == 0
    out = capsys.readouterr().out
    assert "token for user 'alice' (valid until " in out and "stored in" in out
    assert _config.load_token() == token
    monkeypatch.setattr("sys.stdin", io.StringIO(f"  {token}\n"))  # pasted on stdin
    assert main(["set-token"]) == 0 and _config.load_token() == token
    claims = _config.check_token(token)
    assert claims.user_id == "alice" and claims.expires_at > time.time()
    # within the hub's leeway an expired token is still accepted, as the hub does
    just_expired = issue_token("s" * 32, "bob", lifetime_s=1, now=time.time() - 60)
    assert _config.check_token(just_expired).user_id == "bob"


class _InterruptedStdin(io.StringIO):
    """Standard input on which the person presses Ctrl-C while the command reads."""

    def readline(self, *args: object) -> str:
        raise KeyboardInterrupt


def test_ctrl_c_while_set_token_reads_is_one_line_and_130(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``deskbridge-sidecar set-token`` waiting for the token on standard input: Ctrl-C was
    a KeyboardInterrupt traceback (``deskbridge-hub``'s commands say one line, 130)."""
    monkeypatch.setattr("sys.stdin", _InterruptedStdin())
    assert main(["set-token"]) == 130
    assert capsys.readouterr().err == "deskbridge-sidecar set-token: interrupted\n"
    assert _config.load_token() is None
