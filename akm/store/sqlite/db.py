"""One SQLite connection per invocation, with the pragmas and transaction rules the journal relies on.

Why it looks like this:

* `isolation_level=None` — we issue `BEGIN IMMEDIATE` ourselves. Python's
  implicit transactions would start deferred transactions that can fail with
  SQLITE_BUSY on upgrade, after work was already done.
* WAL + `synchronous=NORMAL`: readers (`akm status`) never block the engine,
  and a committed step survives a process crash (WAL + NORMAL may lose the
  last commits only on power loss, which we accept for speed). Other journal
  modes (`AKM_SQLITE_JOURNAL_MODE=DELETE|TRUNCATE`, for network filesystems
  where WAL is unsafe) get `synchronous=FULL`.
* One connection shared by the engine's worker threads, guarded by an RLock
  that is held for a whole transaction — so another thread can never
  accidentally "join" a transaction it does not own.
* Every sqlite3 error that escapes becomes a `JournalError` with a readable
  message: users never see a raw traceback for a locked or corrupt journal.
* Timestamps are fixed-width ISO-8601 UTC with milliseconds and `Z`, so
  lease/claim expiry can be compared as strings in SQL.

Opening a journal (`akm.store.open_db`) is one level up, in the package: it connects here, then checks and
applies the ledger in `migrations`, which itself builds on this module; so this module never imports
`migrations`, and the two form no cycle.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from akm.errors import JournalError
from akm.store.clock import now_iso
from akm.store.journal import Dialect, Journal, not_text_error

BUSY_TIMEOUT_MS = 30_000
BEGIN_ATTEMPTS = 5
_BEGIN_BACKOFF_S = (0.001, 0.002, 0.004, 0.008)
_JOURNAL_MODES = ("WAL", "DELETE", "TRUNCATE")
WAL_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return "database is locked" in msg or "database table is locked" in msg or "busy" in msg


def journal_error(exc: sqlite3.Error, what: str, path: str | os.PathLike[str] | None = None) -> JournalError:
    """Turn a sqlite3 error into a user-facing JournalError (callers `raise ... from exc`)."""
    where = f" ({path})" if path is not None else ""
    hint = None
    if _is_locked(exc):
        hint = "Another akm process holds the journal for a long time; retry when it finishes."
    elif "not a database" in str(exc).lower() or "malformed" in str(exc).lower():
        hint = "The journal file is damaged or is not an akm state database; set AKM_DATA_DIR to use another one."
    elif path is not None and os.path.isdir(path):
        hint = "That path is a directory, not a file: move it away, or set AKM_DATA_DIR to another directory."
    elif path is not None and "unable to open" in str(exc).lower():
        hint = (
            "akm could not open or create the journal there (a missing or read-only directory, or no "
            "permission); set AKM_DATA_DIR to a writable directory."
        )
    return JournalError(f"journal {what} failed{where}: {exc}", hint=hint)


class _Transaction:
    """The context manager behind `Journal.tx` (see there)."""

    __slots__ = ("db", "owner")

    def __init__(self, db: SqliteJournal) -> None:
        self.db = db
        self.owner = False

    def __enter__(self) -> sqlite3.Connection:
        db = self.db
        db.lock.acquire()
        try:
            if not db.conn.in_transaction:
                db._begin_immediate()
                self.owner = True  # else join: the outer owner commits or rolls back
        except BaseException:
            db.lock.release()
            raise
        return db.conn

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        db = self.db
        try:
            if not self.owner:
                return False
            if exc is not None:
                db._rollback_quietly()
                if isinstance(exc, sqlite3.Error):
                    raise journal_error(exc, "write", db.path) from exc
                if isinstance(exc, UnicodeEncodeError):
                    raise not_text_error(exc) from None
                return False
            if not db.conn.in_transaction:
                raise JournalError(
                    f"journal write failed ({db.path}): the transaction ended before commit; nothing was saved"
                )
            try:
                db.conn.execute("COMMIT")
            except sqlite3.Error as err:
                db._rollback_quietly()
                raise journal_error(err, "commit", db.path) from err
            if db._checkpoints is not None:
                db._checkpoints.committed(db.conn)
            return False
        finally:
            db.lock.release()


class _Checkpointer:
    """WAL checkpoints on a thread (and connection) of their own while a fan-out writes.

    SQLite checkpoints the WAL inside the COMMIT that pushes it past
    `wal_autocheckpoint` pages, and with `synchronous=NORMAL` that checkpoint
    copies ~1000 pages and syncs the WAL and the database file: one commit in
    ~100 of a fan-out would stall for it while holding the journal lock every
    worker needs. Here the writer's connection stops checkpointing, and every
    `EVERY_COMMITS` commits this thread runs a PASSIVE checkpoint (which never
    blocks the writer) — the same cadence and the same syncs, off the dispatch
    path (a fast fan-out's cadence is slower, see `MIN_CYCLE_S`).

    A checkpoint by another connection cannot rewind the WAL while the writer
    keeps appending (the writer restarts it at its next transaction only when
    every frame was copied), so the WAL would grow for the whole fan-out. Once
    a background checkpoint is done, the writer's next commit therefore copies
    the few frames written meanwhile itself (`caught_up`); its following
    transaction starts the WAL over, and the WAL stays about as small as SQLite's
    own checkpoints keep it.
    """

    EVERY_COMMITS = 100  # ~1000 WAL pages at a unit's ~10 pages per commit: SQLite's default cadence
    # Each cycle still ends on the dispatch path: the writer's catch-up (two syncs inside a commit, while
    # every worker waits for the journal lock: ~4-5 ms on a 2-core test machine) and a WAL restart (one
    # sync more). A fast fan-out (1000 units a second) paid that every 100 units, ~5% of its wall: within
    # a second of the last cycle it waits for 3 x EVERY_COMMITS commits instead (a WAL of ~10 MB at most).
    # Slower commits keep SQLite's cadence, and with it how much a power loss can take (see spec/engine.md).
    MIN_CYCLE_S = 1.0
    FAST_FACTOR = 3

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.cycle_at = (0, -self.MIN_CYCLE_S)  # (commit count, monotonic time) of the last cycle's start
        self.wake = threading.Event()
        self.caught_up = False  # set by the thread after a checkpoint: the writer finishes the job
        self.stopping = False
        self.thread: threading.Thread | None = None

    def committed(self, conn: sqlite3.Connection) -> None:
        """Called under the journal lock after each commit of the writer (`conn`)."""
        self.count += 1
        if self.caught_up:
            self.caught_up = False
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error:
                pass  # advisory, like SQLite's own autocheckpoint
        since = self.count - self.cycle_at[0]
        if since >= self.FAST_FACTOR * self.EVERY_COMMITS or (
            since >= self.EVERY_COMMITS and time.monotonic() - self.cycle_at[1] >= self.MIN_CYCLE_S
        ):
            self.cycle_at = (self.count, time.monotonic())
            if self.thread is None:  # started on the first checkpoint due: a small pass never needs one
                self.thread = threading.Thread(target=self._loop, name="akm-checkpoint", daemon=True)
                self.thread.start()
            self.wake.set()

    def _loop(self) -> None:
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error:
            return  # the writer's own checkpoints (on close, or once this stops) catch up
        try:
            while True:
                self.wake.wait()
                self.wake.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    pass  # advisory, like SQLite's own autocheckpoint
                else:
                    self.caught_up = True
                if self.stopping:  # that was the last one: what the fan-out wrote is in the database file
                    return
        finally:
            conn.close()

    def stop(self) -> None:
        """Let the thread end after one last checkpoint (it runs while the engine goes on: closing
        the journal later then has little left to copy); `join` waits for it."""
        self.stopping = True
        self.wake.set()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class SqliteJournal(Journal):
    """A shared connection plus the transaction helper. Create it with `akm.store.open_db`."""

    dialect = Dialect()
    backend = "sqlite"

    def __init__(self, conn: sqlite3.Connection, path: Path, journal_mode: str) -> None:
        self.conn = conn
        self.path = path
        self.journal_mode = journal_mode
        self.lock = threading.RLock()
        self._checkpoints: _Checkpointer | None = None
        self._checkpoint_users = 0
        self._retired: list[_Checkpointer] = []  # stopped, joined on close (their last checkpoint may run on)

    # -- transactions -------------------------------------------------------------------------

    def tx(self) -> _Transaction:
        """`BEGIN IMMEDIATE` … `COMMIT`; joins a transaction this thread already has open.

        BEGIN is retried (up to 5 attempts) only when it fails with "locked";
        the body is never retried. A body exception rolls back and propagates
        unchanged (sqlite3 errors become JournalError). A plain class, not a
        generator context manager: every unit's journal write goes through here.
        """
        return _Transaction(self)

    def now(self, offset_s: float = 0.0) -> str:
        """The host clock: a SQLite journal is on one host, so its clock is the only one that writes."""
        return now_iso(offset_s)

    def bulk_writes(self) -> Any:
        """A fan-out's many small commits: WAL checkpoints on a background thread (see below)."""
        return self.checkpoints_in_background()

    def _begin_immediate(self) -> None:
        last: sqlite3.Error | None = None
        for attempt in range(BEGIN_ATTEMPTS):
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc):
                    raise journal_error(exc, "begin", self.path) from exc
                last = exc
            else:
                if self.conn.in_transaction:
                    return
                last = sqlite3.OperationalError("BEGIN IMMEDIATE returned without a transaction")
            if attempt < len(_BEGIN_BACKOFF_S):
                time.sleep(_BEGIN_BACKOFF_S[attempt])
        assert last is not None
        raise journal_error(last, "begin", self.path) from last

    def _rollback_quietly(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    @contextmanager
    def checkpoints_in_background(self) -> Iterator[None]:
        """While open, WAL checkpoints run on a background thread instead of inside commits.

        For a stretch of many small commits (a fan-out): see `_Checkpointer`. Nests; the
        last exit restores the connection's own autocheckpoint. Other journal modes: no-op.
        """
        if self.journal_mode != "WAL":
            yield
            return
        with self.lock:
            self._checkpoint_users += 1
            if self._checkpoint_users == 1:
                try:
                    self.conn.execute("PRAGMA wal_autocheckpoint=0")
                    self._checkpoints = _Checkpointer(self.path)
                except sqlite3.Error:
                    pass  # keep SQLite's own checkpoints
        try:
            yield
        finally:
            with self.lock:
                self._checkpoint_users -= 1
                done = self._checkpoints if self._checkpoint_users == 0 else None
                if done is not None:
                    self._checkpoints = None
                    done.stop()  # a checkpoint it is running finishes in the background; close() joins it
                    self._retired = [c for c in self._retired if c.running()] + [done]
                    try:
                        self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
                    except sqlite3.Error:
                        pass

    # -- statements ---------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement (inside the caller's tx if any, else autocommit)."""
        with self.lock:
            try:
                return self.conn.execute(sql, params)
            except UnicodeEncodeError as exc:
                raise not_text_error(exc) from None
            except sqlite3.Error as exc:
                if self.conn.in_transaction:
                    raise  # the owning tx() wraps it after rolling back
                raise journal_error(exc, "statement", self.path) from exc

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """All rows of a SELECT."""
        with self.lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except UnicodeEncodeError as exc:
                raise not_text_error(exc) from None
            except sqlite3.Error as exc:
                if self.conn.in_transaction:
                    raise
                raise journal_error(exc, "read", self.path) from exc

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        for checkpoints in self._retired:  # first: the last connection to close checkpoints the WAL
            checkpoints.join()
        self._retired.clear()
        with self.lock:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass


def journal_mode_from_env() -> str:
    raw = os.environ.get("AKM_SQLITE_JOURNAL_MODE", "").strip().upper()
    return raw if raw in _JOURNAL_MODES else "WAL"


def set_journal_mode(conn: sqlite3.Connection, mode: str) -> str:
    # Switching a fresh file to WAL needs an exclusive lock; another process
    # opening the same new file at the same moment can make it report BUSY.
    for attempt in range(BEGIN_ATTEMPTS + 5):
        try:
            row = conn.execute(f"PRAGMA journal_mode={mode}").fetchone()
            return str(row[0]).upper() if row else mode
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or attempt == BEGIN_ATTEMPTS + 4:
                raise
            time.sleep(0.005 * (attempt + 1))
    return mode  # pragma: no cover
