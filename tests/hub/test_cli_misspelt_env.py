"""A required variable that is missing while a misspelt one is set: the error names the
misspelling (``DESKBRIDGE_SECRT is set: did you mean DESKBRIDGE_SECRET?``). ``serve``
warned about it in its log, but ``token``, ``call``, ``inspect``, ``cancel``, ``revoke``
and ``deskbridge-sidecar run`` said only that the right name was not set, so the user
checked a variable they believed set."""

from __future__ import annotations

import time

import jwt
import pytest
from deskbridge_common._envnames import misspelling_hint
from deskbridge_hub import _cli_args
from deskbridge_hub import cli as hub_cli
from deskbridge_sidecar import cli as sidecar_cli

from tests.hub.test_bounds_every_way_in import fake_hub  # noqa: F401 - a fixture

#: a port nothing listens on
HUB = "http://127.0.0.1:9"


def test_the_hint_names_the_misspelt_variable_nearest_the_missing_one() -> None:
    env = {"DESKBRIDGE_SECRT": "x", "DESKBRIDGE_APIKEY": "k", "PATH": "/bin"}
    assert misspelling_hint("DESKBRIDGE_SECRET", env) == (
        " (DESKBRIDGE_SECRT is set: did you mean DESKBRIDGE_SECRET?)"
    )
    assert misspelling_hint("DESKBRIDGE_API_KEY", env) == (
        " (DESKBRIDGE_APIKEY is set: did you mean DESKBRIDGE_API_KEY?)"
    )
    assert misspelling_hint("DESKBRIDGE_REDIS_URL", env) == ""
    assert misspelling_hint("DESKBRIDGE_SECRET", {"DESKBRIDGE_SECRET": "x"}) == ""


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("DESKBRIDGE_SECRET", "DESKBRIDGE_API_KEY", "DESKBRIDGE_REDIS_URL",
                 "DESKBRIDGE_TOKEN", "DESKBRIDGE_HUB_URL", "DESKBRIDGE_HUB_HTTP",
                 "DESKBRIDGE_CONFIG"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DESKBRIDGE_NO_KEYRING", "1")
    return monkeypatch


@pytest.mark.parametrize(
    ("argv", "variable", "typo"),
    [
        (["token", "alice"], "DESKBRIDGE_SECRET", "DESKBRIDGE_SECRT"),
        (["revoke", "alice"], "DESKBRIDGE_REDIS_URL", "DESKBRIDGE_REDIS_ULR"),
        (["call", "alice", "echo"], "DESKBRIDGE_API_KEY", "DESKBRIDGE_APIKEY"),
        (["inspect", "desktops"], "DESKBRIDGE_API_KEY", "DESKBRIDGE_APIKEY"),
        (["cancel", "j1"], "DESKBRIDGE_API_KEY", "DESKBRIDGE_APIKEY"),
    ],
)
def test_a_hub_command_names_the_misspelt_variable(
    clean_env, capsys, fake_hub, argv, variable, typo  # noqa: F811
):  # fmt: skip
    hub, _, replies = fake_hub  # the hub's answer to a call sent without a key
    replies.append((401, b'{"error": {"code": "unauthorized", "message": "missing key"}}'))
    clean_env.setenv(typo, "x" * 32)
    assert hub_cli.main([*argv, "--hub", hub] if argv[0] != "token" and argv[0] != "revoke"
                        else argv) != 0  # fmt: skip
    err = capsys.readouterr().err
    assert f"{typo} is set: did you mean {variable}?" in err, err


def test_serve_names_the_misspelt_secret(clean_env, capsys):
    import hypercorn.run

    def refuse(config: object) -> int:
        raise AssertionError("serve went on to serve")

    clean_env.setattr(hypercorn.run, "run", refuse)
    clean_env.setenv("DESKBRIDGE_SECRT", "s" * 32)
    assert hub_cli.main(["serve", "--bind", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "DESKBRIDGE_SECRET is not set" in err
    assert "DESKBRIDGE_SECRT is set: did you mean DESKBRIDGE_SECRET?" in err, err


@pytest.mark.parametrize(
    ("argv", "variable", "typo", "value"),
    [
        (["run", "--hub", "ws://127.0.0.1:9"], "DESKBRIDGE_TOKEN", "DESKBRIDGE_TOKN",
         jwt.encode({"sub": "alice", "exp": int(time.time()) + 3600}, "s" * 32)),
        (["run", "--token", jwt.encode({"sub": "alice", "exp": int(time.time()) + 3600},
                                       "s" * 32)],
         "DESKBRIDGE_HUB_URL", "DESKBRIDGE_HUBURL", "ws://127.0.0.1:9"),
    ],
)  # fmt: skip
def test_sidecar_run_names_the_misspelt_variable(
    clean_env, capsys, tmp_path, argv, variable, typo, value
):
    clean_env.setenv(typo, value)
    clean_env.setenv("HOME", str(tmp_path))
    clean_env.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert sidecar_cli.main([*argv, "--data-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"{typo} is set: did you mean {variable}?" in err, err


def test_call_says_the_sidecar_url_variable_is_not_its_own(clean_env, capsys):
    """``DESKBRIDGE_HUB_URL`` is the sidecar's (a ws:// URL): ``call`` reads
    ``DESKBRIDGE_HUB_HTTP``; with only the former set it tried 127.0.0.1:8080 and said
    only that it could not reach it."""
    clean_env.setenv("DESKBRIDGE_HUB_URL", "ws://127.0.0.1:9")
    clean_env.setenv("DESKBRIDGE_API_KEY", "k")
    # the default hub address, as when --hub is not given (nothing listens on :9 here)
    clean_env.setattr(_cli_args, "DEFAULT_HUB_HTTP", HUB)
    assert hub_cli.main(["call", "alice", "echo"]) == 1
    err = capsys.readouterr().err
    assert "DESKBRIDGE_HUB_HTTP" in err and "DESKBRIDGE_HUB_URL" in err, err
