"""The durable ledger: what this desktop did, per idempotency key, on disk.

Invariant 2 (effects happen once) needs the sidecar to remember every key it could be
asked about again, for as long as it could be asked: a redelivery may come after a
socket drop, a hub restart, a Redis rewound to an older AOF, or a restart of the
sidecar itself. The old in-memory dedupe cache (256 outcomes, 300 s) forgot: issue 12
measured 49 of 400 keys run twice after a Redis rewind, and a sidecar killed mid-job
ran the job again after its restart.

One SQLite file (the standard library's ``sqlite3``), one row per idempotency key::

    key | tool | args_digest | started_at | finished_at | outcome (JSON) | keep_until
        | job_ids (JSON list) | job_keep_until | outcome_bytes

* A key is written as *started* (``begin``) before its tool runs, and its outcome
  (``finish``) before the answer is sent; both commits are durable (WAL,
  ``synchronous=FULL``) when they return.
* A row that is started but not finished when the ledger is opened belongs to a
  process that died mid-job (crash, kill -9, power loss): it is closed at once with the
  outcome ``in_doubt`` (the tool may have acted); its redelivery is answered so and the
  tool never runs again on its own. The caller decides.
* Retention, two windows (docs/architecture.md, "The ledger remembers a job as long as
  the hub"):

  - the *key's* window, ``keep_until`` = the job's deadline + the result TTL, and at
    least ``min_keep_s`` after it finished (as long as the hub's idempotency record
    lives at the least): inside it the key names one request, whatever job carries it
    (a retry the hub enqueued again is answered from the row);
  - the *job's* window, ``job_keep_until`` = ``job_keep_s`` (:data:`JOB_KEEP_S`: the
    hub's ``forwarded_keep_s``, a day + the result TTL, plus a result TTL of slack for
    the hub's last write after the answer) after it finished or after the row last
    answered a delivery: the hub keeps a forwarded, unanswered job that long and may
    redeliver it. Past the key's window the row answers only the jobs it ran for or
    answered (``job_ids``); a job with another id under the key is a new request (the
    hub may have forgotten the key): it runs and takes the row over.

  A row is pruned once both windows are over (a row without job ids, written by an
  older version, at ``keep_until``). Pruned at open and every ``PRUNE_INTERVAL_S``.
* Size: at most ``max_entries`` rows (default :data:`MAX_ENTRIES`, 100,000: a job every
  ~0.9 s for the whole day a row is kept; rows are small once compacted, ~30 MB). Past
  the cap, the oldest *finished* rows go first even if still inside their window, with
  a WARNING naming how many (each may allow a duplicate if redelivered); started rows
  are never evicted. Outcomes together hold at most ``max_bytes`` (:data:`MAX_BYTES`,
  64 MiB): past it, the oldest finished rows' results are dropped (``compacted``) down
  to :data:`COMPACT_TO` of it, and the row answers ``in_doubt`` saying the job ran and
  its result was dropped, never "did not run", and never runs it again; a WARNING names
  how many. The bound is checked at every write of an outcome (a running upper bound,
  no SUM per write), not only at the prune: a burst of large results between two
  prunes (60 s) grew the ledger far past it.
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
#: Longest deadline the hub accepts (``_jobstate.LONGEST_TIMEOUT_S``): one day.
LONGEST_DEADLINE_S = 24 * 3600.0
#: The hub's result TTL by default (``Timings.result_ttl_s``).
RESULT_TTL_S = 300.0


def job_keep_s(result_ttl_s: float = RESULT_TTL_S) -> float:
    """How long a finished row answers its own job's redelivery after it finished or last
    answered one: the hub's ``forwarded_keep_s`` (the longest deadline + the result TTL,
    from its last write about the job) + a result TTL of slack (that last write, the
    ``interrupted`` mark, comes after the answer was lost: a ping timeout at most)."""
    return LONGEST_DEADLINE_S + 2 * result_ttl_s


#: :func:`job_keep_s` for the default result TTL.
JOB_KEEP_S = job_keep_s()
#: Most bytes of outcomes kept (see the module docstring: compaction past it).
MAX_BYTES = 64 * 1024 * 1024
#: Past ``max_bytes``, results are dropped until the outcomes hold at most this share of
#: it: a ledger at its bound would otherwise compact (and SUM every row) at every write.
COMPACT_TO = 0.875
#: An outcome this small is never compacted (the in_doubt text is about as long).
_COMPACT_MIN_BYTES = 512

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT,
    keep_until REAL NOT NULL,
    job_ids TEXT,
    job_keep_until REAL,
    outcome_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
#: Columns added since the first schema (a file written before gets them at open).
_ADDED = (
    ("job_ids", "TEXT"),
    ("job_keep_until", "REAL"),
    ("outcome_bytes", "INTEGER NOT NULL DEFAULT 0"),
)
_INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_keep_until ON jobs (keep_until);
CREATE INDEX IF NOT EXISTS jobs_finished_at ON jobs (finished_at);
CREATE INDEX IF NOT EXISTS jobs_bytes ON jobs (finished_at, outcome_bytes);
"""
#: Most job ids one row remembers (a key answered for many jobs keeps the latest).
_MAX_JOB_IDS = 16
_COLUMNS = (
    "key, tool, args_digest, started_at, finished_at, outcome, keep_until, job_ids, job_keep_until"
)


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
        keep_until: Unix seconds until which the key names one request (the key's
            window); the row may be kept longer for its jobs (``job_keep_until``).
        job_ids: the jobs this row ran for or answered (oldest first); empty for a row
            written by an older version.
        job_keep_until: Unix seconds until which the row answers those jobs, or None.
    """

    key: str
    tool: str
    args_digest: str
    started_at: float
    finished_at: float | None
    outcome: Outcome | None
    keep_until: float
    job_ids: tuple[str, ...] = ()
    job_keep_until: float | None = None

    def matches(self, tool: str, digest: str) -> bool:
        """True if a delivery of ``tool`` with args ``digest`` is the same request."""
        return self.tool == tool and self.args_digest == digest

    def answers(self, job_id: str, now: float) -> bool:
        """True if this row speaks for a delivery of ``job_id`` at ``now``: inside the
        key's window (any job under the key), or for a job the row ran or answered."""
        return now <= self.keep_until or job_id in self.job_ids


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
    #: a finished row answers its jobs this long after it finished or last answered one
    job_keep_s: float = JOB_KEEP_S
    #: most bytes of outcomes held (compaction past it)
    max_bytes: int = MAX_BYTES
    recovered: list[str] = attrs.field(factory=list)
    moved_aside: Path | None = None
    instance_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    #: (st_dev, st_ino) of the file opened, or None (in memory): writes check the path
    #: still names it
    _identity: tuple[int, int] | None = None
    #: at least the bytes of outcomes held (exact after each compaction, raised by each
    #: write; None: not counted yet): the bound is checked at every write without a SUM
    _bytes_at_most: int | None = attrs.field(default=None, init=False)

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
        job_keep_s: float = JOB_KEEP_S,
        max_bytes: int = MAX_BYTES,
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
                job_keep_s=job_keep_s,
                max_bytes=max_bytes,
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
        cls,
        *,
        max_entries: int = MAX_ENTRIES,
        wall_clock: Callable[[], float] = time.time,
        job_keep_s: float = JOB_KEEP_S,
        max_bytes: int = MAX_BYTES,
    ) -> Ledger:
        """A ledger in memory: same rules, gone with the process."""
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        _create(conn)
        return cls(
            None,
            conn,
            max_entries=max_entries,
            wall_clock=wall_clock,
            job_keep_s=job_keep_s,
            max_bytes=max_bytes,
        )

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

    async def index(self) -> dict[str, KeyRecord]:
        """Every key with what the runner decides from memory (:class:`KeyRecord`).
        Raises :class:`LedgerError`."""
        index: dict[str, KeyRecord] = await self._call(self._index)
        return index

    async def begin(
        self, key: str, tool: str, digest: str, keep_until: float, job_id: str | None = None
    ) -> None:
        """Record ``key`` as started now for ``job_id`` (durable when this returns): a
        new run under the key, so the row's earlier jobs are forgotten.

        Raises:
            LedgerError: the write failed; the tool must not run.
        """
        await self._call(self._begin, key, tool, digest, keep_until, job_id, self.wall_clock())

    async def finish(
        self,
        key: str,
        outcome: Outcome,
        tool: str = "",
        digest: str = "",
        job_id: str | None = None,
    ) -> None:
        """Record ``key``'s outcome now (durable when this returns); a key that was
        never begun gets a row of its own with ``tool`` and ``digest`` (a delivery
        cancelled before it started). With ``job_id`` the row answers that job for
        ``job_keep_s`` from now.

        Raises:
            LedgerError: the write failed.
        """
        await self._call(self._finish, key, outcome, tool, digest, job_id, self.wall_clock())

    async def answered(self, key: str, job_id: str) -> None:
        """Note that ``key``'s row answered a delivery of ``job_id`` now: the row answers
        that job ``job_keep_s`` from now (the hub keeps it that long after this
        delivery). Raises :class:`LedgerError`."""
        await self._call(self._answered, key, job_id, self.wall_clock())

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
                f"SELECT {_COLUMNS} FROM jobs WHERE key = ?", (key,)
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
            job_ids=_job_ids(row[7]),
            job_keep_until=row[8],
        )

    def _index(self) -> dict[str, KeyRecord]:
        with self._guard("read"):
            rows = self._conn.execute(
                "SELECT key, tool, args_digest, keep_until, job_ids FROM jobs"
            ).fetchall()
        return {k: KeyRecord(t, d, u, _job_ids(j)) for k, t, d, u, j in rows}

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

    def _begin(
        self, key: str, tool: str, digest: str, keep_until: float, job_id: str | None, now: float
    ) -> None:
        self._check_in_place()
        ids = None if job_id is None else json.dumps([job_id])
        with self._guard("write"):
            self._conn.execute(
                "INSERT INTO jobs (key, tool, args_digest, started_at, keep_until, job_ids) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "tool = excluded.tool, args_digest = excluded.args_digest, "
                "started_at = excluded.started_at, finished_at = NULL, outcome = NULL, "
                "keep_until = MAX(keep_until, excluded.keep_until), "
                "job_ids = excluded.job_ids, job_keep_until = NULL, outcome_bytes = 0",
                (key, tool, digest, now, keep_until, ids),
            )

    def _finish(
        self, key: str, outcome: Outcome, tool: str, digest: str, job_id: str | None, now: float
    ) -> None:
        text = outcome_to_json(outcome)
        self._write_outcome(key, text, tool, digest, job_id, now)
        # the byte bound holds at every write: between two prunes (60 s) a burst of
        # large results grew the ledger far past it
        if self._bytes_at_most is not None:
            self._bytes_at_most += len(text.encode("utf-8"))
        if self._bytes_at_most is None or self._bytes_at_most > self.max_bytes:
            try:  # the outcome is written: a failed compaction is the next prune's
                self._compact()
            except sqlite3.Error as exc:
                self._bytes_at_most = None
                log.warning("ledger: could not drop old results past its size: %s", exc)

    def _write_outcome(
        self, key: str, text: str, tool: str, digest: str, job_id: str | None, now: float
    ) -> None:
        size = len(text.encode("utf-8"))
        self._check_in_place()
        with self._guard("write"):
            row = self._conn.execute("SELECT job_ids FROM jobs WHERE key = ?", (key,)).fetchone()
            if row is None:
                ids: tuple[str, ...] = () if job_id is None else (job_id,)
                self._conn.execute(
                    "INSERT INTO jobs (key, tool, args_digest, started_at, finished_at, "
                    "outcome, keep_until, job_ids, job_keep_until, outcome_bytes) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        key, tool, digest, now, now, text, now + self.min_keep_s,
                        _ids_text(ids), self._job_keep(ids, now), size,
                    ),
                )  # fmt: skip
                return
            ids = _with(_job_ids(row[0]), job_id)
            self._conn.execute(
                "UPDATE jobs SET finished_at = ?, outcome = ?, outcome_bytes = ?, "
                "keep_until = MAX(keep_until, ?), job_ids = ?, job_keep_until = ? "
                "WHERE key = ?",
                (now, text, size, now + self.min_keep_s, _ids_text(ids),
                 self._job_keep(ids, now), key),
            )  # fmt: skip

    def _answered(self, key: str, job_id: str, now: float) -> None:
        self._check_in_place()
        with self._guard("write"):
            row = self._conn.execute(
                "SELECT job_ids FROM jobs WHERE key = ? AND finished_at IS NOT NULL", (key,)
            ).fetchone()
            if row is None:
                return
            ids = _with(_job_ids(row[0]), job_id)
            self._conn.execute(
                "UPDATE jobs SET job_ids = ?, job_keep_until = MAX(COALESCE(job_keep_until, "
                "0), ?) WHERE key = ?",
                (_ids_text(ids), now + self.job_keep_s, key),
            )

    def _job_keep(self, ids: tuple[str, ...], now: float) -> float | None:
        return now + self.job_keep_s if ids else None

    def _recover(self, now: float) -> None:
        with self._guard("recovery"):
            rows = self._conn.execute(
                "SELECT key, tool, started_at, job_ids FROM jobs WHERE finished_at IS NULL"
            ).fetchall()
            for key, tool, started_at, ids in rows:
                outcome = Outcome.failure(
                    IN_DOUBT,
                    f"{tool} started at {_utc(started_at)} and the sidecar stopped before it "
                    f"finished; it may have acted. {_not_run_again(key, ids)}",
                )
                text = outcome_to_json(outcome)
                self._conn.execute(
                    "UPDATE jobs SET finished_at = ?, outcome = ?, outcome_bytes = ?, "
                    "keep_until = MAX(keep_until, ?), job_keep_until = ? WHERE key = ?",
                    (now, text, len(text.encode("utf-8")), now + self.min_keep_s,
                     self._job_keep(_job_ids(ids), now), key),
                )  # fmt: skip
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
                "DELETE FROM jobs WHERE keep_until < ? AND finished_at IS NOT NULL "
                "AND (job_keep_until IS NULL OR job_keep_until < ?)",
                (now, now),
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
            self._compact()
        return deleted

    def _compact(self) -> None:
        """Past ``max_bytes`` of outcomes, drop the oldest finished rows' results down to
        :data:`COMPACT_TO` of it (so that the next compaction, and its SUM over every
        row, comes only after that many more bytes): each row then answers ``in_doubt``
        saying its job ran (never "did not run")."""
        (total,) = self._conn.execute("SELECT COALESCE(SUM(outcome_bytes), 0) FROM jobs").fetchone()
        self._bytes_at_most = total
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * COMPACT_TO)
        rows = self._conn.execute(
            "SELECT key, tool, finished_at, outcome, outcome_bytes, job_ids FROM jobs WHERE "
            "finished_at "
            "IS NOT NULL AND outcome_bytes > ? ORDER BY finished_at",
            (_COMPACT_MIN_BYTES,),
        )
        compacted: list[tuple[str, int, str]] = []
        for key, tool, finished_at, text, size, ids in rows:
            if total <= target:
                break
            was = outcome_from_json(text)
            outcome = Outcome.failure(
                IN_DOUBT,
                f"{tool} ran and {'completed' if was.ok else 'failed'} at "
                f"{_utc(finished_at)}; its result ({size} bytes) was dropped to keep the "
                f"sidecar's ledger within its size. {_not_run_again(key, ids)}",
            )
            small = outcome_to_json(outcome)
            compacted.append((small, len(small.encode("utf-8")), key))
            total -= size - compacted[-1][1]
        self._conn.executemany(
            "UPDATE jobs SET outcome = ?, outcome_bytes = ? WHERE key = ?", compacted
        )
        self._bytes_at_most = total
        log.warning(
            "ledger over its size of %d bytes of results: dropped the results of the %d "
            "oldest finished jobs (a redelivery of one of them is answered in_doubt: it ran, "
            "its result is gone)",
            self.max_bytes,
            len(compacted),
        )


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
        _create(conn)  # commits
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


