"""The durable ledger: what this desktop did, per idempotency key, on disk.

Invariant 2 (effects happen once) needs the sidecar to remember every key it could be
asked about again, for as long as it could be asked: a redelivery may come after a
socket drop, a hub restart, a Redis rewound to an older AOF, or a restart of the
sidecar itself. The old in-memory dedupe cache (256 outcomes, 300 s) forgot: issue 12
measured 49 of 400 keys run twice after a Redis rewind, and a sidecar killed mid-job
ran the job again after its restart.

One SQLite file (the standard library's ``sqlite3``), one row per idempotency key::

    key | tool | args_digest | started_at | finished_at | outcome (JSON) | keep_until

* A key is written as *started* (``begin``) before its tool runs, and its outcome
  (``finish``) before the answer is sent; both commits are durable (WAL,
  ``synchronous=FULL``) when they return.
* A row that is started but not finished when the ledger is opened belongs to a
  process that died mid-job (crash, kill -9, power loss): it is closed at once with the
  outcome ``in_doubt`` (the tool may have acted); its redelivery is answered so and the
  tool never runs again on its own. The caller decides.
* Retention: a row is kept until ``keep_until`` = the job's deadline + the result TTL
  (the latest moment the hub could still deliver it: it drops entries past their
  deadline, and keeps an idempotency key's result for the TTL), and at least
  ``min_keep_s`` after it finished. Expired rows are pruned at open and every
  ``PRUNE_INTERVAL_S``.
* Size: at most ``max_entries`` rows (default :data:`MAX_ENTRIES`, 100,000: tens of MB
  with small outcomes; a desktop doing a job a second for a whole result TTL holds
  300). Past the cap, the oldest *finished* rows go first even if still inside their
  window, with a WARNING naming how many (each may allow a duplicate if redelivered);
  started rows are never evicted.
* Corruption: the file is checked (``PRAGMA quick_check``) at open; a file that is not
  a database or fails the check is moved aside (``<name>.corrupt-<unix time>``), one
  ERROR line says so and that its history is lost, and a fresh ledger starts. It never
  crash-loops.
* One daemon per ledger: the connection holds SQLite's exclusive lock for its life
  (``locking_mode=EXCLUSIVE``); a second daemon on the same file gets
  :class:`LedgerLocked` at once.
* The file must stay where it was opened: every write first checks that the path still
  names the file the connection holds (device and inode). A file (or data directory)
  deleted or replaced under a running daemon would take SQLite's writes into an
  unlinked file, lost at the next open, and free the path for a second daemon; such a
  write is refused with :class:`LedgerError` instead (the tool does not start), and
  reads still answer from the open file. Restarting the sidecar opens a fresh file.
* A full disk (SQLite's ``SQLITE_FULL``, or ``ENOSPC`` / ``EDQUOT`` creating the data
  directory) raises :class:`LedgerFull`, a :class:`LedgerError` that is temporary: at
  start the CLI exits 75 on it (its service manager restarts it), while a write refused
  mid-run refuses only its job (``ledger_error``), as any other failed write.
* The catalogue the hub acknowledged (``_catalogue``): per tool, the fingerprint of the
  last welcomed hello and when the hub first acknowledged it after a change.

Every call that touches the file runs in a worker thread (``trio.to_thread``), one at
a time (a capacity limiter of 1), so the event loop never waits on a disk flush.
Cancelling a caller while its call runs waits for the call to finish (trio's
``to_thread`` default): a write is never half-known.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar, TypeVarTuple, Unpack

import attrs
import trio

from ._errors import LedgerError, LedgerFull, LedgerLocked, LedgerTemporary
from ._outcome import IN_DOUBT, Outcome, outcome_from_json, outcome_to_json

log = logging.getLogger("deskbridge.sidecar.ledger")

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

#: File name of the ledger inside the data directory.
LEDGER_FILE = "ledger.sqlite3"
#: Most rows kept (see the module docstring for the eviction policy).
MAX_ENTRIES = 100_000
#: Seconds between prune passes of a running daemon.
PRUNE_INTERVAL_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT,
    keep_until REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_keep_until ON jobs (keep_until);
CREATE INDEX IF NOT EXISTS jobs_finished_at ON jobs (finished_at);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def args_digest(args: Mapping[str, object]) -> str:
    """SHA-256 of the canonical JSON of ``args`` (sorted keys, no spaces), hex."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@attrs.frozen
