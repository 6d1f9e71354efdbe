"""Helpers the test modules share: writing workflows, running them, reading the journal.

Kept here (not in a test module) so that tests import helpers, never each other.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import textwrap
import time
from pathlib import Path

import pytest

from akm import api, paths

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CORPUS = SHARED / "corpus"


def running_in_ci() -> bool:
    """CI is told apart by the `CI` variable (.ci/run sets CI=1; hosted CI services set it too)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def needs_shared() -> pytest.MarkDecorator:
    """Mark tests that read the reference material in ../shared (the workflow corpus).

    Outside CI, a checkout without ../shared skips them with a reason that says what is
    missing and where. In CI the mark does nothing: the tests run and a missing ../shared
    fails loudly (see `test_the_shared_corpus_is_present`), so CI never passes by skipping.
    """
    if running_in_ci() or (CORPUS / "current").is_dir():
        return pytest.mark.needs_shared
    return pytest.mark.skip(
        reason=f"needs the shared workflow corpus at {CORPUS} (../shared beside this checkout), which is "
        "absent here; in CI (CI=1) its absence is a failure instead of a skip"
    )


def corpus_files(kind: str) -> list[Path]:
    """`current` or `legacy` corpus workflows, sorted (empty when ../shared is absent)."""
    return sorted((CORPUS / kind).glob("*.md"))


PY = sys.executable


def write_wf(dir_: Path, name: str, frontmatter: str, body: str) -> Path:
    """A workflow file: the frontmatter and body dedented, as a user would write them."""
    path = dir_ / name
    path.write_text(
        "---\n" + textwrap.dedent(frontmatter).strip() + "\n---\n\n" + textwrap.dedent(body).strip() + "\n",
        encoding="utf-8",
    )
    return path


def py(code: str) -> str:
    """A flow-style YAML argv running python code (JSON is valid YAML)."""
    return json.dumps([PY, "-c", textwrap.dedent(code).strip()])


def pg_bindir() -> Path:
    """Where PostgreSQL's binaries are, for a throwaway cluster (tests/pgcluster.py). Skipped locally when none
    are installed; in CI (CI=1) their absence is a failure, because .ci/run installs them."""
    from tests import pgcluster

    bindir = pgcluster.find_bindir()
    if bindir is None:
        if running_in_ci():
            pytest.fail("PostgreSQL binaries (initdb, pg_ctl) not found; .ci/run installs the postgresql package")
        pytest.skip("no PostgreSQL binaries found (set AKM_TEST_PG_BINDIR)")
    return bindir


def journal_backend() -> str:
    """The journal the engine tests run on: `AKM_TEST_JOURNAL=postgres` points them at the throwaway
    PostgreSQL cluster (conftest: a fresh schema per test, through AKM_JOURNAL_URL); default SQLite."""
    return os.environ.get("AKM_TEST_JOURNAL", "sqlite").strip().lower() or "sqlite"


def open_at(where):
    """Open the journal at `where`: a `postgresql://` URL, else an SQLite file path."""
    from akm.store import open_db, open_journal

    where = str(where)
    return open_journal(where) if where.startswith("postgresql://") else open_db(where)


def open_test_journal():
    """This test's journal as the engine opens it: the SQLite file, or the PostgreSQL schema that
    AKM_TEST_JOURNAL=postgres gave the test (AKM_JOURNAL_URL)."""
    from akm.store import open_db, open_journal

    url = os.environ.get("AKM_JOURNAL_URL")
    return open_journal(url) if url else open_db(paths.journal_path())


class _SqlOnJournal:
    """`sqlite3.connect(journal)`'s surface (execute, commit, close; rows as tuples) over the test's
    PostgreSQL journal, for tests that read or tamper with rows directly (autocommit)."""

    def __init__(self, db) -> None:
        self.db = db

    def execute(self, sql: str, args=()):
        cur = self.db.execute(sql, tuple(args))
        cur.rows = [tuple(r) for r in cur.rows]
        return cur

    def commit(self) -> None:
        pass

    def close(self) -> None:
        self.db.close()


def journal_sql():
    """A raw connection to this test's journal: sqlite3 on the SQLite file, else the PostgreSQL schema."""
    if os.environ.get("AKM_JOURNAL_URL"):
        return _SqlOnJournal(open_test_journal())
    return sqlite3.connect(paths.journal_path())


