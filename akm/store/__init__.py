"""The journal: the only package in akm that writes SQL.

Modules: `journal` (the interface every backend implements: transactions, the journal clock, a `Dialect`),
`clock` (the timestamp format), the shared domain layer — `runs` (runs, step spine, lease), `units` (unit
journal, claims), `events` (event bus, task_history) — and the backends: `sqlite/` (the embedded default:
`db` connection and `BEGIN IMMEDIATE`, `open`) with `migrations` (its numbered schema and the ledger rule
both backends share), and `postgres/` (a server shared by many hosts: `connect`, `schema`, `db`).

`open_journal` picks the backend (`AKM_JOURNAL_URL` or config `journal.url`; SQLite by default); `open_db`
and `open_db_read_only` open a SQLite file. Import the submodules directly; this package stays
import-light (its own imports wait for the first open).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akm.store.journal import Journal
    from akm.store.sqlite.db import SqliteJournal

__all__ = ["open_db", "open_db_read_only", "open_journal"]


def open_db(path: str | os.PathLike[str], *, migrate: bool = True) -> SqliteJournal:
    """Open (creating parent dirs) the SQLite journal at `path`, set pragmas, apply pending migrations."""
    from akm.store.sqlite.open import open_db as _open

    return _open(path, migrate=migrate)


def open_db_read_only(path: str | os.PathLike[str]) -> SqliteJournal:
    """The SQLite journal opened for reading only (see `akm.store.sqlite.open.open_db_read_only`)."""
    from akm.store.sqlite.open import open_db_read_only as _open

    return _open(path)


JOURNAL_URL_ENV = "AKM_JOURNAL_URL"


def server_url(raw: str) -> str | None:
    """A configured journal URL, trimmed, or None for the SQLite file: a `sqlite:` URL or an empty value
    means the default SQLite journal (the one rule for `AKM_JOURNAL_URL` and config `journal.url`)."""
    raw = raw.strip()
    if not raw or raw.startswith("sqlite:"):
        return None
    return raw


def journal_url() -> str | None:
    """The journal server `AKM_JOURNAL_URL` names (`server_url`), or None for the SQLite file."""
    return server_url(os.environ.get(JOURNAL_URL_ENV, ""))


def open_journal(url: str, *, migrate: bool = True) -> Journal:
    """The journal at `url`: a `postgresql://` server (`akm.store.postgres.db.open_pg`; the password may be
    `${ENV_VAR}`), or a `sqlite:///path` file. Anything else is JOURNAL_URL_INVALID."""
    if url.startswith("sqlite:///"):
        return open_db(url[len("sqlite://") :], migrate=migrate)
    from akm.store.postgres.db import open_pg

    return open_pg(url, migrate=migrate)
