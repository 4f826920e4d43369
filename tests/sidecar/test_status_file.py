"""The status file (``deskbridge-sidecar status``) is shared by every process pointed at a
data directory: only the daemon holding that directory's ledger writes it, from just
after the ledger is locked to a final ``stopped`` record just before it is released.
Against the FakeHub on MockClock; the CLI's one-line refusals are in test_cli."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import trio
from deskbridge_sidecar import _status
from deskbridge_sidecar._errors import LedgerError, LedgerLocked
from deskbridge_sidecar._ledger import LEDGER_FILE, Ledger
from deskbridge_sidecar._runner import ToolRunner
from deskbridge_sidecar.testing import FakeHub, FakeWallClock

from .conftest import make_daemon

DEADLINE_S = 20


def _other_daemons_status(path: Path) -> bytes:
    body = {
        "pid": os.getpid(), "version": "0.1.0", "hub": "ws://h", "connected": True,
        "session_id": "s-holder", "since": time.time(), "last_error": None, "tools": ["echo"],
        "running": None, "updated_at": time.time(),
    }  # fmt: skip
    _status.write(path, body)
    return path.read_bytes()


async def test_a_daemon_refused_the_ledger_leaves_the_status_file_alone(
    autojump_clock, hub: FakeHub, wall: FakeWallClock, tmp_path: Path
) -> None:
    holder = Ledger.open(tmp_path / LEDGER_FILE)  # the sidecar already running here
    status_file = tmp_path / "status.json"
    before = _other_daemons_status(status_file)
    try:
        daemon = make_daemon(hub, wall, data_dir=tmp_path, status_file=status_file)
        with pytest.raises(LedgerLocked):  # the error itself, not an exception group
            await daemon.run()
    finally:
        holder.close()
    assert status_file.read_bytes() == before
    assert _status.report(status_file)[0] == 0


async def test_a_ledger_that_cannot_be_read_is_raised_plainly_and_writes_no_status(
    autojump_clock,
    hub: FakeHub,
    wall: FakeWallClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def unreadable(self: ToolRunner) -> None:
        raise LedgerError("ledger read failed: disk I/O error")

    monkeypatch.setattr(ToolRunner, "load", unreadable)
    status_file = tmp_path / "status.json"
    daemon = make_daemon(hub, wall, data_dir=tmp_path, status_file=status_file)
    with pytest.raises(LedgerError, match="disk I/O error"):
        await daemon.run()
    assert not status_file.exists()
    Ledger.open(tmp_path / LEDGER_FILE).close()  # released: the next sidecar can start


async def _status_says(path: Path, **fields: object) -> dict[str, object]:
    """The status file once it holds ``fields`` (the writer's file I/O is in a thread,
    so these tests run on the real clock, bounded by ``fail_after``)."""
    while True:
        body = _status.read(path)
        if body is not None and all(body.get(k) == v for k, v in fields.items()):
            return body
        await trio.sleep(0.05)


async def test_the_stopped_record_is_written_before_the_ledger_is_released(
    nursery: trio.Nursery,
    hub: FakeHub,
    wall: FakeWallClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status_file = tmp_path / "status.json"
    at_release: list[dict[str, object]] = []
    released = trio.Event()
    real_close = Ledger.close

    def close(self: Ledger) -> None:
        if self.path is not None:
            at_release.append(json.loads(status_file.read_text()))
            released.set()
        real_close(self)

    monkeypatch.setattr(Ledger, "close", close)
    daemon = make_daemon(hub, wall, data_dir=tmp_path, status_file=status_file)
    with trio.fail_after(DEADLINE_S):
        session_id = await nursery.start(daemon.run)
        running = await _status_says(status_file, session_id=session_id)
        assert running["pid"] == os.getpid() and running["connected"] is True
        daemon.stop()
        await _status_says(status_file, stopped=True)
        await released.wait()
    # A successor may take the ledger the moment it is released: by then this daemon has
    # said its last word, so its "stopped" never lands over the successor's "running".
    assert len(at_release) == 1
    assert at_release[0]["stopped"] is True and at_release[0]["pid"] is None


async def test_a_status_file_that_cannot_be_written_is_one_warning_not_a_crash(
    nursery: trio.Nursery,
    hub: FakeHub,
    wall: FakeWallClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    status_file = tmp_path / "status.json"
    status_file.mkdir()  # cannot be replaced by a file
    daemon = make_daemon(hub, wall, data_dir=tmp_path, status_file=status_file)
    with (
        caplog.at_level(logging.WARNING, logger="deskbridge.sidecar.status"),
        trio.fail_after(DEADLINE_S),
    ):
        await nursery.start(daemon.run)
        await trio.sleep(2.5)  # three attempts
    assert daemon.session_id is not None  # still serving
    warnings = [r for r in caplog.records if r.name == "deskbridge.sidecar.status"]
    assert len(warnings) == 1 and "cannot write the status file" in warnings[0].getMessage()
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []  # no litter
    daemon.stop()
