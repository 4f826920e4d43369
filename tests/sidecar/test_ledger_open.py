"""Opening the durable ledger: the data directory, SQLite's own refusals, a file that fails
its check, moving a corrupt file aside, and the one-daemon lock. The CLI prints a
LedgerError's text as the one line a person reads, so the texts are pinned too."""

from __future__ import annotations

import logging
import re
import sqlite3
import time

import pytest
from deskbridge_sidecar import _ledger
from deskbridge_sidecar._ledger import (
    LEDGER_FILE,
    Ledger,
    LedgerError,
    LedgerLocked,
)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "data" / LEDGER_FILE


def _break_the_freelist(path) -> None:
    """A real ledger whose header claims 5 free pages it does not have: SQLite opens it,
    and only ``PRAGMA quick_check`` finds the fault (it answers one row naming it)."""
    Ledger.open(path).close()
    data = bytearray(path.read_bytes())
    data[36:40] = (5).to_bytes(4, "big")  # header: total number of freelist pages
    path.write_bytes(bytes(data))


def test_a_clean_open_holds_its_path_and_moved_nothing_aside(path):
    ledger = Ledger.open(path)
    assert ledger.path == path and ledger.moved_aside is None and ledger.recovered == []
    ledger.close()


def test_the_data_directory_is_created_with_its_parents(tmp_path):
    path = tmp_path / "home" / "user" / "deskbridge" / LEDGER_FILE
    Ledger.open(path).close()
    assert path.exists()


def test_a_data_directory_that_cannot_be_created_is_a_ledger_error_naming_it(tmp_path):
    (tmp_path / "blocker").write_text("a file where the directory should be")
    path = tmp_path / "blocker" / "data" / LEDGER_FILE
    with pytest.raises(LedgerError, match="^cannot create the data directory .*blocker"):
        Ledger.open(path)


def test_a_file_sqlite_cannot_open_is_a_ledger_error_naming_it(tmp_path):
    path = tmp_path / LEDGER_FILE
    path.mkdir()  # a directory where the file should be
    with pytest.raises(LedgerError, match="^cannot open the ledger .*unable to open") as info:
        Ledger.open(path)
    assert not isinstance(info.value, LedgerLocked)


def test_a_file_that_fails_quick_check_is_moved_aside_with_the_reason(path, caplog):
    _break_the_freelist(path)
    with caplog.at_level(logging.ERROR):
        ledger = Ledger.open(path)
    assert ledger.moved_aside is not None and ledger.moved_aside.exists()
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "(quick_check: *** in database main ***" in error.getMessage()
    assert "Main freelist: size is 0 but should be 5" in error.getMessage()
    ledger.close()
    Ledger.open(path).close()  # the fresh one passes its check


def test_the_error_line_says_why_sqlite_refused_the_file(path, caplog):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database" * 100)
    with caplog.at_level(logging.ERROR):
        Ledger.open(path).close()
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "is corrupt (file is not a database)" in error.getMessage()


def test_moving_aside_takes_the_files_wal_shm_and_journal_with_it(path):
    """They belong to the corrupt file: left in place, SQLite would try to replay a stale
    journal into the fresh ledger."""
    path.parent.mkdir(parents=True)
    path.write_bytes(b"old main")
    for suffix in ("-wal", "-shm", "-journal"):
        (path.parent / (path.name + suffix)).write_bytes(f"old {suffix}".encode())
    moved = _ledger._move_aside(path)
    assert moved.name.startswith(f"{path.name}.corrupt-") and moved.read_bytes() == b"old main"
    for suffix in ("-wal", "-shm", "-journal"):
        assert (moved.parent / (moved.name + suffix)).read_bytes() == f"old {suffix}".encode()
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        moved.name + suffix for suffix in ("", "-wal", "-shm", "-journal")
    )


def test_a_corrupt_file_that_cannot_be_moved_aside_is_a_ledger_error(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database" * 100)
    now = int(time.time())
    for t in range(now, now + 30):  # every name it could pick is a non-empty directory
        taken = path.parent / f"{path.name}.corrupt-{t}"
        taken.mkdir()
        (taken / "keep").write_text("x")
    expected = f"^cannot move the corrupt ledger {re.escape(str(path))} aside: "
    with pytest.raises(LedgerError, match=expected):
        Ledger.open(path)


def test_a_fresh_ledger_that_is_corrupt_too_is_a_ledger_error_not_a_loop(path, monkeypatch):
    attempts = []

    def corrupt(p):
        attempts.append(p)
        raise _ledger._Corrupt("disk returns garbage")

    monkeypatch.setattr(_ledger, "_connect", corrupt)
    path.parent.mkdir(parents=True)
    expected = f"^cannot create a fresh ledger at {re.escape(str(path))}: disk"
    with pytest.raises(LedgerError, match=expected):
        Ledger.open(path)
    assert attempts == [path, path]


def test_a_second_daemon_is_refused_within_a_second_with_the_way_out(path):
    """SQLite waits its busy timeout (0.5 s) for the lock, not its default 5 s, and the
    refusal says what to do."""
    first = Ledger.open(path)
    try:
        began = time.monotonic()
        with pytest.raises(LedgerLocked) as info:
            Ledger.open(path)
        assert time.monotonic() - began < 1.3
        assert "one daemon per data directory: stop it, or give this one its own --data-dir" in (
            str(info.value)
        )
    finally:
        first.close()


class _Refusing:
    """A connection whose first PRAGMA fails as SQLite would fail it."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.closed = False

    def execute(self, sql: str):
        raise sqlite3.OperationalError(self.message)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("message", ["database is locked", "database is busy"])
def test_a_locked_or_busy_file_is_ledger_locked(path, monkeypatch, message):
    conn = _Refusing(message)
    monkeypatch.setattr(_ledger.sqlite3, "connect", lambda *a, **kw: conn)
    with pytest.raises(LedgerLocked, match="another sidecar is using the ledger"):
        _ledger._connect(path)
    assert conn.closed


def test_any_other_refusal_is_a_ledger_error_naming_the_file(path, monkeypatch):
    conn = _Refusing("disk I/O error")
    monkeypatch.setattr(_ledger.sqlite3, "connect", lambda *a, **kw: conn)
    expected = f"^cannot open the ledger {re.escape(str(path))}: disk I/O error$"
    with pytest.raises(LedgerError, match=expected) as info:
        _ledger._connect(path)
    assert not isinstance(info.value, LedgerLocked) and conn.closed


def test_a_ledger_sqlite_cannot_open_in_a_read_only_directory_says_so(path, monkeypatch):
    """A newcomer pass: a data directory on a read-only file system said only "cannot open
    the ledger ...: unable to open database file" (SQLite's words), not why."""

    def refuse(*args, **kwargs):
        exc = sqlite3.OperationalError("unable to open database file")
        exc.sqlite_errorcode = sqlite3.SQLITE_CANTOPEN
        raise exc

    monkeypatch.setattr(_ledger.sqlite3, "connect", refuse)
    real_access = _ledger.os.access
    monkeypatch.setattr(
        _ledger.os,
        "access",
        lambda p, mode: False if str(p) == str(path.parent) else real_access(p, mode),
    )
    path.parent.mkdir(parents=True)
    expected = r"database file \(the data directory .* is not writable: check its permissions"
    with pytest.raises(LedgerError, match=expected + r" and file system\)$"):
        Ledger.open(path)
