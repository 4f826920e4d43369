"""Unknown ``DESKBRIDGE_*`` variables are named (issue 11 item 6), and the list of known
names cannot fall behind the code: every name the source tree mentions is known."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
from deskbridge_hub._envcheck import known_names, unknown_variables, warn_unknown_variables

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_names_get_the_nearest_known_one() -> None:
    env = {
        "DESKBRIDGE_REDIS_URL": "redis://x",
        "DESKBRIDGE_HEARTBEAT_SECS": "3",
        "DESKBRIDGE_API_KEYS": "k",
        "DESKBRIDGE_QQQQQQQQ": "1",
        "DESKBRIDGE_TEST_ANYTHING": "1",
        "PATH": "/bin",
    }
    assert unknown_variables(env) == [
        ("DESKBRIDGE_API_KEYS", "DESKBRIDGE_API_KEY"),
        ("DESKBRIDGE_HEARTBEAT_SECS", "DESKBRIDGE_HEARTBEAT_S"),
        ("DESKBRIDGE_QQQQQQQQ", None),
    ]


def test_warning_lines(caplog) -> None:
    lines = warn_unknown_variables({"DESKBRIDGE_SECERT": "x"})
    assert lines == [
        "unknown environment variable DESKBRIDGE_SECERT is ignored; did you mean DESKBRIDGE_SECRET?"
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert warn_unknown_variables({"DESKBRIDGE_SECRET": "x"}) == []


def test_every_name_in_the_source_tree_is_known() -> None:
    """A knob added anywhere (hub, sidecar, common, docs) must be added to KNOWN, or the
    hub would warn that the operator's correct variable is unknown."""
    pattern = re.compile(r"DESKBRIDGE_[A-Z0-9_]*[A-Z0-9]")
    seen: set[str] = set()
    for folder in ("hub/src", "sidecar/src", "common/src", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".toml") and path.name not in (
                "_envcheck.py",
                "_envnames.py",
            ):
                seen |= set(pattern.findall(path.read_text(errors="replace")))
            elif path.suffix == ".md":  # the docs' tables of variables
                for line in path.read_text(errors="replace").splitlines():
                    if line.startswith("|"):
                        seen |= set(pattern.findall(line))
    seen = {n for n in seen if not n.startswith("DESKBRIDGE_TEST")}
    assert seen, "the scan found nothing: wrong root?"
    missing = sorted(seen - known_names())
    assert not missing, f"add to deskbridge_common._envnames.KNOWN: {missing}"


def test_the_process_environment_is_checked_once_per_process(monkeypatch, caplog):
    """``serve --workers 1`` checks, then imports ``asgi`` which checks again: one line."""
    from deskbridge_hub import _envcheck

    monkeypatch.setattr(_envcheck, "_checked_process_env", False)
    monkeypatch.setenv("DESKBRIDGE_REDIS_ULR", "redis://x")
    assert len(warn_unknown_variables()) == 1
    assert warn_unknown_variables() == []
    assert sum("DESKBRIDGE_REDIS_ULR" in r.getMessage() for r in caplog.records) == 1


def test_every_known_name_is_read_and_documented() -> None:
    """The other way round: a name on the known list that nothing reads is never warned
    about, so an operator who sets it (``DESKBRIDGE_METRICS_BIND``, expecting a separate
    metrics listener) is silently ignored; and a name no page documents cannot be found
    by a newcomer (``DESKBRIDGE_NO_KEYRING``, ``DESKBRIDGE_VENV`` were in no doc)."""
    from deskbridge_common import Timings

    timings = {"DESKBRIDGE_" + f.name.upper() for f in attrs.fields(Timings)}
    read = (
        "".join(
            path.read_text(errors="replace")
            for folder in ("hub/src", "sidecar/src", "common/src")
            for path in (ROOT / folder).rglob("*.py")
            if path.name != "_envnames.py"
        )
        + (ROOT / "dev").read_text()
    )
    docs = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    docs += (ROOT / "README.md").read_text()
    names = known_names() - timings
    assert sorted(n for n in names if n not in read) == [], "known, but read nowhere"
    assert sorted(n for n in names if n not in docs) == [], "known, but in no doc"
