"""Where akm keeps its state, and which project a command runs in.

Two questions every command asks before touching the journal:

* `data_dir()` / `journal_path()` — the one SQLite file holding every run
  (`akm-journal.sqlite3`; upstream akm's `state.db` beside it is not ours).
  `AKM_DATA_DIR` wins (tests, CI, users who want state beside a project);
  otherwise platformdirs' per-user data dir. platformdirs is imported inside
  the function because the CLI imports this module on every start.
* `project_root()` / `scope_keys()` — the *run scope*. Runs are found by
  (workflow ref, scope). The anchor is the nearest ancestor holding a `.akm/`
  directory (an explicit akm project) or a `.git` (file or directory:
  worktrees and submodules use a `.git` file), else the working directory.
  Paths are realpath'd so a symlinked checkout and its target share one scope.
  The scope is the root's absolute path (`dir:v1:`), except on a shared journal
  (PostgreSQL, `portable=True`): there a git checkout with a network remote is
  the remote plus the root's path inside the checkout (`git:v1:`), so clones of
  one repository on two machines share their runs, and the path key stays a
  second key, so runs started before are still found. On the embedded SQLite
  journal the portable key would only merge sibling clones and worktrees on
  one machine into one scope (two agents in two worktrees joining each other's
  run), so it is not used there (spec/decisions.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCOPE_PREFIX = "dir:v1:"
GIT_SCOPE_PREFIX = "git:v1:"


# Our own file name: upstream akm keeps a different database, `state.db`, in the same
# default data directory, and neither program may open the other's file.
JOURNAL_FILE_NAME = "akm-journal.sqlite3"


def data_dir() -> Path:
    """The directory holding the journal; `AKM_DATA_DIR` (trimmed, non-empty) overrides."""
    override = os.environ.get("AKM_DATA_DIR", "").strip()
    if override:
        return Path(override)
    if sys.platform.startswith("linux"):
        # platformdirs' rule on Linux (XDG base directories), without its ~10-30 ms import on every
        # `workflow list`; other systems ask platformdirs.
        xdg = os.environ.get("XDG_DATA_HOME", "").strip()
        return (Path(xdg) if xdg and os.path.isabs(xdg) else Path(os.path.expanduser("~/.local/share"))) / "akm"
    import platformdirs  # lazy: keeps CLI start-up light

    return Path(platformdirs.user_data_dir("akm", appauthor=False))


def config_dir() -> Path:
    """Where the user's `config.json` lives.

    `AKM_CONFIG_DIR` wins, then `$XDG_CONFIG_HOME/akm` (on every platform, so a
    sandboxed or test run never touches the real user config), else platformdirs'
    per-user config dir (`~/.config/akm` on Linux).
    """
    override = os.environ.get("AKM_CONFIG_DIR", "").strip()
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    if xdg:
        return Path(xdg) / "akm"
    if sys.platform.startswith("linux"):
        return Path(os.path.expanduser("~/.config")) / "akm"  # platformdirs' Linux answer, without its import
    import platformdirs  # lazy: keeps CLI start-up light

    return Path(platformdirs.user_config_dir("akm", appauthor=False))


def journal_path() -> Path:
    """The journal file: `<data_dir>/akm-journal.sqlite3`."""
    return data_dir() / JOURNAL_FILE_NAME


# The old name, kept so code written against it keeps working; new code says journal_path().
state_db_path = journal_path


def _ancestors(start: Path) -> list[Path]:
    return [start, *start.parents]


def project_root(cwd: str | os.PathLike[str] | None = None) -> Path:
    """Nearest ancestor (inclusive) holding a `.akm/` dir or a `.git`, else cwd (realpath'd).

    The nearest marker wins, so a stray `.akm/` high up (say in $HOME) cannot
    fold every repository below it into one scope.
    """
    start = Path(os.path.realpath(os.fspath(cwd) if cwd is not None else os.getcwd()))
    for candidate in _ancestors(start):
        if (candidate / ".akm").is_dir() or os.path.lexists(candidate / ".git"):
            return candidate
    return start


def _normalize(path: Path) -> str:
    text = str(path)
    if os.sep == "\\":  # Windows: one spelling per directory
        text = text.replace("\\", "/").lower()
    return text


def path_key(root: Path) -> str:
    """`"dir:v1:" + sha256(root)` of a project root: the scope on one machine, a legacy key on a shared journal."""
    # surrogateescape: a directory name that is not UTF-8 hashes as its bytes on disk
    # (for every UTF-8 name this is exactly its UTF-8 encoding).
    from akm.canonical import _sha256

    return SCOPE_PREFIX + _sha256(_normalize(root).encode("utf-8", "surrogateescape")).hexdigest()


def _git_top(root: Path) -> Path | None:
    """The checkout holding `root`: the nearest ancestor (inclusive) with a `.git`."""
    for candidate in _ancestors(root):
        if os.path.lexists(candidate / ".git"):
            return candidate
    return None


def project_commit(root: Path) -> str | None:
    """The commit the checkout holding `root` has checked out (read from `.git`, akm.gitremote.head_commit), or
    None outside a git checkout or when it cannot be read: what a run's workers must have checked out too."""
    from akm import gitremote

    top = _git_top(root)
    return gitremote.head_commit(top) if top is not None else None


def project_identity(cwd: str | os.PathLike[str] | None = None) -> tuple[str, str] | None:
    """(normalized git remote, project root's path inside the checkout) of `cwd`'s project, or None.

    The remote is `host/owner/repo` without credentials (akm.gitremote), so it may be shown; the path is
    POSIX-style, `""` for the checkout's top.
    """
    return _identity(project_root(cwd))


def _identity(root: Path) -> tuple[str, str] | None:
    from akm import gitremote

    top = _git_top(root)
    if top is None:
        return None
    url = gitremote.remote_url(top)
    remote = gitremote.normalize_remote(url) if url is not None else None
    if remote is None:
        return None
    inside = root.relative_to(top).as_posix()
    if os.sep == "\\":
        inside = inside.lower()
    return remote, "" if inside == "." else inside


def scope_keys(cwd: str | os.PathLike[str] | None = None, *, portable: bool) -> tuple[str, ...]:
    """Every key `cwd`'s runs may be stored under, the one new runs get first.

    `portable` is whether the journal is shared by many machines (`Journal.shared`). Not portable (the
    SQLite journal): only `"dir:v1:" + sha256(absolute root)`. Portable: a project in a git checkout with a
    network remote is `"git:v1:" + sha256(remote "\\n" path-in-repo)`, the same on every machine, with the
    path key second (runs started before akm knew the remote, or before the remote was added); any other
    project has the path key only. The caller says which: a hidden default would pick the scope of runs.
    """
    root = project_root(cwd)
    legacy = path_key(root)
    ident = _identity(root) if portable else None
    if ident is None:
        return (legacy,)
    from akm.canonical import _sha256

    remote, inside = ident
    return (GIT_SCOPE_PREFIX + _sha256(f"{remote}\n{inside}".encode("utf-8", "surrogateescape")).hexdigest(), legacy)


def scope_key(cwd: str | os.PathLike[str] | None = None, *, portable: bool) -> str:
    """The run scope new runs of `cwd` get: the first of `scope_keys(cwd, portable=...)`."""
    return scope_keys(cwd, portable=portable)[0]
