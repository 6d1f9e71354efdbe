"""`akm log` error paths (cursor parsing, unknown runs)."""

from __future__ import annotations

import shutil

from tests.helpers import ROOT


def _completed_run(akm, project) -> str:
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    return akm.json("workflow", "run", "hello.md", "--count", "1")["run"]["runId"]


def test_log_huge_offset_is_a_usage_error_not_an_internal_error(akm, project):
    """`--since @offset:<more than 2^63>` reached SQLite and crashed with INTERNAL (exit 70)."""
    run_id = _completed_run(akm, project)
    proc = akm("log", "--run", run_id, "--since", "@offset:99999999999999999999999")
    assert proc.returncode == 2, proc.stderr
    assert "error[INVALID_ARGUMENT]" in proc.stderr and "the offset must be a whole number" in proc.stderr


def test_log_unknown_run_is_not_found(akm, project):
    """`workflow status nope` says RUN_NOT_FOUND (exit 1); `akm log --run nope` silently printed nothing, exit 0."""
    _completed_run(akm, project)
    proc = akm("log", "--run", "00000000-0000-4000-8000-000000000000")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RUN_NOT_FOUND" in proc.stderr


def test_log_malformed_cursor_is_not_silently_ignored(akm, project):
    """`--since 2` (no `@offset:` prefix) was accepted and returned every event from offset 0."""
    run_id = _completed_run(akm, project)
    proc = akm("log", "--run", run_id, "--since", "2", "--format", "json")
    assert proc.returncode == 2, proc.stdout
    assert '"code": "INVALID_ARGUMENT"' in proc.stderr and "expected @offset:N" in proc.stderr, proc.stderr
