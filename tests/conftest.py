"""Shared fixtures: an isolated data dir per test, and the built zipapp for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import CORPUS, ROOT, SHARED, corpus_files, journal_backend, needs_shared, pg_bindir, running_in_ci  # noqa: F401


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch, request):
    """Every test gets its own journal and never touches the user's real data dir."""
    monkeypatch.setenv("AKM_DATA_DIR", str(tmp_path / "akm-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("AKM_JOURNAL_URL", raising=False)
    if journal_backend() != "postgres":
        yield
        return
    from tests import pgcluster

    with pgcluster.fresh_schema(request.getfixturevalue("pg_cluster")) as url:
        monkeypatch.setenv("AKM_JOURNAL_URL", url)
        yield


@pytest.fixture(params=["sqlite", "postgres"])
def journal_at(request, tmp_path):
    """Where the conformance tests' journal lives: an SQLite file, or a fresh schema's URL on the
    throwaway PostgreSQL cluster. Open it with `tests.helpers.open_at` (a child process too)."""
    if request.param == "sqlite":
        yield tmp_path / "akm-journal.sqlite3"
        return
    from tests import pgcluster

    with pgcluster.fresh_schema(request.getfixturevalue("pg_cluster")) as url:
        yield url


@pytest.fixture
def journal(journal_at):
    """The conformance fixture: the same store test on an SQLite file and on a PostgreSQL schema."""
    from tests.helpers import open_at

    db = open_at(journal_at)
    yield db
    db.close()


@pytest.fixture(scope="session")
def akm_bin(tmp_path_factory) -> Path:
    """Build dist/akm once per test session (always fresh, so tests see the current code)."""
    if os.environ.get("AKM_TEST_SKIP_BUILD") != "1" or not (ROOT / "dist" / "akm").exists():
        proc = subprocess.run(["bash", str(ROOT / "build.sh")], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, f"build.sh failed:\n{proc.stdout}\n{proc.stderr}"
    return ROOT / "dist" / "akm"


@pytest.fixture(scope="session")
def shiv_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shiv-root")


class Akm:
    """Runs akm as a user would: a real process, its own data dir and working directory."""

    def __init__(self, argv0: list[str], data_dir: Path, cwd: Path, env: dict[str, str]):
        self.argv0, self.data_dir, self.cwd, self.env = argv0, data_dir, cwd, env

    def __call__(self, *args: str, timeout: float = 120, check: int | None = None, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*self.argv0, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout, **kw
        )
        if check is not None:
            assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        return proc

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [*self.argv0, *args],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kw,
        )

    def json(self, *args: str, check: int | None = 0, timeout: float = 120) -> dict:
        proc = self(*args, "--format", "json", check=check, timeout=timeout)
        return json.loads(proc.stdout)


def _env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env["AKM_DATA_DIR"] = str(tmp_path / "akm-data")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    env.update(extra or {})
    return env


@pytest.fixture
def project(tmp_path) -> Path:
    d = tmp_path / "project"
    d.mkdir()
    return d


@pytest.fixture
def akm(tmp_path, project) -> Akm:
    """akm from source (`python -m akm`): fast, same code path as the zipapp."""
    env = _env(tmp_path, {"PYTHONPATH": str(ROOT)})
    return Akm([sys.executable, "-m", "akm"], tmp_path / "akm-data", project, env)


@pytest.fixture
def akm_zipapp(tmp_path, project, akm_bin, shiv_root) -> Akm:
    """The built single-file executable, driven like a user would."""
    env = _env(tmp_path, {"SHIV_ROOT": str(shiv_root)})
    return Akm([str(akm_bin)], tmp_path / "akm-data", project, env)


@pytest.fixture
def fake_openai():
    """A real OpenAI-compatible chat server on 127.0.0.1 (tests/fake_openai.py: behaviour by model name)."""
    from tests.fake_openai import FakeOpenAI

    server = FakeOpenAI()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def cli(project, monkeypatch, capsys):
    """`akm` in this process (`akm.cli.main`), run from the project directory: the fast way to test the
    CLI front. `cli(*args, check=N)` -> (returncode, stdout, stderr); `cli.json(*args)` parses stdout.
    Use `akm`/`akm_zipapp` when a real process matters (signals, a crashed driver, the built zipapp)."""
    from akm.cli import main

    monkeypatch.chdir(project)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def call(*args: str, check: int | None = None) -> SimpleNamespace:
        code = main(list(args))
        captured = capsys.readouterr()
        for signum, handler in saved.items():  # `workflow run` installs its own handlers
            signal.signal(signum, handler)
        if check is not None:
            assert code == check, f"exit {code}\nstdout:\n{captured.out}\nstderr:\n{captured.err}"
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    def call_json(*args: str, check: int | None = 0) -> dict:
        return json.loads(call(*args, "--format", "json", check=check).stdout)

    call.json = call_json  # type: ignore[attr-defined]
    return call


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL server for the whole session (tests/pgcluster.py).

    Skipped locally when no PostgreSQL binaries are installed; in CI (CI=1) their absence is a failure,
    because .ci/run installs them.
    """
    from tests import pgcluster

    with pgcluster.cluster(pg_bindir()) as c:
        yield c


@pytest.fixture
def pg_journal_url(pg_cluster):
    """A journal URL naming a fresh schema on the throwaway cluster, for tests that pass it to a child
    process themselves (the `akm` fixtures' environment carries no AKM_ variable of the test's own)."""
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        yield url


@pytest.fixture
def pg_db(pg_journal_url):
    """(journal, url): a journal opened on a fresh schema of the throwaway cluster, closed after the test."""
    from akm.store import open_journal

    db = open_journal(pg_journal_url)
    try:
        yield db, pg_journal_url
    finally:
        db.close()
