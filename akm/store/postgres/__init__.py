"""The PostgreSQL journal (issue 18; design: postgres.md): connection, schema and the race-prone domain operations.

Not yet wired into the engine: nothing outside this package and its tests calls it, and `AKM_JOURNAL_URL` does
not select it yet (spec/journal.md). Importing this package imports no driver; `connect` imports pg8000 lazily, so
the SQLite path never loads it.
"""
