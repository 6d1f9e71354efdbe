"""`isolation: worktree`: one fresh detached git worktree per journaled attempt.

A clean tree is removed after the attempt; a dirty one (tracked changes or
untracked, unignored files) is kept and its path reported, because it may hold
the only copy of work a unit did. Git operations on one repository are
serialised in-process: concurrent `git worktree add` calls race on the
repository's admin files.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

from akm.record import dataclass

GIT_TIMEOUT_S = 30
_repo_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class WorktreeError(RuntimeError):
    pass


def _lock_for(repo: str) -> threading.Lock:
    with _locks_guard:
        return _repo_locks.setdefault(os.path.realpath(repo), threading.Lock())


def _git(args: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", cwd, *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorktreeError(f"git {' '.join(args)} failed: {exc}") from exc


def worktree_root() -> Path:
    import tempfile  # worktree units only: most runs never import it

    return Path(tempfile.gettempdir()) / "akm-worktrees"


def sanitize(attempt_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", attempt_id)


def preflight(base: str) -> str | None:
    """None when `base` is inside a git work tree, else the reason it is not."""
    try:
        proc = _git(["rev-parse", "--is-inside-work-tree"], base)
    except WorktreeError as exc:
        return str(exc)
    if proc.returncode != 0 or proc.stdout.strip() != "true":
        return proc.stderr.strip() or proc.stdout.strip() or "not a git work tree"
    return None


def is_clean(path: str) -> bool | None:
    """True clean, False dirty, None when the probe itself failed."""
    try:
        proc = _git(["status", "--porcelain"], path)
    except WorktreeError:
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() == ""


@dataclass
class Worktree:
    path: str
    base: str
    preserved_leftover: str | None = None


def _retain_name(dest: Path) -> Path:
    stem = f"{dest}.retained-{int(time.time() * 1000)}"
    candidate, n = Path(stem), 0
    while candidate.exists():
        n += 1
        candidate = Path(f"{stem}-{n}")
    return candidate


def create(base: str, run_id: str, attempt_id: str) -> Worktree:
    dest = worktree_root() / sanitize(run_id) / sanitize(attempt_id)
    preserved = None
    with _lock_for(base):
        if dest.exists():
            if is_clean(str(dest)) is True:
                import shutil

                shutil.rmtree(dest, ignore_errors=True)
            else:
                target = _retain_name(dest)
                dest.rename(target)
                preserved = str(target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git(["worktree", "prune"], base)
        proc = _git(["worktree", "add", "--detach", str(dest)], base)
        if proc.returncode != 0:
            raise WorktreeError(proc.stderr.strip() or f"git worktree add exited {proc.returncode}")
    return Worktree(path=str(dest), base=base, preserved_leftover=preserved)


def cleanup(tree: Worktree) -> str | None:
    """Remove a clean worktree; return a warning when it had to be retained."""
    state = is_clean(tree.path)
    if state is None:
        return f"could not check worktree {tree.path}; it was retained"
    if state is False:
        return f"worktree {tree.path} left uncommitted changes and was retained"
    with _lock_for(tree.base):
        proc = _git(["worktree", "remove", tree.path], tree.base)
    if proc.returncode != 0:
        return f"could not remove worktree {tree.path}: {proc.stderr.strip()}"
    try:
        Path(tree.path).parent.rmdir()
    except OSError:
        pass
    return None
