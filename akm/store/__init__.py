"""The SQLite journal: the only package in akm that writes SQL.

Modules: `db` (connection, pragmas, `BEGIN IMMEDIATE` helper, timestamps),
`migrations` (numbered schema + ledger), `runs` (runs, step spine, lease),
`units` (unit journal, claims), `events` (event bus, task_history).
Import the submodules directly; this package stays import-light.
"""
