"""Every ``deskbridge-sidecar`` option value out of range or malformed is a usage error:
exit 2 with one line naming the option, before anything runs or is written; never exit 1
(which ``status`` means "running but not connected"), never a daemon that retries a URL
that can never work, never a traceback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import jwt
import pytest
from deskbridge_sidecar import cli
from deskbridge_sidecar.cli import main


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("DESKBRIDGE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("DESKBRIDGE_NO_KEYRING", "1")
    monkeypatch.setenv("DESKBRIDGE_DATA_DIR", str(tmp_path / "ledger-dir"))

    async def refuse(daemon: object) -> int:
        raise AssertionError("run went on to serve")

    monkeypatch.setattr(cli, "_serve", refuse)  # a value that slipped through ran the daemon


@pytest.fixture
def a_file(tmp_path: Path) -> str:
    path = tmp_path / "a-file"
    path.write_text("x")
    return str(path)


TOKEN = jwt.encode({"sub": "alice", "exp": int(time.time()) + 3600}, "s" * 32)
RUN = ["run", "--token", TOKEN]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        # these two ran, retrying a URL that can never connect, with a traceback a try
        ([*RUN, "--hub", "ws://127.0.0.1:99999"], "--hub"),
        ([*RUN, "--hub", "ws://h:x"], "--hub"),
        ([*RUN, "--hub", "ws://[::1"], "--hub"),  # "Invalid IPv6 URL", naming nothing
        ([*RUN, "--hub", "ws://h:1", "--browser-origin", "https://x.example",
          "--browser-executable", "/nonexistent/chromium"], "--browser-executable"),  # ran
        (["approve", "a/b"], "JOB_ID"),  # exit 1, "no such job"
        (["decline", ".hidden"], "JOB_ID"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_usage_error_naming_it(capsys, argv, names):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.rstrip("\n").splitlines()[-1]
    assert names in last and last.startswith(f"deskbridge-sidecar {argv[0]}: "), err


@pytest.mark.parametrize("command", [["status"], ["pending"], ["approve", "job-1"]])
def test_a_data_dir_that_is_a_file_is_a_usage_error(capsys, a_file, command):
    # status exited 1 ("running but not connected"), pending 0 ("nothing waiting")
    assert main([*command, "--data-dir", a_file]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--data-dir {a_file}: not a directory" in err, err


@pytest.mark.parametrize("hub", ["ftp://hub.example", "ws://hub.example:99999", "ws://"])
def test_install_service_refuses_a_bad_hub_and_writes_nothing(capsys, tmp_path, hub):
    config = tmp_path / "new.toml"
    # it wrote `hub = "ftp://hub.example"` into a new config and a unit that ran it: exit 0
    assert main(["install-service", "--hub", hub, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("deskbridge-sidecar install-service: --hub")
    assert not config.exists()
    assert not list(tmp_path.rglob("deskbridge-sidecar.service"))


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        # "files root '/nonexistent/dir' is not an existing folder": named neither
        ([*RUN, "--hub", "ws://h:1", "--files-root", "/nonexistent/dir"], {}, "--files-root"),
        ([*RUN, "--hub", "ws://h:1"], {"DESKBRIDGE_FILES_ROOTS": "/nonexistent/dir"},
         "DESKBRIDGE_FILES_ROOTS"),
        ([*RUN, "--hub", "ws://h:1", "--browser-origin", "notanorigin"], {}, "--browser-origin"),
        ([*RUN, "--hub", "ws://h:1"], {"DESKBRIDGE_BROWSER_ORIGINS": "notanorigin"},
         "DESKBRIDGE_BROWSER_ORIGINS"),
        # "yes please" was taken as "not headless" without a word
        ([*RUN, "--hub", "ws://h:1", "--browser-origin", "https://x.example"],
         {"DESKBRIDGE_BROWSER_HEADLESS": "yes please"}, "DESKBRIDGE_BROWSER_HEADLESS"),
    ],
)  # fmt: skip
def test_a_toolset_value_from_an_option_or_a_variable_is_named(
    capsys, monkeypatch, argv, env, names
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"deskbridge-sidecar run: error: {names}"), err