class LedgerEntry:
    """One key's record.

    Attributes:
        key: the idempotency key.
        tool: the tool name it ran (or was to run) under.
        args_digest: :func:`args_digest` of its arguments.
        started_at: Unix seconds when the tool was about to start.
        finished_at: Unix seconds when its outcome was recorded, or None while running.
        outcome: the recorded outcome, or None while running.
        keep_until: Unix seconds until which the row is kept.
    """

    key: str
    tool: str
    args_digest: str
    started_at: float
    finished_at: float | None
    outcome: Outcome | None
    keep_until: float

    def matches(self, tool: str, digest: str) -> bool:
        """True if a delivery of ``tool`` with args ``digest`` is the same request."""
        return self.tool == tool and self.args_digest == digest


@attrs.define(eq=False)
class Ledger:
    """The SQLite ledger. Build with :meth:`open` (a file) or :meth:`memory` (tests and
    embedders that accept a ledger that dies with the process).

    Attributes:
        path: the file, or None for an in-memory ledger.
        max_entries: the row cap.
        min_keep_s: a finished row is kept at least this long after it finished.
        recovered: keys found started-but-unfinished at open (now ``in_doubt``).
        moved_aside: where a corrupt file was moved at open, or None.
        instance_id: names the daemon that owns this ledger (``hello.daemon_id``):
            created with the file and kept in it, so it lasts exactly as long as the
            records it vouches for (a fresh or moved-aside file gets a new one; an
            in-memory ledger has one per object). docs/architecture.md, "Instant takeover".
    """

    path: Path | None
    _conn: sqlite3.Connection = attrs.field(repr=False)
    max_entries: int = MAX_ENTRIES
    min_keep_s: float = 300.0
    wall_clock: Callable[[], float] = time.time
    recovered: list[str] = attrs.field(factory=list)
    moved_aside: Path | None = None
    instance_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    #: (st_dev, st_ino) of the file opened, or None (in memory): writes check the path
    #: still names it
    _identity: tuple[int, int] | None = None

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        max_entries: int = MAX_ENTRIES,
        min_keep_s: float = 300.0,
        wall_clock: Callable[[], float] = time.time,
        now: float | None = None,
    ) -> Ledger:
        """Open (or create) the ledger at ``path``; blocking (call it in a thread, with
        ``now``: Unix seconds, default ``wall_clock()``).

        Recovers rows left started by a dead process (``in_doubt``), prunes expired
        rows, and moves a corrupt file aside (one ERROR line) instead of failing.

        Raises:
            LedgerLocked: another process holds the ledger.
            LedgerError: the directory cannot be created or the file cannot be opened
                (permissions, disk), even after moving a corrupt file aside.
        """
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _error(f"cannot create the data directory {path.parent}: {exc}", exc) from exc
        moved: Path | None = None
        try:
            conn = _connect(path)
        except _Corrupt as exc:
            moved = _move_aside(path)
            log.error(
                "ledger %s is corrupt (%s); moved it to %s and started a fresh one: "
                "the history of earlier jobs is lost, so a redelivery of one of them "
                "would run again",
                path,
                exc,
                moved,
            )
            try:
                conn = _connect(path)
            except _Corrupt as exc2:
                raise LedgerError(f"cannot create a fresh ledger at {path}: {exc2}") from exc2
        with contextlib.ExitStack() as on_failure:
            on_failure.callback(conn.close)  # a failed open never keeps the lock
            try:
                instance_id = _instance_id(conn)
            except sqlite3.Error as exc:
                raise _error(f"cannot open the ledger {path}: {exc}", exc) from exc
            ledger = cls(
                path,
                conn,
                max_entries=max_entries,
                min_keep_s=min_keep_s,
                wall_clock=wall_clock,
                moved_aside=moved,
                instance_id=instance_id,
                identity=_identity(path),
            )
            now = wall_clock() if now is None else now
            ledger._recover(now)  # LedgerError on failure
            ledger._prune(now)
            on_failure.pop_all()
        return ledger

    @classmethod
    def memory(
        cls, *, max_entries: int = MAX_ENTRIES, wall_clock: Callable[[], float] = time.time
    ) -> Ledger:
        """A ledger in memory: same rules, gone with the process."""
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        conn.executescript(_SCHEMA)
        return cls(None, conn, max_entries=max_entries, wall_clock=wall_clock)

    def close(self) -> None:
        """Close the file (releases the lock). Idempotent."""
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    # -- async API (worker thread, one at a time) ------------------------------------

    async def get(self, key: str) -> LedgerEntry | None:
        """The row of ``key``, or None. Raises :class:`LedgerError`."""
        entry: LedgerEntry | None = await self._call(self._get, key)
        return entry

    async def keys(self) -> dict[str, tuple[str, str]]:
        """Every key with its ``(tool, args_digest)``. Raises :class:`LedgerError`."""
        keys: dict[str, tuple[str, str]] = await self._call(self._keys)
        return keys

    async def begin(self, key: str, tool: str, digest: str, keep_until: float) -> None:
        """Record ``key`` as started now (durable when this returns).

        Raises:
            LedgerError: the write failed; the tool must not run.
        """
        await self._call(self._begin, key, tool, digest, keep_until, self.wall_clock())

    async def finish(self, key: str, outcome: Outcome, tool: str = "", digest: str = "") -> None:
        """Record ``key``'s outcome now (durable when this returns); a key that was
        never begun gets a row of its own with ``tool`` and ``digest`` (a delivery
        cancelled before it started).

        Raises:
            LedgerError: the write failed.
        """
        await self._call(self._finish, key, outcome, tool, digest, self.wall_clock())

    async def prune(self) -> int:
        """Delete expired rows, then enforce the cap; returns rows deleted."""
        deleted: int = await self._call(self._prune, self.wall_clock())
        return deleted

    async def catalogue(self) -> dict[str, tuple[str, float]]:
        """The catalogue the hub acknowledged, as ``_catalogue`` recorded it: tool name
        -> (:meth:`Tool.fingerprint`, Unix seconds when the hub first acknowledged that
        fingerprint after a change, 0.0 when no change is known). Empty: nothing
        recorded yet (a new ledger). A record written before that time was kept reads as
        fingerprints with 0.0. Raises :class:`LedgerError`."""
        record: dict[str, tuple[str, float]] = await self._call(self._catalogue)
        return record

    async def record_catalogue(self, record: Mapping[str, tuple[str, float]]) -> None:
        """Replace the record :meth:`catalogue` reads (durable when this returns).
        Raises :class:`LedgerError` (:class:`LedgerFull` on a full disk)."""
        await self._call(self._record_catalogue, dict(record))

    def _catalogue(self) -> dict[str, tuple[str, float]]:
        with self._guard("catalogue read"):
            row = self._conn.execute("SELECT value FROM meta WHERE name = 'catalogue'").fetchone()
        try:
            stored = json.loads(row[0]) if row is not None else {}
        except ValueError:
            return {}
        record: dict[str, tuple[str, float]] = {}
        for name, value in stored.items() if isinstance(stored, dict) else ():
            if isinstance(value, str):  # the earlier form: name -> fingerprint
                record[str(name)] = (value, 0.0)
            elif isinstance(value, list) and len(value) == 2:
                record[str(name)] = (str(value[0]), float(value[1]))
        return record

    def _record_catalogue(self, record: dict[str, tuple[str, float]]) -> None:
        text = json.dumps({n: [fp, at] for n, (fp, at) in record.items()}, sort_keys=True)
        with self._guard("catalogue write"):
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('catalogue', ?)", (text,))

    async def _call(self, fn: Callable[[Unpack[_Ts]], _T], *args: *_Ts) -> _T:
        if self.path is None:  # in memory: no disk to wait for, and MockClock stays exact
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- blocking internals ----------------------------------------------------------

    def _guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def guard():  # type: ignore[no-untyped-def]
            try:
                yield
            except sqlite3.Error as exc:
                raise _error(f"ledger {what} failed: {exc}", exc) from exc

        return guard()

    def _get(self, key: str) -> LedgerEntry | None:
        with self._guard("read"):
            row = self._conn.execute(
                "SELECT key, tool, args_digest, started_at, finished_at, outcome, keep_until "
                "FROM jobs WHERE key = ?",
                (key,),
            ).fetchone()
        if row is None:
            return None
        return LedgerEntry(
            key=row[0],
            tool=row[1],
            args_digest=row[2],
            started_at=row[3],
            finished_at=row[4],
            outcome=None if row[5] is None else outcome_from_json(row[5]),
            keep_until=row[6],
        )

    def _keys(self) -> dict[str, tuple[str, str]]:
        with self._guard("read"):
            rows = self._conn.execute("SELECT key, tool, args_digest FROM jobs").fetchall()
        return {k: (t, d) for k, t, d in rows}

    def _check_in_place(self) -> None:
        """Raise :class:`LedgerError` unless ``path`` still names the file opened."""
        if self._identity is None or self.path is None:
            return
        try:
            now = _identity(self.path)
        except OSError as exc:
            now, why = None, str(exc)
        else:
            why = "another file is at its path"
        if now != self._identity:
            raise LedgerError(
                f"ledger write refused: the ledger file {self.path} was deleted or replaced "
                f"while the sidecar ran ({why}); nothing written there would survive a "
                "restart. Restart the sidecar (it opens a fresh ledger)"
            )

    def _begin(self, key: str, tool: str, digest: str, keep_until: float, now: float) -> None:
        self._check_in_place()
        with self._guard("write"):
            self._conn.execute(
                "INSERT INTO jobs (key, tool, args_digest, started_at, keep_until) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "tool = excluded.tool, args_digest = excluded.args_digest, "
                "started_at = excluded.started_at, finished_at = NULL, outcome = NULL, "
                "keep_until = MAX(keep_until, excluded.keep_until)",
                (key, tool, digest, now, keep_until),
            )

    def _finish(self, key: str, outcome: Outcome, tool: str, digest: str, now: float) -> None:
        text = outcome_to_json(outcome)
        self._check_in_place()
        with self._guard("write"):
            cur = self._conn.execute(
                "UPDATE jobs SET finished_at = ?, outcome = ?, "
                "keep_until = MAX(keep_until, ?) WHERE key = ?",
                (now, text, now + self.min_keep_s, key),
            )
            if cur.rowcount == 0:
                self._conn.execute(
                    "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, tool, digest, now, now, text, now + self.min_keep_s),
                )

    def _recover(self, now: float) -> None:
        with self._guard("recovery"):
            rows = self._conn.execute(
                "SELECT key, tool, started_at FROM jobs WHERE finished_at IS NULL"
            ).fetchall()
            for key, tool, started_at in rows:
                outcome = Outcome.failure(
                    IN_DOUBT,
                    f"{tool} started at {_utc(started_at)} and the sidecar stopped before it "
                    "finished; it may have acted. Not run again: check, then retry with a "
                    "new idempotency key if it should run",
                )
                self._conn.execute(
                    "UPDATE jobs SET finished_at = ?, outcome = ?, "
                    "keep_until = MAX(keep_until, ?) WHERE key = ?",
                    (now, outcome_to_json(outcome), now + self.min_keep_s, key),
                )
        self.recovered = [r[0] for r in rows]
        if rows:
            log.warning(
                "%d job(s) were running when the sidecar last stopped; their redeliveries "
                "will be answered in_doubt, not run again: %s",
                len(rows),
                ", ".join(repr(r[0]) for r in rows[:10]) + (" ..." if len(rows) > 10 else ""),
            )

    def _prune(self, now: float) -> int:
        with self._guard("prune"):
            deleted = self._conn.execute(
                "DELETE FROM jobs WHERE keep_until < ? AND finished_at IS NOT NULL", (now,)
            ).rowcount
            (count,) = self._conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
            over = count - self.max_entries
            if over > 0:
                evicted = self._conn.execute(
                    "DELETE FROM jobs WHERE key IN (SELECT key FROM jobs WHERE finished_at "
                    "IS NOT NULL ORDER BY finished_at LIMIT ?)",
                    (over,),
                ).rowcount
                log.warning(
                    "ledger over its cap of %d keys: evicted the %d oldest finished ones "
                    "while still inside their redelivery window (a redelivery of one of "
                    "them would run again)",
                    self.max_entries,
                    evicted,
                )
                deleted += evicted
        return deleted


