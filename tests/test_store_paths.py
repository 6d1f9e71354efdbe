"""Data dir and run scope (akm/paths.py) on real directories."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from akm import paths


def test_data_dir_env_override_is_trimmed(monkeypatch, tmp_path):
    monkeypatch.setenv("AKM_DATA_DIR", f"  {tmp_path}/data  ")
    assert paths.data_dir() == tmp_path / "data"
    assert paths.journal_path() == tmp_path / "data" / "akm-journal.sqlite3"


def test_data_dir_default_is_platformdirs(monkeypatch, tmp_path):
    monkeypatch.setenv("AKM_DATA_DIR", "   ")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    got = paths.data_dir()
    assert got.name == "akm"
    if os.name == "posix" and not str(got).startswith("/Users/"):
        assert got == tmp_path / "xdg" / "akm"


def _clean_ancestors(p: Path) -> bool:
    return not any((a / ".akm").is_dir() or os.path.lexists(a / ".git") for a in [p, *p.parents])


def test_project_root_prefers_akm_dir_then_git_then_cwd(tmp_path):
    if not _clean_ancestors(tmp_path):
        pytest.skip("tmp dir sits inside a project")
    outer = tmp_path / "outer"
    repo = outer / "repo"
    deep = repo / "src" / "pkg"
    deep.mkdir(parents=True)
    real = lambda p: Path(os.path.realpath(p))  # noqa: E731
    assert paths.project_root(deep) == real(deep)  # nothing: cwd
    (repo / ".git").write_text("gitdir: elsewhere\n")  # worktree-style .git file counts
    assert paths.project_root(deep) == real(repo)
    (outer / ".akm").write_text("a file, not a project dir")
    assert paths.project_root(deep) == real(repo)
    (outer / ".akm").unlink()
    (outer / ".akm").mkdir()
    assert paths.project_root(deep) == real(repo)  # the nearest marker wins: a far .akm/ cannot swallow repos
    (repo / ".git").unlink()
    assert paths.project_root(deep) == real(outer)
    (deep / ".akm").mkdir()
    assert paths.project_root(deep) == real(deep)


def test_project_root_defaults_to_process_cwd(tmp_path, monkeypatch):
    if not _clean_ancestors(tmp_path):
        pytest.skip("tmp dir sits inside a project")
    (tmp_path / ".git").mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert paths.project_root() == Path(os.path.realpath(tmp_path))


def test_scope_key_shape_and_symlink_stability(tmp_path):
    project = tmp_path / "proj"
    (project / ".akm").mkdir(parents=True)
    (project / "a").mkdir()
    link = tmp_path / "link"
    link.symlink_to(project, target_is_directory=True)
    key = paths.scope_key(project / "a", portable=False)
    root = os.path.realpath(project)
    assert key == "dir:v1:" + hashlib.sha256(root.encode()).hexdigest()
    assert paths.scope_key(link / "a", portable=False) == key
    other = tmp_path / "other"
    (other / ".akm").mkdir(parents=True)
    assert paths.scope_key(other, portable=False) != key


def test_paths_module_does_not_import_platformdirs_eagerly():
    import subprocess
    import sys

    code = "import sys, akm.paths; print('platformdirs' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("xdg", [None, "/tmp/xdg-data-test", "relative/ignored"])
def test_data_dir_follows_platformdirs_without_importing_it(monkeypatch, xdg):
    """The Linux shortcut must give exactly platformdirs' answer (it only saves its import)."""
    import platformdirs

    monkeypatch.delenv("AKM_DATA_DIR", raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_DATA_HOME", xdg)
    assert paths.data_dir() == Path(platformdirs.user_data_dir("akm", appauthor=False))


def test_config_dir_follows_platformdirs_without_importing_it(monkeypatch):
    """With neither AKM_CONFIG_DIR nor XDG_CONFIG_HOME set, the Linux shortcut is platformdirs' answer."""
    import platformdirs

    monkeypatch.delenv("AKM_CONFIG_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert paths.config_dir() == Path(platformdirs.user_config_dir("akm", appauthor=False))


def test_a_journal_path_that_is_a_directory_is_a_clear_error(cli, tmp_path):
    from akm import paths

    paths.journal_path().mkdir(parents=True)
    res = cli("workflow", "list", check=78)
    assert "error[JOURNAL_ERROR]" in res.stderr and str(paths.journal_path()) in res.stderr
    assert "hint: That path is a directory, not a file" in res.stderr and "AKM_DATA_DIR" in res.stderr
    assert "Traceback" not in res.stderr
