"""The names older code imports from `akm.store.db`: the journal type and the timestamp helpers.

The SQLite connection code moved to `akm.store.sqlite.db` (a backend of `akm.store.journal`), the stamps to
`akm.store.clock`. `Database` is the journal interface, so a type hint `Database` accepts either backend.
Only names still imported through here are kept (the engine's `Database`, the tests' stamps and
`_Checkpointer`); new code imports from where a name lives.
"""

from __future__ import annotations

from akm.store.clock import format_iso, now_iso, parse_iso
from akm.store.journal import Journal
from akm.store.sqlite.db import _Checkpointer

Database = Journal

__all__ = ["Database", "_Checkpointer", "format_iso", "now_iso", "parse_iso"]
