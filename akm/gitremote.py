"""A project's portable identity: its git remote, read from `.git/config` without running git.

Why: the run scope used to be the project root's absolute path, which differs between two machines holding
the same repository, so a shared journal showed each developer only their own
runs. The remote URL is what two clones have in common. It is read from the config file directly because
`git` costs tens of milliseconds to start and every `workflow list` needs the scope.

Only the common shapes of git's config syntax are understood: sections (`[remote "origin"]`), `key = value`
with quotes, escapes, comments and continuation lines, and `[include] path = …`. Anything this module cannot
read with confidence (an unreadable file, a remote that is a local path, a URL with no host) yields None, and
the caller falls back to the path scope: a wrong answer would merge unrelated projects, a missing one only
keeps today's per-machine scope.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]')
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?$")
_SCHEME_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)([^?#]*)")
_SCP = re.compile(r"^(?:[^@/:]+@)?([^/:]+):(.+)$")
_NETWORK_SCHEMES = {"https", "http", "ssh", "git", "git+ssh", "ssh+git", "ftp", "ftps"}
_MAX_INCLUDE_DEPTH = 4  # git's own limit is 10; a deeper chain is odd enough to give up on
_MAX_CONFIG_BYTES = 1 << 20
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", '"': '"', "\\": "\\"}


class _Odd(Exception):
    """The config holds something this reader does not understand: give up, use the path scope."""


def _value(raw: str) -> str:
    """A config value: quotes removed, escapes applied, an unquoted comment cut off, outer blanks trimmed."""
    out: list[str] = []
    quoted = False
    pending_space = ""
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == '"':
            quoted = not quoted
        elif c == "\\":
            i += 1
            if i >= len(raw):
                raise _Odd("dangling backslash")
            escaped = _ESCAPES.get(raw[i])
            if escaped is None:
                raise _Odd("unknown escape")
            out.append(pending_space + escaped)
            pending_space = ""
        elif c in "#;" and not quoted:
            break
        elif c.isspace() and not quoted:
            pending_space += c if out else ""
        else:
            out.append(pending_space + c)
            pending_space = ""
        i += 1
    if quoted:
        raise _Odd("unterminated quote")
    return "".join(out)


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined where one ends in an unescaped backslash (git's continuation)."""
    lines: list[str] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.rstrip("\r")
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2 == 1:
            buf += stripped[:-1]
            continue
        lines.append(buf + stripped)
        buf = ""
    if buf:
        lines.append(buf)
    return lines


