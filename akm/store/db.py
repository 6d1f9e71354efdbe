"""The names older code imports from `akm.store.db`: the journal type and the timestamp helpers.

The SQLite connection code moved to `akm.store.sqlite.db` (a backend of `akm.store.journal`), the stamps to
`akm.store.clock`. `Database` is the journal interface, so a type hint `Database` accepts either backend.
"""

from __future__ import annotations

from akm.store.clock import format_iso, now_iso, parse_iso
from akm.store.journal import Journal
from akm.store.sqlite.db import (
    BEGIN_ATTEMPTS,
    BUSY_TIMEOUT_MS,
    WAL_AUTOCHECKPOINT_PAGES,
    SqliteJournal,
    _Checkpointer,
    journal_error,
    journal_mode_from_env,
    set_journal_mode,
)

Database = Journal

__all__ = [
    "BEGIN_ATTEMPTS",
    "BUSY_TIMEOUT_MS",
    "WAL_AUTOCHECKPOINT_PAGES",
    "Database",
    "Journal",
    "SqliteJournal",
    "_Checkpointer",
    "format_iso",
    "journal_error",
    "journal_mode_from_env",
    "now_iso",
    "parse_iso",
    "set_journal_mode",
]
