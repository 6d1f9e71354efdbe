"""The suite itself: what happens without ../shared, in and out of CI (issue 6 item 17)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.helpers import ROOT


def _copy_without_shared(tmp_path):
    """This checkout's code and tests, in a directory with no ../shared beside it."""
    repo = tmp_path / "lonely" / "repo"
    repo.mkdir(parents=True)
    for name in ("akm", "tests"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def _pytest(repo, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("AKM_")}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(repo)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/test_corpus_plan.py",
            "-k",
            "present",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_shared_skips_with_the_reason_outside_ci_and_fails_in_ci(tmp_path):
    repo = _copy_without_shared(tmp_path)
    local = _pytest(repo, None)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "needs the shared workflow corpus at" in local.stdout
    assert "in CI (CI=1) its absence is a failure" in local.stdout

    ci = _pytest(repo, "1")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "test_the_shared_corpus_is_present" in ci.stdout and "corpus not found" in ci.stdout