def _create(conn: sqlite3.Connection) -> None:
    """Create the schema, adding the columns a file written by an older version lacks
    (its outcomes' sizes are counted once)."""
    conn.executescript(_SCHEMA)
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name, kind in _ADDED:
        if name not in have:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
            if name == "outcome_bytes":
                conn.execute(
                    "UPDATE jobs SET outcome_bytes = LENGTH(CAST(outcome AS BLOB)) "
                    "WHERE outcome IS NOT NULL"
                )
    conn.executescript(_INDEXES)


@attrs.frozen
class KeyRecord:
    """What the runner keeps in memory per key (:meth:`Ledger.index`)."""

    tool: str
    args_digest: str
    #: end of the key's window (Unix seconds)
    keep_until: float
    #: the jobs the row ran for or answered
    job_ids: tuple[str, ...] = ()

    def answers(self, job_id: str, now: float) -> bool:
        """As :meth:`LedgerEntry.answers`."""
        return now <= self.keep_until or job_id in self.job_ids


def _job_ids(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        ids = json.loads(text)
    except ValueError:
        return ()
    return tuple(str(i) for i in ids) if isinstance(ids, list) else ()


def _ids_text(ids: tuple[str, ...]) -> str | None:
    return json.dumps(list(ids)) if ids else None


def _with(ids: tuple[str, ...], job_id: str | None) -> tuple[str, ...]:
    """``ids`` with ``job_id`` last (bounded: the oldest go first)."""
    if job_id is None:
        return ids
    return (*(i for i in ids if i != job_id), job_id)[-_MAX_JOB_IDS:]


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


def _not_run_again(key: str, job_ids: str | None) -> str:
    """The advice of an ``in_doubt`` answer from the row of ``key`` (``job_ids``: its
    column): a call without an idempotency key has its job id for key, and is not told
    of a key it never gave."""
    if key in _job_ids(job_ids):
        return "Not run again: check, then call again if it should run"
    return "Not run again: check, then retry with a new idempotency key if it should run"


def _utc(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


__all__ = [
    "IN_DOUBT",
    "JOB_KEEP_S",
    "LEDGER_FILE",
    "MAX_BYTES",
    "MAX_ENTRIES",
    "PRUNE_INTERVAL_S",
    "KeyRecord",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerFull",
    "LedgerTemporary",
    "LedgerLocked",
    "args_digest",
    "job_keep_s",
]
