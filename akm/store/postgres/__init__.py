"""The PostgreSQL journal (spec/journal.md): connection, schema, liveness, wake-ups.

Selected by `AKM_JOURNAL_URL` or config `journal.url` (`akm.store.open_journal`). Importing this package imports
no driver; `connect` imports pg8000 lazily, so the SQLite path never loads it.
"""