class _Corrupt(Exception):
    pass


#: What a person must fix (a permission, a read-only file system, a file where the
#: directory goes, a path that cannot be: ``ENOENT`` from ``mkdir -p`` is a dangling
#: link or a place like /proc): restarting cannot help, so it stops for good (exit 2).
_FINAL_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
     errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP}
)  # fmt: skip
_FINAL_SQLITE = frozenset(
    {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM,
     sqlite3.SQLITE_AUTH, sqlite3.SQLITE_NOTADB}
)  # fmt: skip


def final_os_error(exc: OSError) -> bool:
    """Whether ``exc`` is what a person must fix (:data:`_FINAL_ERRNOS`), not a fault of
    the disk or machine that a restart may outlive (also for ``--log-file``)."""
    return exc.errno in _FINAL_ERRNOS


def _error(message: str, exc: BaseException) -> LedgerError:
    """:class:`LedgerFull` when ``exc`` says the disk or the quota is full (SQLite's
    ``SQLITE_FULL``, ``ENOSPC``, ``EDQUOT``); :class:`LedgerError` (final) when it is a
    configuration a person must fix (:data:`_FINAL_ERRNOS`, :data:`_FINAL_SQLITE`); else
    :class:`LedgerTemporary`: a disk or machine fault (``EIO``, ``EMFILE``,
    ``SQLITE_IOERR`` ...), which used to stop the sidecar for good too (exit 2)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    os_errno = getattr(exc, "errno", None)
    if code == sqlite3.SQLITE_FULL or os_errno in (errno.ENOSPC, errno.EDQUOT):
        return LedgerFull(message)
    if code in _FINAL_SQLITE or os_errno in _FINAL_ERRNOS:
        return LedgerError(message)
    return LedgerTemporary(message)


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(
            str(path), timeout=0.5, check_same_thread=False, isolation_level=None
        )
    except sqlite3.Error as exc:
        why = ""
        if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_CANTOPEN and not (
            os.access(path.parent, os.W_OK)
        ):  # SQLite's "unable to open database file" said nothing of why
            why = (
                f" (the data directory {path.parent} is not writable: check its permissions "
                "and file system)"
            )
        raise _error(f"cannot open the ledger {path}: {exc}{why}", exc) from exc
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        conn.execute("BEGIN IMMEDIATE")  # take the write lock now, hold it for life
        conn.executescript(_SCHEMA)  # commits
    except sqlite3.OperationalError as exc:
        conn.close()
        if "locked" in str(exc) or "busy" in str(exc):
            raise LedgerLocked(
                f"another sidecar is using the ledger {path} (one daemon per data "
                "directory: stop it, or give this one its own --data-dir)"
            ) from exc
        raise _error(f"cannot open the ledger {path}: {exc}", exc) from exc
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _Corrupt(str(exc)) from exc
    return conn


def _instance_id(conn: sqlite3.Connection) -> str:
    """The ledger's instance id, created on first use (a committed write)."""
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('instance_id', ?)", (uuid.uuid4().hex,))
    (value,) = conn.execute("SELECT value FROM meta WHERE name = 'instance_id'").fetchone()
    return str(value)


def _identity(path: Path) -> tuple[int, int]:
    """(st_dev, st_ino) of ``path``; raises OSError (e.g. FileNotFoundError)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _move_aside(path: Path) -> Path:
    target = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("", "-wal", "-shm", "-journal"):
        src = Path(str(path) + suffix)
        if src.exists():
            try:
                src.replace(Path(str(target) + suffix))
            except OSError as exc:
                raise LedgerError(f"cannot move the corrupt ledger {src} aside: {exc}") from exc
    return target


def _utc(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


__all__ = [
    "IN_DOUBT",
    "LEDGER_FILE",
    "MAX_ENTRIES",
    "PRUNE_INTERVAL_S",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerFull",
    "LedgerTemporary",
    "LedgerLocked",
    "args_digest",
]
