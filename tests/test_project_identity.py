"""The run scope (akm/paths.py, akm/gitremote.py; issue 18, postgres.md §2.12) on real git checkouts.

The portable key (git remote + path in repo) is derived here with `portable=True`; it is used only on a
shared (PostgreSQL) journal. On the embedded SQLite journal every checkout is its own scope (its path key),
so two worktrees of one repository never join each other's run.

Every repository here is made by `git init` / `git remote add` / `git clone` / `git worktree add` in a temp
dir, so the config files read are the ones git itself writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from akm import gitremote, paths


def _git_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(tmp_path / "git-home"), GIT_CONFIG_NOSYSTEM="1")
    return env


@pytest.fixture
def git(tmp_path):
    """`git(cwd, *args)`: run real git with no user or system config in the way."""
    (tmp_path / "git-home").mkdir(exist_ok=True)
    env = _git_env(tmp_path)

    def call(cwd: Path, *args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    return call


def _repo(git, where: Path, *remotes: tuple[str, str]) -> Path:
    where.mkdir(parents=True)
    git(where, "init", "-q")
    for name, url in remotes:
        git(where, "remote", "add", name, url)
    return where


def _path_key(root: Path) -> str:
    return "dir:v1:" + hashlib.sha256(os.path.realpath(root).encode()).hexdigest()


@pytest.fixture(autouse=True)
def _outside_any_checkout(tmp_path):
    if any((a / ".akm").is_dir() or os.path.lexists(a / ".git") for a in [tmp_path, *tmp_path.parents]):
        pytest.skip("tmp dir sits inside a project")


# ------------------------------------------------------------------ normalizing a remote


@pytest.mark.parametrize(
    "url",
    [
        "git@github.com:Owner/Repo.git",
        "git@GitHub.com:Owner/Repo",
        "https://github.com/Owner/Repo",
        "https://github.com/Owner/Repo.git/",
        "https://alice:ghp_s3cret@github.com/Owner/Repo.git",
        "ssh://git@github.com/Owner/Repo.git",
        "ssh://git@github.com:22/Owner/Repo",
        "git+ssh://git@github.com/Owner/Repo",
        "http://github.com//Owner/Repo?token=abc#frag",
        "  https://github.com/Owner/Repo  ",
    ],
)
def test_one_remote_has_one_normal_form(url):
    assert gitremote.normalize_remote(url) == "github.com/Owner/Repo"


@pytest.mark.parametrize(
    "url",
    [
        "/srv/git/repo.git",
        "../sibling",
        "./here",
        "~/repos/x",
        "file:///srv/git/repo.git",
        r"C:\repos\x",
        "C:/repos/x",
        "https://host",
        "https://user:pa/ss@host/owner/repo",  # an unencoded `/` in a password: refused, never half-parsed
        "",
        "nonsense",
    ],
)
def test_local_or_unreadable_remotes_have_no_normal_form(url):
    assert gitremote.normalize_remote(url) is None


# ------------------------------------------------------------------ the scope of real checkouts


def test_two_clones_with_one_remote_share_a_scope(tmp_path, git):
    a = _repo(git, tmp_path / "alice" / "p", ("origin", "git@github.com:team/proj.git"))
    b = _repo(git, tmp_path / "bob" / "work" / "proj", ("origin", "https://bob:tok@github.com/team/proj"))
    (a / "src").mkdir()
    key_a, key_b = paths.scope_keys(a / "src", portable=True), paths.scope_keys(b, portable=True)
    assert key_a[0] == key_b[0]
    assert key_a[0].startswith("git:v1:") and len(key_a[0]) == len("git:v1:") + 64
    assert key_a[0] == "git:v1:" + hashlib.sha256(b"github.com/team/proj\n").hexdigest()
    assert key_a[1:] == (_path_key(a),) and key_b[1:] == (_path_key(b),)  # each keeps its own legacy key
    assert paths.scope_key(a, portable=True) == key_a[0]


def test_different_remotes_differ_and_origin_wins(tmp_path, git):
    a = _repo(git, tmp_path / "a", ("origin", "https://github.com/team/one"))
    b = _repo(git, tmp_path / "b", ("origin", "https://github.com/team/two"))
    assert paths.scope_key(a, portable=True) != paths.scope_key(b, portable=True)
    # origin is preferred over remotes sorting before it; without origin the first in sorted order counts
    c = _repo(git, tmp_path / "c", ("aaa", "https://github.com/team/two"), ("origin", "https://github.com/team/one"))
    assert paths.scope_key(c, portable=True) == paths.scope_key(a, portable=True)
    d = _repo(git, tmp_path / "d", ("zeta", "https://github.com/team/one"), ("beta", "https://github.com/team/two"))
    assert paths.scope_key(d, portable=True) == paths.scope_key(b, portable=True)


def test_no_git_or_no_remote_or_a_local_remote_is_the_path_key(tmp_path, git):
    plain = tmp_path / "plain"
    (plain / ".akm").mkdir(parents=True)
    assert paths.scope_keys(plain, portable=True) == (_path_key(plain),)
    bare = _repo(git, tmp_path / "bare")
    assert paths.scope_keys(bare, portable=True) == (_path_key(bare),)
    local = _repo(git, tmp_path / "local", ("origin", str(tmp_path / "upstream.git")))
    assert paths.scope_keys(local, portable=True) == (_path_key(local),)
    assert paths.project_identity(local) is None


def test_a_nested_akm_root_is_its_path_inside_the_repo(tmp_path, git):
    a = _repo(git, tmp_path / "a", ("origin", "https://github.com/team/mono"))
    b = _repo(git, tmp_path / "b", ("origin", "git@github.com:team/mono.git"))
    for repo in (a, b):
        (repo / "services" / "api" / ".akm").mkdir(parents=True)
        (repo / "services" / "api" / "deep").mkdir()
    assert paths.project_identity(a / "services" / "api" / "deep") == ("github.com/team/mono", "services/api")
    nested = paths.scope_key(a / "services" / "api" / "deep", portable=True)
    assert nested == paths.scope_key(b / "services" / "api", portable=True)
    assert nested != paths.scope_key(a, portable=True)  # the repo's top is another project
    assert nested == "git:v1:" + hashlib.sha256(b"github.com/team/mono\nservices/api").hexdigest()


def test_a_worktree_reads_the_remote_of_its_repository(tmp_path, git):
    main = _repo(git, tmp_path / "main", ("origin", "https://github.com/team/proj.git"))
    git(main, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "one")
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "feature")
    assert (tmp_path / "wt" / ".git").is_file()  # a `gitdir:` file leading to main/.git/worktrees/wt
    assert paths.scope_keys(tmp_path / "wt", portable=True)[0] == paths.scope_key(main, portable=True)
    assert paths.scope_keys(tmp_path / "wt", portable=True)[1] == _path_key(tmp_path / "wt")
    # a clone made by git itself (a real `origin` written by clone) lands on the same scope
    git(tmp_path, "clone", "-q", str(main), "cloned")
    git(tmp_path / "cloned", "remote", "set-url", "origin", "ssh://git@github.com/team/proj")
    assert paths.scope_key(tmp_path / "cloned", portable=True) == paths.scope_key(main, portable=True)


def test_a_submodule_has_its_own_remote(tmp_path, git):
    lib = _repo(git, tmp_path / "lib-src")
    git(lib, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "one")
    app = _repo(git, tmp_path / "app", ("origin", "https://github.com/team/app"))
    git(app, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    sub = app / "vendor" / "lib"
    assert (sub / ".git").is_file()  # gitdir: ../../.git/modules/vendor/lib, no commondir
    assert paths.scope_keys(sub, portable=True) == (_path_key(sub),)  # cloned from a local path: not portable
    git(sub, "remote", "set-url", "origin", "git@github.com:team/lib.git")
    assert paths.project_identity(sub) == ("github.com/team/lib", "")
    assert paths.scope_key(sub, portable=True) != paths.scope_key(app, portable=True)


def test_config_syntax_forms(tmp_path, git):
    repo = _repo(git, tmp_path / "r")
    config = repo / ".git" / "config"
    base = config.read_text()
    want = paths.scope_key(_repo(git, tmp_path / "ref", ("origin", "https://github.com/team/proj")), portable=True)

    def key_with(extra: str) -> str:
        config.write_text(base + extra)
        got = gitremote.remote_url(repo)
        if got is not None:  # what we read is what git itself reads
            assert got == git(repo, "config", "--get", "remote.origin.url").strip()
        return paths.scope_key(repo, portable=True)

    assert key_with('[remote "origin"]\n\turl = "https://github.com/team/proj" ; a comment\n') == want
    assert key_with('[Remote "origin"]\n  URL=https://github.com/team/proj.git # c\n') == want
    assert key_with("[remote.origin]\nurl = https://github.com/team/proj\n") == want
    assert key_with('[remote "origin"] url = https://github.com/\\\nteam/proj\n') == want
    inc = tmp_path / "included.cfg"
    inc.write_text('[remote "origin"]\n\turl = git@github.com:team/proj.git\n')
    assert key_with(f"[include]\n\tpath = {inc}\n") == want
    assert key_with("[include]\n\tpath = ../../included.cfg\n") == want  # relative to the including file
    # the last url of a remote counts, as in git
    assert key_with('[remote "origin"]\nurl = https://x.org/a/b\nurl = https://github.com/team/proj\n') == want
    # anything odd: the path key, never a guess
    path_only = _path_key(repo)
    assert key_with('[remote "origin"\nurl = https://github.com/team/proj\n') == path_only
    assert key_with('[remote "origin"]\nurl = "https://github.com/team/proj\n') == path_only
    config.write_bytes(base.encode() + b'[remote "origin"]\nurl = https://github.com/\xff/p\n')
    assert paths.scope_key(repo, portable=True) == path_only
    config.unlink()
    assert paths.scope_key(repo, portable=True) == path_only
    (repo / ".git").rename(tmp_path / "moved")
    (repo / ".git").write_text("not a gitdir line\n")
    assert paths.scope_key(repo, portable=True) == path_only


# ------------------------------------------------------------------ through the api and the journal

ONE = """\
---
steps:
  - id: a
    unit: { exec: { command: [python3, -c, "print(1)"] } }
    output: { type: integer }
  - id: b
    unit: { exec: { command: [python3, -c, "print(2)"] } }
    output: { type: integer }
