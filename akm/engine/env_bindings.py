"""Resolve a unit's `env:` references to values at dispatch time.

An env ref `env/<name>` names a dotenv file: `<project>/.akm/env/<name>.env`
first, then `<user config dir>/akm/env/<name>.env`. Only the ref NAMES are in
the plan and the input hash; the values are secrets, resolved late, handed to
the process environment and scrubbed from everything akm stores or prints.

The files are read with python-dotenv's parser, so they mean what they mean to
every other tool that reads `.env` files: `# comments` (also after an unquoted
value), `export NAME=...`, single quotes (literal), double quotes (with `\\n`,
`\\t`, `\\"`, `\\\\` escapes), values spanning lines inside quotes. Two choices
are ours: there is no `${VAR}` expansion (a value is exactly what the file says,
never something pulled from akm's own environment), and a line the parser
cannot read, or a name that is not an environment variable name, is an error
naming the file and line — a secrets file that is silently half-read would
make a unit fail far away from the cause. Such an error never quotes the line:
a malformed line is as likely a secret as anything else in the file (a
`user:password` pair, or `/etc/passwd` behind a symlinked `link.env`), and the
message goes to step notes, the journal and the terminal.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from pathlib import Path

from akm.format.grammar import ENV_REF_RE, ENV_VAR_RE

_NAME = ENV_VAR_RE  # the name rules live in akm/format/grammar.py


class EnvBindingError(ValueError):
    pass


def _candidates(ref: str, project_root: Path) -> list[Path]:
    if not ENV_REF_RE.match(ref):
        raise EnvBindingError(f'env ref "{ref}" is not of the form env/<name>')
    name = ref[len("env/") :]
    return [d / f"{name}.env" for d in env_dirs(project_root)]


def _user_env_dir() -> Path:
    """platformdirs' `user_config_dir("akm")/env` — on Linux without importing it (XDG_CONFIG_HOME, else
    ~/.config), which every run would pay for now that every run reads the visible env files."""
    import sys

    if sys.platform.startswith("linux"):
        xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
        base = Path(xdg) if xdg else Path(os.path.expanduser("~/.config"))
        return base / "akm" / "env"
    from platformdirs import user_config_dir

    return Path(user_config_dir("akm")) / "env"


def parse_dotenv(text: str, origin: str) -> dict[str, str]:
    """`NAME=value` bindings of a dotenv file (python-dotenv's rules, no interpolation).

    A bare `NAME` line (no `=`) binds nothing, as in python-dotenv.
    """
    from dotenv.parser import parse_stream  # lazy: only runs that bind env files pay for it

    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text.lstrip("\ufeff"))):
        line = binding.original.line
        if binding.error:
            raise EnvBindingError(f"{origin}:{line}: cannot read this line; expected NAME=value")
        if binding.key is None:  # blank line or comment
            continue
        if not _NAME.match(binding.key):
            what = "is not NAME=value" if binding.value is None else "does not start with an environment variable name"
            raise EnvBindingError(
                f"{origin}:{line}: this line {what} (a name is letters, digits and _, not starting with a "
                "digit); its text is not shown, as it may hold a secret"
            )
        if binding.value is None:
            continue
        values[binding.key] = binding.value
    return values


# The largest env file read (a secrets file is a few lines; `/dev/zero` linked as one must not be read whole).
MAX_ENV_FILE_BYTES = 1024 * 1024


def _not_regular(path: Path) -> str | None:
    """What `path` is when it exists but is no regular file (`a FIFO`), else None (a file, or nothing there)."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a block device"
        if stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )


def _read_env_file(path: Path) -> str:
    """The text of a regular env file, at most MAX_ENV_FILE_BYTES (opened without blocking on a FIFO)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the look and the open
            raise EnvBindingError(f"{path} is not a regular file")
        data = f.read(MAX_ENV_FILE_BYTES + 1)
    if len(data) > MAX_ENV_FILE_BYTES:
        raise EnvBindingError(f"{path} is larger than {MAX_ENV_FILE_BYTES} bytes (1 MiB), more than an env file holds")
    return data.decode("utf-8")


def resolve_env_refs(refs: list[str], project_root: Path) -> dict[str, str]:
    """Later refs override earlier keys."""
    merged: dict[str, str] = {}
    for ref in refs:
        for path in _candidates(ref, project_root):
            odd = _not_regular(path)
            if odd is not None:
                raise EnvBindingError(f'env ref "{ref}": {path} is {odd}, not a regular file; an env file must be one')
            if path.is_file():
                try:
                    merged.update(parse_dotenv(_read_env_file(path), str(path)))
                except EnvBindingError as exc:
                    raise EnvBindingError(f'env ref "{ref}": {exc}') from exc
                except (OSError, UnicodeDecodeError) as exc:
                    raise EnvBindingError(f'env ref "{ref}": cannot read {path}: {exc}') from exc
                break
        else:
            raise EnvBindingError(
                f'env ref "{ref}" not found (looked for {", ".join(str(p) for p in _candidates(ref, project_root))})'
            )
    return merged


def env_dirs(project_root: Path) -> list[Path]:
    """Where env files live for a project: its `.akm/env/`, then the user config dir's `akm/env/`."""
    return [project_root / ".akm" / "env", _user_env_dir()]


_VISIBLE: dict[tuple[str, int, int], list[str]] = {}
_VISIBLE_LOCK = threading.Lock()


def visible_secret_values(project_root: Path) -> list[str]:
    """The values of every env file akm can see for the project (`*.env` in `env_dirs`), whether or not
    the unit at hand binds it: a unit with no `env:` that prints `.akm/env/ci.env` must not journal its
    secrets raw. Unreadable lines and files bind nothing here (a unit that binds such a file fails on it
    by itself); only regular files are read. Remembered per file (path, mtime, size)."""
    values: list[str] = []
    for directory in env_dirs(project_root):
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (OSError, ValueError):
            continue
        for entry in entries:
            if not entry.name.endswith(".env"):
                continue
            try:
                st = os.stat(entry.path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENV_FILE_BYTES:
                continue
            key = (entry.path, st.st_mtime_ns, st.st_size)
            with _VISIBLE_LOCK:
                known = _VISIBLE.get(key)
            if known is None:
                known = _lenient_values(Path(entry.path))
                with _VISIBLE_LOCK:
                    if len(_VISIBLE) > 256:
                        _VISIBLE.clear()
                    _VISIBLE[key] = known
            values.extend(known)
    return values


_SPELLINGS: dict[tuple[str, ...], list[str]] = {}


def project_sensitive_values(project_root: Path) -> list[str]:
    """The redaction set (every spelling, `akm.dispatch.redact.sensitive_values_from`) of every env file
    akm can see for the project: what each unit's output, diagnostics and reports are scrubbed of."""
    from akm.dispatch.redact import sensitive_values_from

    values = tuple(visible_secret_values(project_root))
    if not values:
        return []
    with _VISIBLE_LOCK:
        known = _SPELLINGS.get(values)
    if known is None:
        known = sensitive_values_from(list(values))
        with _VISIBLE_LOCK:
            if len(_SPELLINGS) > 64:
                _SPELLINGS.clear()
            _SPELLINGS[values] = known
    return known


def _lenient_values(path: Path) -> list[str]:
    try:
        text = _read_env_file(path)
    except (OSError, UnicodeDecodeError, EnvBindingError):
        return []
    from dotenv.parser import parse_stream

    try:
        return [
            b.value
            for b in parse_stream(io.StringIO(text.lstrip("\ufeff")))
            if not b.error and b.key is not None and b.value
        ]
    except Exception:  # a parser bug must never stop a run from redacting what else it can
        return []