def journal_bytes() -> bytes:
    """Everything this test's journal stores, as bytes (to prove a secret is in none of it): the SQLite
    data dir's files, or every row of every table of the test's PostgreSQL schema."""
    if not os.environ.get("AKM_JOURNAL_URL"):
        data = Path(paths.journal_path()).parent
        return b"".join(f.read_bytes() for f in data.iterdir() if f.is_file())
    db = open_test_journal()
    try:
        tables = [
            r[0]
            for r in db.query("SELECT table_name FROM information_schema.tables WHERE table_schema = ?", (db.schema,))
        ]
        return b"".join(repr([tuple(r) for r in db.query(f"SELECT * FROM {t}")]).encode() for t in tables)
    finally:
        db.close()


def sqlite_only(db, why: str) -> None:
    """Skip this case of a conformance test on the PostgreSQL journal: it reads SQLite's own machinery or
    stores values only SQLite's untyped columns take (`why`); the SQLite case keeps its assertions."""
    if getattr(db, "backend", "sqlite") != "sqlite":
        pytest.skip(f"SQLite journal only: {why}")


def db_rows(sql: str, *args) -> list[tuple]:
    """Rows of a query on this test's journal (a real SQLite file, or the test's PostgreSQL schema)."""
    url = os.environ.get("AKM_JOURNAL_URL")
    if url:
        from akm.store import open_journal

        db = open_journal(url)
        try:
            return [tuple(r) for r in db.query(sql, args)]
        finally:
            db.close()
    con = sqlite3.connect(paths.journal_path())
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def run(path_or_id, project: Path, **kw) -> api.RunResult:
    """Start or continue a run from `project`, in process."""
    return api.run_workflow(str(path_or_id), cwd=str(project), **kw)


def steps_of(result: api.RunResult) -> dict[str, dict]:
    """A run result's steps by id, as plain dicts."""
    return {s.id: s.model_dump() for s in result.run.steps}


def wait_until(predicate, *, what: str = "condition", timeout: float = 120.0, every: float = 0.02):
    """Poll `predicate` until it returns something truthy (returned); fail naming `what` after a generous
    deadline. Tests wait for the event, never for a time window."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def process_gone(pid: int) -> bool:
    """The process exited: no such pid, or a zombie nobody reaped yet (a zombie is dead for our purpose)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def create_run(project: Path, wf: Path, plan, run_id: str, params: dict | None = None) -> str:
    """A run of `plan` (compiled from `wf`) created as `workflow run` creates one, with a chosen id and
    nothing driven: for tests that alter the plan first, or need two ids that share a prefix."""
    from akm.format.params import check_params
    from akm.plan.model import UNIT_HASH_VERSION
    from akm.store import runs as runs_store

    with open_test_journal() as db:
        runs_store.create_run(
            db,
            run_id=run_id,
            workflow_ref=str(wf),
            workflow_path=str(wf),
            title=plan.title,
            scope_key=paths.scope_key(project, portable=db.shared),
            params=check_params(dict(params or {}), plan.param_schemas or {}),
            plan_json=plan.canonical(),
            plan_hash=plan.plan_hash(),
            hash_version=UNIT_HASH_VERSION,
            step_ids=[s.step_id for s in plan.steps],
        )
    return run_id


def bare_run(db, run_id: str = "r1", step_ids=("build",), **fields):
    """A run row straight in the store, with a placeholder plan and nothing driven: for store tests that need a
    run to hang units, leases and events on. `fields` overrides any other argument of `runs.create_run`."""
    from akm.store import runs

    args = {
        "run_id": run_id,
        "workflow_ref": "workflows/w",
        "workflow_path": None,
        "title": "t",
        "scope_key": "s",
        "params": {},
        "plan_json": "{}",
        "plan_hash": "0" * 64,
        "hash_version": 1,
        "step_ids": list(step_ids),
        **fields,
    }
    return runs.create_run(db, **args)


def step_row(db, run_id: str, step_id: str):
    """One step row of a run as the journal holds it (None: no such step)."""
    from akm.store import runs

    return next((s for s in runs.get_steps(db, run_id) if s.step_id == step_id), None)


def put(db, fence, unit_id="build.unit:1", **kw):
    """Queue one exec unit of step `build` of run r1 for workers (`queue.queue_unit`; `kw` overrides any field)."""
    from akm.store import queue

    args = dict(
        run_id="r1",
        unit_id=unit_id,
        step_id="build",
        node_id="build.unit",
        parent_unit_id=None,
        runner="exec",
        engine=None,
        model=None,
        input_hash="h1",
        dispatch_json='{"v":1}',
        fence=fence,
    )
    args.update(kw)
    return queue.queue_unit(db, **args)
