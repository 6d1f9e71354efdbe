"""Opening a SQLite journal file: connect (`db`), then check and apply its ledger (`migrations`).

Here, above both `db` and `migrations`: `migrations` itself builds on `db`, so neither of the two needs the
other's name at import time.
"""

from __future__ import annotations

import os

from akm.store.sqlite.db import SqliteJournal


def open_db(path: str | os.PathLike[str], *, migrate: bool = True) -> SqliteJournal:
    """Open (creating parent dirs) the journal at `path`, set pragmas, apply pending migrations.

    The journal holds what units printed and reported, so it is as private as akm's config and logs: a
    directory akm creates for it is 0700, and the file is created 0600 before SQLite opens it (SQLite gives
    its `-wal` and `-shm` files the database file's permissions). Existing files keep the modes they have.
    """
    import sqlite3
    from pathlib import Path

    from akm.errors import JournalError
    from akm.store.migrations import apply_migrations, refuse_foreign
    from akm.store.sqlite.db import (
        BUSY_TIMEOUT_MS,
        journal_error,
        journal_mode_from_env,
        set_journal_mode,
    )

    db_path = Path(path)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise JournalError(f"cannot create the journal directory {db_path.parent}: {exc}") from exc
    _create_private(db_path)
    try:
        conn = sqlite3.connect(
            str(db_path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise journal_error(exc, "open", db_path) from exc
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if migrate:
            try:
                refuse_foreign(conn, db_path)  # before any pragma that would change someone else's file
            except JournalError:
                conn.close()
                raise
        mode = set_journal_mode(conn, journal_mode_from_env())
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL" if mode == "WAL" else "PRAGMA synchronous=FULL")
    except sqlite3.Error as exc:
        conn.close()
        raise journal_error(exc, "open", db_path) from exc
    db = SqliteJournal(conn, db_path, mode)
    if migrate:
        try:
            apply_migrations(db)
        except BaseException:
            db.close()
            raise
    return db


def _create_private(db_path: os.PathLike[str]) -> None:
    """Create the journal file empty and 0600 when it does not exist yet (an empty file is a new database to
    SQLite). A failure here is left to `sqlite3.connect`, which says it in its own words."""
    try:
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600))
    except OSError:  # it exists (another process won the race), or the directory is read-only
        pass


def open_db_read_only(path: str | os.PathLike[str]) -> SqliteJournal:
    """The journal opened for reading only, for a directory akm cannot write (a read-only mount, a
    locked-down data dir): `list`, `status`, `log` and `next` still answer there.

    SQLite cannot read a WAL journal read-only without creating its `-shm` file beside it; when that
    fails and no unfinished `-wal` file exists, the file is opened `immutable` (nothing can change it
    while the directory is read-only). Writes fail as JournalError. A journal that still needs
    migrations (an older akm's) cannot be migrated here and is refused, coded.
    """
    import sqlite3
    from pathlib import Path
    from urllib.parse import quote

    from akm.errors import JournalError
    from akm.store.migrations import MIGRATIONS, applied_ids, check_ledger, refuse_foreign
    from akm.store.sqlite.db import BUSY_TIMEOUT_MS, journal_error

    db_path = Path(path)
    if not db_path.is_file():
        raise JournalError(
            f"journal open failed ({db_path}): there is no journal to read and the directory cannot be written"
        )
    base = f"file:{quote(str(db_path))}?mode=ro"
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(
            base, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        if conn is not None:
            conn.close()
        wal = db_path.with_name(db_path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise JournalError(
                f"journal open failed ({db_path}): the directory is read-only and the journal has "
                f"writes not yet merged into it ({wal.name}), which only a writable directory "
                "can apply",
                hint="Make the directory writable once (any akm command), or copy "
                "the journal and its -wal file elsewhere and set AKM_DATA_DIR there.",
            ) from None
        try:
            conn = sqlite3.connect(base + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise journal_error(exc, "open", db_path) from exc
    conn.row_factory = sqlite3.Row
    db = SqliteJournal(conn, db_path, "READONLY")
    try:
        refuse_foreign(conn, db_path)
        if check_ledger(applied_ids(db), MIGRATIONS, db_path) != "current":
            raise JournalError(
                f"the journal {db_path} was written by an older akm and needs an upgrade, which a "
                "read-only directory does not allow",
                hint="Run any akm command once where the "
                "directory is writable, or set AKM_DATA_DIR to a writable copy.",
            )
    except BaseException:
        db.close()
        raise
    return db