def _read_config(path: Path, into: dict[tuple[str, str, str], list[str]], depth: int = 0) -> None:
    """Add `(section, subsection, key) -> values` of one config file (and the files it includes)."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise _Odd("include chain too deep")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
    except OSError:
        if depth:  # git ignores a missing include
            return
        raise _Odd("unreadable config") from None
    if len(data) > _MAX_CONFIG_BYTES:
        raise _Odd("config too large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Odd("config not UTF-8") from None
    section, sub = "", ""
    for line in _logical_lines(text):
        line = line.strip()
        while line.startswith("["):
            m = _SECTION.match(line)
            if m is None:
                raise _Odd("unreadable section header")
            name, quoted_sub = m.group(1), m.group(2)
            if quoted_sub is None and "." in name:  # the old `[remote.origin]` spelling
                name, _, dotted = name.partition(".")
                section, sub = name.lower(), dotted.lower()
            else:
                section = name.lower()
                sub = re.sub(r"\\(.)", r"\1", quoted_sub) if quoted_sub is not None else ""
            line = line[m.end() :].strip()  # a `key = value` may follow the header on one line
        if not line or line[0] in "#;":
            continue
        km = _KEY.match(line)
        if km is None:
            raise _Odd("unreadable line")
        key = km.group(1).lower()
        value = _value(km.group(2)) if km.group(2) is not None else "true"
        if section == "include" and not sub and key == "path":
            _read_config(_include_path(value, path), into, depth + 1)
            continue
        into.setdefault((section, sub, key), []).append(value)


def _include_path(value: str, config: Path) -> Path:
    if value.startswith("~/"):
        return Path(os.path.expanduser(value))
    p = Path(value)
    return p if p.is_absolute() else config.parent / p


def git_common_dir(top: Path) -> Path | None:
    """The directory holding the repository's shared `config` for a checkout whose `.git` sits in `top`.

    `.git` is a directory in a plain clone; a file `gitdir: …` in a worktree or submodule. A worktree's
    gitdir (`<common>/worktrees/<name>`) holds a `commondir` file leading to the shared directory.
    """
    gitdir = _git_dir(top)
    if gitdir is None or gitdir == top / ".git":
        return gitdir
    try:
        common = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return gitdir if gitdir.is_dir() else None  # a submodule: its gitdir is the repository
    except (OSError, UnicodeDecodeError):
        return None
    common_dir = Path(common)
    return common_dir if common_dir.is_absolute() else gitdir / common_dir


def remote_url(top: Path) -> str | None:
    """The URL of `origin`, else of the first remote in sorted order, as written in the config; or None."""
    common = git_common_dir(top)
    if common is None:
        return None
    config: dict[tuple[str, str, str], list[str]] = {}
    try:
        _read_config(common / "config", config)
    except (_Odd, RecursionError):
        return None
    urls = {sub: values[-1] for (section, sub, key), values in config.items() if section == "remote" and key == "url"}
    if not urls:
        return None
    return urls["origin"] if "origin" in urls else urls[sorted(urls)[0]]


def normalize_remote(url: str) -> str | None:
    """`host/owner/repo` for a network remote URL (no userinfo, port, query, `.git` or trailing slash); or None.

    `git@host:owner/repo.git`, `ssh://git@host:22/owner/repo` and `https://user:token@Host/owner/repo/` are
    one remote. A local path or `file://` remote is None: it names a directory of one machine.
    """
    url = url.strip()
    m = _SCHEME_URL.match(url)
    if m is not None:
        scheme, authority, path = m.group(1).lower(), m.group(2), m.group(3)
        if scheme not in _NETWORK_SCHEMES:
            return None
        host = authority.rpartition("@")[2]
        if host.startswith("["):  # an IPv6 literal keeps its brackets, loses its port
            host = host[: host.find("]") + 1] if "]" in host else ""
        else:
            host = host.partition(":")[0]
    else:
        if "://" in url or url.startswith(("/", ".", "~")):
            return None
        scp = _SCP.match(url)
        if scp is None:
            return None
        host, path = scp.group(1), scp.group(2)
        if len(host) == 1:  # `C:\dir` or `C:/dir` is a Windows path, not a host
            return None
    host = host.lower().rstrip(".")
    if not host or any(c.isspace() for c in host):
        return None
    if "@" in path:  # an unencoded `/` in a password ends the authority early: never let a secret through
        return None
    parts = [p for p in path.replace("\\", "/").split("/") if p and p != "."]
    if parts and parts[-1].endswith(".git"):
        parts[-1] = parts[-1][: -len(".git")]
    parts = [p for p in parts if p]
    if not parts or ".." in parts:
        return None
    return "/".join([host, *parts])


def _git_dir(top: Path) -> Path | None:
    """The checkout's own git directory (its HEAD lives there): `.git`, or where a `.git` file points."""
    dot_git = top / ".git"
    if dot_git.is_dir():
        return dot_git
    try:
        head = dot_git.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not head.startswith("gitdir:"):
        return None
    gitdir = Path(head[len("gitdir:") :].strip())
    return gitdir if gitdir.is_absolute() else top / gitdir


def head_commit(top: Path) -> str | None:
    """The commit the checkout at `top` has checked out (40 hex digits), read from the files; None if unknown.

    Follows `HEAD` → `ref: refs/heads/…` → the loose ref in the shared directory, else `packed-refs`. Why not
    `git rev-parse`: a worker checks this before every claim of a new run, and spawning git costs more than
    reading two files; anything unusual (a symbolic ref chain, reftable) answers None, which a caller
    treats as "cannot tell".
    """
    gitdir = _git_dir(top)
    common = git_common_dir(top)
    if gitdir is None or common is None:
        return None
    try:
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not head.startswith("ref:"):
        return head.lower() if _is_sha(head) else None
    ref = head[len("ref:") :].strip()
    for base in (gitdir, common):
        try:
            value = (base / ref).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        return value.lower() if _is_sha(value) else None
    try:
        packed = (common / "packed-refs").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name.strip() == ref and _is_sha(sha):
            return sha.lower()
    return None


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdefABCDEF" for c in text)
