"""The engine suites a second time, on the PostgreSQL journal (postgres.md §3.3, "the DBOS way").

Why a test and not a second line in .ci/run: CI runs exactly the README's pytest command
(tests/test_docs_quickstart.py), so the second pass is a test of that run. It starts pytest again with
`AKM_TEST_JOURNAL=postgres` (conftest: every test's journal a fresh schema on a throwaway server) over a
chosen subset that passes reliably there. Marked slow: about a minute on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, journal_backend, pg_bindir

SUBSET = [
    "tests/test_parity.py",
    "tests/test_engine.py",
    "tests/test_engine_errors.py",
    "tests/test_engine_evidence.py",
    "tests/test_engine_orphans.py",
    "tests/test_engine_params.py",
    "tests/test_engine_redact.py",
    "tests/test_engine_semantics.py",
    "tests/test_engine_start_race.py",
    "tests/test_engines_e2e.py",
    "tests/test_session.py",
    "tests/test_abandon.py",
    "tests/test_cli_lease.py",
    "tests/test_worker.py",
]


@pytest.mark.slow
def test_engine_suites_pass_on_the_postgresql_journal():
    if journal_backend() == "postgres":
        pytest.skip("already the PostgreSQL pass")
    pg_bindir()  # skipped locally without PostgreSQL, a failure in CI
    env = {k: v for k, v in os.environ.items() if k != "AKM_JOURNAL_URL"}
    env["AKM_TEST_JOURNAL"] = "postgres"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *SUBSET],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