---
## a
a
## b
b
"""


def test_credentials_never_reach_the_journal_or_output(tmp_path, git, project, cli, monkeypatch):
    monkeypatch.delenv("AKM_JOURNAL_URL", raising=False)  # the SQLite file is read below
    secret = "ghp_Sup3rS3cretT0ken"
    git(project, "init", "-q")
    git(project, "remote", "add", "origin", f"https://alice:{secret}@github.com/team/proj.git")
    (project / "one.md").write_text(ONE)
    ident = paths.project_identity(project)
    assert ident == ("github.com/team/proj", "") and secret not in repr(ident)
    out = cli("workflow", "run", "one.md", "--format", "json", check=0)
    listed = cli("workflow", "list", "--format", "json", check=0)
    for text in (out.stdout, out.stderr, listed.stdout, listed.stderr):
        assert secret not in text and "alice" not in text
    journal = paths.journal_path()
    blobs = [journal.read_bytes()] + [p.read_bytes() for p in journal.parent.glob("*-wal")]
    assert not any(secret.encode() in b or b"alice" in b for b in blobs)
    assert b"dir:v1:" in b"".join(blobs) and b"git:v1:" not in b"".join(blobs)  # SQLite: the path key only
    assert b"github.com" not in b"".join(blobs)


@pytest.fixture
def shared_journal(pg_cluster, monkeypatch):
    """The in-process `cli` pointed at a fresh PostgreSQL schema: a shared journal."""
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        monkeypatch.setenv("AKM_JOURNAL_URL", url)
        yield url


def _two_checkouts(tmp_path: Path, git, project: Path, kind: str) -> tuple[Path, Path]:
    """`project` (a repository with a network remote and `.akm/workflows/one.md`) and a second checkout of
    it at another path: a `git worktree` of it, or a clone with the same remote."""
    git(project, "init", "-q")
    git(project, "remote", "add", "origin", "git@github.com:team/proj.git")
    (project / ".akm" / "workflows").mkdir(parents=True)
    (project / ".akm" / "workflows" / "one.md").write_text(ONE)
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "one")
    other = tmp_path / "elsewhere" / "proj"
    other.parent.mkdir()
    if kind == "worktree":
        git(project, "worktree", "add", "-q", str(other), "-b", "feature")
    else:
        git(other.parent, "clone", "-q", str(project), "proj")
        git(other, "remote", "set-url", "origin", "https://github.com/team/proj")
    assert paths.scope_key(project, portable=True) == paths.scope_key(other, portable=True)  # one repository
    return project, other


@pytest.mark.parametrize("kind", ["worktree", "clone"])
def test_on_sqlite_two_checkouts_of_one_repository_are_two_scopes(tmp_path, git, project, cli, monkeypatch, kind):
    """Two agents in two worktrees running `workflows/one` with the same params: two runs, each listed only
    in its own checkout (joining would run one agent's exec units in the other's directory)."""
    monkeypatch.delenv("AKM_JOURNAL_URL", raising=False)
    here, there = _two_checkouts(tmp_path, git, project, kind)
    first = cli.json("workflow", "run", "workflows/one", "--max-steps", "1", check=4)["run"]["runId"]
    monkeypatch.chdir(there)
    assert cli.json("workflow", "list")["runs"] == []
    assert cli.json("workflow", "list", "--active")["runs"] == []
    second = cli.json("workflow", "run", "workflows/one", "--max-steps", "1", check=4)["run"]["runId"]
    assert second != first  # an identical start in the other checkout does not join
    assert [r["runId"] for r in cli.json("workflow", "list")["runs"]] == [second]
    monkeypatch.chdir(here)
    assert [r["runId"] for r in cli.json("workflow", "list")["runs"]] == [first]
    from akm.store import open_db
    from akm.store import runs as runs_store

    with open_db(paths.journal_path()) as db:
        assert runs_store.get_run(db, first).scope_key == _path_key(here)
        assert runs_store.get_run(db, second).scope_key == _path_key(there)


@pytest.mark.parametrize("kind", ["worktree", "clone"])
def test_on_a_shared_journal_two_checkouts_of_one_repository_are_one_scope(
    tmp_path, git, project, cli, monkeypatch, shared_journal, kind
):
    secret = "ghp_Sup3rS3cretT0ken"
    here, there = _two_checkouts(tmp_path, git, project, kind)
    git(here, "remote", "set-url", "origin", f"https://alice:{secret}@github.com/team/proj.git")
    first = cli("workflow", "run", "workflows/one", "--max-steps", "1", "--format", "json", check=4)
    run_id = json.loads(first.stdout)["run"]["runId"]
    monkeypatch.chdir(there)
    listed = cli("workflow", "list", "--format", "json", check=0)
    assert [r["runId"] for r in json.loads(listed.stdout)["runs"]] == [run_id]
    again = cli.json("workflow", "run", "workflows/one", check=None)["run"]  # an identical start joins
    assert again["runId"] == run_id and again["status"] == "completed"
    for text in (first.stdout, first.stderr, listed.stdout, listed.stderr):
        assert secret not in text and "alice" not in text
    from akm.store import open_journal
    from akm.store import runs as runs_store

    with open_journal(shared_journal) as db:
        assert db.shared
        assert runs_store.get_run(db, run_id).scope_key == paths.scope_key(here, portable=True)
        assert runs_store.get_run(db, run_id).scope_key.startswith("git:v1:")


def test_runs_started_under_the_path_key_are_still_found(tmp_path, git, project, cli, shared_journal):
    """On a shared journal: a run started before the project had a remote (under its path key)."""
    git(project, "init", "-q")
    (project / "one.md").write_text(ONE)
    first = cli.json("workflow", "run", "one.md", "--max-steps", "1", check=4)
    run_id = first["run"]["runId"]
    git(project, "remote", "add", "origin", "git@github.com:team/proj.git")  # now the project has a portable key
    assert paths.scope_key(project, portable=True).startswith("git:v1:")
    listed = cli.json("workflow", "list")
    assert [r["runId"] for r in listed["runs"]] == [run_id]
    assert [r["runId"] for r in cli.json("workflow", "list", "--active")["runs"]] == [run_id]
    again = cli.json("workflow", "run", "one.md")  # continues the legacy run rather than starting a twin
    assert again["run"]["runId"] == run_id and again["run"]["status"] == "completed"
    fresh = cli.json("workflow", "run", "one.md", "--new")["run"]["runId"]
    assert fresh != run_id
    both = [r["runId"] for r in cli.json("workflow", "list")["runs"]]
    assert both == [fresh, run_id]  # newest first across both keys


def test_a_report_from_another_clone_finds_the_runs_project(tmp_path, git):
    """`_run_project_root` accepts any of the reporter's keys (the portable one matches across clones)."""
    from types import SimpleNamespace

    from akm.api._session import _run_project_root

    a = _repo(git, tmp_path / "a", ("origin", "https://github.com/team/proj"))
    b = _repo(git, tmp_path / "b", ("origin", "git@github.com:team/proj"))
    real = lambda p: Path(os.path.realpath(p))  # noqa: E731
    run = SimpleNamespace(scope_key=paths.scope_key(a, portable=True), workflow_path=str(a / "w.md"))
    assert _run_project_root(run, a, portable=True) == real(a)
    assert _run_project_root(run, b, portable=True) == real(a)  # the run's own checkout is here: it wins over a twin
    elsewhere = SimpleNamespace(scope_key=paths.scope_key(a, portable=True), workflow_path="/nonexistent/m-1/w.md")
    assert _run_project_root(elsewhere, b, portable=True) == real(b)  # started on another machine: this clone
    legacy = SimpleNamespace(scope_key=_path_key(a), workflow_path=str(a / "w.md"))
    assert _run_project_root(legacy, a, portable=True) == real(a)
    assert _run_project_root(legacy, b, portable=True) == real(a)
    # not portable (SQLite): the path key alone decides; a run of another clone is found by its workflow file
    assert _run_project_root(legacy, a, portable=False) == real(a)
    assert _run_project_root(legacy, b, portable=False) == real(a)
    assert _run_project_root(elsewhere, b, portable=False) == real(b)


def test_the_scope_is_read_without_spawning_git(tmp_path, git, monkeypatch):
    a = _repo(git, tmp_path / "a", ("origin", "https://github.com/team/proj"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no git on PATH at all
    assert paths.scope_key(a, portable=True).startswith("git:v1:")


def test_not_portable_is_the_path_key_only(tmp_path, git):
    a = _repo(git, tmp_path / "a", ("origin", "https://github.com/team/proj"))
    b = _repo(git, tmp_path / "b", ("origin", "https://github.com/team/proj"))
    assert paths.scope_keys(a, portable=False) == (_path_key(a),)
    assert paths.scope_key(a, portable=False) != paths.scope_key(b, portable=False)
