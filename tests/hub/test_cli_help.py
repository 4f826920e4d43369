"""``deskbridge-hub`` as a newcomer reads it: every option says what it does, and the log
level given to ``serve`` is the one every worker logs at (issue: newcomer walk-through)."""

from __future__ import annotations

import argparse
import logging
import os

import pytest
from deskbridge_hub import _logging, cli


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_option_of_every_hub_command_has_help() -> None:
    missing = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, sub in _subparsers(cli._parser()).items()
        for action in sub._actions
        if action.option_strings and not action.help
    ]
    assert missing == []  # serve --log-level and call --idempotency-key had none


def test_serve_gives_its_log_level_to_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # `serve --workers 2 --log-level WARNING` logged INFO from both workers: they set up
    # their logging from DESKBRIDGE_LOG_LEVEL, which still said INFO
    from deskbridge_hub import _supervisor

    seen: list[str | None] = []
    monkeypatch.setattr(_logging, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(
        _supervisor,
        "run",
        lambda config, workers, grace_s: seen.append(os.environ["DESKBRIDGE_LOG_LEVEL"]) or 0,
    )
    monkeypatch.setenv("DESKBRIDGE_LOG_LEVEL", "INFO")
    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 32)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", "redis://127.0.0.1:1/0")
    argv = ["serve", "--bind", "127.0.0.1:1", "--workers", "2", "--log-level", "warning"]
    assert cli.main(argv) == 0
    assert seen == ["WARNING"]


def test_an_unknown_log_level_falls_back_to_info_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # DESKBRIDGE_LOG_LEVEL=verbose was a ValueError traceback from logging at start
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers.clear()
    monkeypatch.setenv("DESKBRIDGE_LOG_LEVEL", "verbose")
    try:
        _logging.setup_logging()
        assert root.level == logging.INFO
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert "WARNING deskbridge.hub" in lines[0]
    assert "DESKBRIDGE_LOG_LEVEL='verbose': expected one of DEBUG, INFO, WARNING" in lines[0]


def test_every_command_of_both_tools_says_what_it_does() -> None:
    from deskbridge_sidecar.cli import build_parser

    bare = [
        f"{parser.prog} {name}"
        for parser in (cli._parser(), build_parser())
        for name, sub in _subparsers(parser).items()
        if not sub.description
    ]
    assert bare == []  # sidecar approve, decline and pending printed only their usage


def test_every_option_of_every_sidecar_command_has_help() -> None:
    from deskbridge_sidecar.cli import build_parser

    missing = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, sub in _subparsers(build_parser()).items()
        for action in sub._actions
        if action.option_strings and not action.help
    ]
    assert missing == []


def test_token_lifetime_help_says_what_is_accepted(capsys) -> None:
    """A newcomer pass: `token --help` gave the default only; the bound (10 years) was
    learnt from the refusal."""
    assert cli.main(["token", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"at most {cli.MAX_TOKEN_LIFETIME_S:.0f} (10 years)" in out, out
