"""A full disk is a temporary condition: the sidecar that cannot open its ledger for it
exits 75 (EX_TEMPFAIL: its service manager restarts it), not 2 ("stopped for good":
systemd's ``RestartPreventExitStatus=2 3`` and ``--launchd`` never restart that).

The real entry point runs on a real full file system: a small tmpfs mounted in a user
and mount namespace of its own (``unshare -rm``), filled before the sidecar starts.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from deskbridge_sidecar._errors import LedgerError, LedgerFull
from deskbridge_sidecar._ledger import Ledger, args_digest

BIN = Path(sys.executable).parent / "deskbridge-sidecar"
DEADLINE_S = 30


def _namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True, timeout=DEADLINE_S)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces(), reason="unprivileged user namespaces (unshare -rm) are not available"
)


async def _sidecar_on_a_full_disk(tmp_path: Path, prepare: str, *extra: str):
    """Run ``deskbridge-sidecar run`` with ``--data-dir <tmpfs>/data`` after ``prepare``
    (shell, ``$M`` is the mount point) and a fill of the tmpfs."""
    mount = tmp_path / "m"
    mount.mkdir()
    script = (
        f'M={mount}; mount -t tmpfs -o size=256k{",".join(("", *extra))} tmpfs "$M" && '
        f"{prepare} && "
        '(dd if=/dev/zero of="$M/fill" bs=4k 2>/dev/null; true) && '
        f'exec "{BIN}" run --hub ws://127.0.0.1:9 --token t --data-dir "$M/data"'
    )
    with trio.fail_after(DEADLINE_S):
        return await trio.run_process(
            ["unshare", "-rm", "sh", "-c", script], capture_stderr=True, check=False
        )


def _one_error_line(err: str, needle: str) -> None:
    assert "Traceback" not in err and "Exception Group" not in err, err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and needle in errors[0], err


@needs_namespaces
async def test_a_new_ledger_on_a_full_disk_exits_75_to_be_restarted(tmp_path):
    result = await _sidecar_on_a_full_disk(tmp_path, "true")
    err = result.stderr.decode()
    assert result.returncode == 75, err
    _one_error_line(err, "disk is full")


@needs_namespaces
async def test_a_data_directory_a_full_disk_cannot_hold_exits_75(tmp_path):
    # no inode left for the data directory itself: mkdir fails with ENOSPC
    result = await _sidecar_on_a_full_disk(
        tmp_path, 'i=0; while mkdir "$M/d$i" 2>/dev/null; do i=$((i+1)); done', "nr_inodes=16"
    )
    err = result.stderr.decode()
    assert result.returncode == 75, err
    _one_error_line(err, "cannot create the data directory")


async def test_a_write_the_full_disk_refuses_is_ledger_full(tmp_path):
    """SQLite's ``SQLITE_FULL`` (here from ``max_page_count``, as a full disk gives it)
    is :class:`LedgerFull`, still a :class:`LedgerError` for the runner (``ledger_error``,
    the tool does not start)."""
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        (pages,) = ledger._conn.execute("PRAGMA page_count").fetchone()
        ledger._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(LedgerFull, match="disk is full") as caught:
            for i in range(1000):
                await ledger.begin(f"k{i}" + "x" * 500, "submit", args_digest({}), 2e9)
        assert isinstance(caught.value, LedgerError)
    finally:
        ledger.close()


async def test_the_cli_exits_75_on_ledger_full_and_2_on_other_ledger_errors(monkeypatch):
    from deskbridge_sidecar import cli
    from deskbridge_sidecar._daemon import Daemon

    for error, status in ((LedgerFull("ledger write failed: disk is full"), 75),
                          (LedgerError("cannot open the ledger: not a directory"), 2)):  # fmt: skip

        async def run(self, *, error=error, **kw) -> None:
            raise error

        monkeypatch.setattr(Daemon, "run", run)
        daemon = Daemon("ws://127.0.0.1:9", "t")
        assert await cli._serve(daemon) == status


def test_the_help_names_exit_status_75(capsys):
    from deskbridge_sidecar.cli import main

    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "75   the disk (or quota) is too full to open the ledger" in out
    assert "another fault of the\n       disk or machine (I/O error" in out


def _oserror(code: int) -> OSError:
    import os

    return OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    ("code", "status"),
    [
        # a fault of the disk or the machine, not of the configuration: restart (75)
        (errno.EIO, 75), (errno.EMFILE, 75), (errno.ENOMEM, 75), (errno.ESTALE, 75),
        # the configuration: restarting cannot help, stopped for good (2)
        (errno.EACCES, 2), (errno.EPERM, 2), (errno.EROFS, 2), (errno.ENOTDIR, 2),
    ],
)  # fmt: skip
async def test_an_io_error_creating_the_data_directory_exits_by_its_kind(
    tmp_path, monkeypatch, code, status
):
    """A newcomer pass: every I/O error at start but a full disk exited 2, "stopped for
    good, never restarted" (systemd's RestartPreventExitStatus=2, --launchd's 0), so a
    disk hiccup (EIO) or a file-descriptor shortage left the person without a sidecar
    until they noticed. Only what a person must fix (permissions, a read-only file
    system, a file where the directory goes) is final."""
    from deskbridge_sidecar import cli
    from deskbridge_sidecar._daemon import Daemon

    def refuse(self, *args, **kwargs):
        raise _oserror(code)

    monkeypatch.setattr(Path, "mkdir", refuse)
    daemon = Daemon("ws://127.0.0.1:9", "t", data_dir=tmp_path / "d")
    assert await cli._serve(daemon) == status


@pytest.mark.parametrize(
    ("code", "status"),
    [(sqlite3.SQLITE_IOERR, 75), (sqlite3.SQLITE_NOMEM, 75), (sqlite3.SQLITE_PROTOCOL, 75),
     (sqlite3.SQLITE_READONLY, 2), (sqlite3.SQLITE_CANTOPEN, 2), (sqlite3.SQLITE_PERM, 2)],
)  # fmt: skip
async def test_sqlite_refusing_the_ledger_at_start_exits_by_its_kind(
    tmp_path, monkeypatch, code, status
):
    from deskbridge_sidecar import _ledger, cli
    from deskbridge_sidecar._daemon import Daemon

    def refuse(*args, **kwargs):
        exc = sqlite3.OperationalError("refused")
        exc.sqlite_errorcode = code
        raise exc

    monkeypatch.setattr(_ledger.sqlite3, "connect", refuse)
    daemon = Daemon("ws://127.0.0.1:9", "t", data_dir=tmp_path / "d")
    assert await cli._serve(daemon) == status
