"""Config files on disk: reading (JSON with comments), the write lock, backups, the private atomic write.

Why apart from loading: these are the parts that touch the file system and must be right under
concurrency (two `akm config set` at once, a crash mid-write). `write_locked` is the one writer: an
exclusive lock, re-read inside it, mutate, let the caller validate, back the old file up, then an atomic
replace with mode 0600. What "valid" means (both layers merged) is the caller's: `akm.config`.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from akm.errors import ConfigError

CONFIG_FILE_NAME = "config.json"
MAX_CONFIG_BYTES = 1024 * 1024
BACKUPS_KEPT = 5
LOCK_TIMEOUT_S = 5.0


def strip_jsonc(text: str) -> str:
    """Remove `//` and `/* */` comments outside string literals (escape-aware).

    Newlines inside comments are kept so JSON error positions still point at the
    right line. Trailing commas stay an error (the JSON parser reports them).
    """
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            out.append(ch)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            chunk = text[i:] if end == -1 else text[i : end + 2]
            out.append("\n" * chunk.count("\n"))
            i = n if end == -1 else end + 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def read_config_file(path: Path) -> dict[str, Any] | None:
    """The file's JSON object (comments stripped), or None when there is no file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        from akm.codes import Code

        raise ConfigError(
            f"Config file {path} is a directory.", code=Code.INVALID_CONFIG_FILE, details={"file": str(path)}
        ) from None
    except OSError as exc:
        from akm.codes import Code

        raise ConfigError(
            f"Cannot read config file {path}: {exc.strerror}.",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": str(path)},
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        from akm.codes import Code

        raise ConfigError(
            f"Config file {path} is larger than {MAX_CONFIG_BYTES} bytes.",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": str(path)},
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from akm.codes import Code

        raise ConfigError(
            f"Config file {path} is not UTF-8 text (byte {exc.start}).",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": str(path)},
        ) from None
    if not text.strip():
        return {}
    try:
        data = json.loads(strip_jsonc(text))
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        from akm.codes import Code

        raise ConfigError(
            f"Config file {path}{f' line {line}' if line else ''} is not valid JSON: {getattr(exc, 'msg', str(exc))}.",
            code=Code.INVALID_CONFIG_FILE,
            hint="Comments (// and /* */) are allowed; trailing commas are not.",
            details={"file": str(path), "line": line},
        ) from None
    if not isinstance(data, dict):
        from akm.codes import Code

        raise ConfigError(
            f"Config file {path} must hold a JSON object at the top, not {type(data).__name__}.",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": str(path)},
        )
    return data


# --------------------------------------------------------------------------- writing


class _FileLock:
    """An exclusive advisory lock on `<file>.lock` (released by the OS if we die)."""

    def __init__(self, path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.fd: int | None = None

    def __enter__(self) -> "_FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                _lock_fd(self.fd)
                return self
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    from akm.codes import Code

                    raise ConfigError(
                        f"Could not lock {self.path} within {self.timeout_s:.0f} s: another process may be "
                        "updating the config.",
                        code=Code.CONFIG_LOCKED,
                        details={"file": str(self.path)},
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            try:
                _unlock_fd(self.fd)
            finally:
                os.close(self.fd)
                self.fd = None


def _lock_fd(fd: int) -> None:
    if sys.platform == "win32":  # no fcntl there
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlock_fd(fd: int) -> None:
    if sys.platform == "win32":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)


def _backup(path: Path) -> None:
    """Copy the current file into `<dir>/config-backups/` (0700/0600), keeping the newest few."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    folder = path.parent / "config-backups"
    folder.mkdir(mode=0o700, exist_ok=True)
    now_ns = time.time_ns()  # one reading: a second and nanoseconds read apart can sort out of order
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime(now_ns // 1_000_000_000)) + f"-{now_ns % 1_000_000_000:09d}"
    stem = path.stem if path.name == CONFIG_FILE_NAME else path.name.replace(".", "-")
    target = folder / f"{stem}-{stamp}.json"
    _write_private(target, data)
    backups = sorted(folder.glob(f"{stem}-*.json"))
    for old in backups[:-BACKUPS_KEPT]:
        try:
            old.unlink()
        except OSError:
            pass


def _write_private(path: Path, data: bytes) -> None:
    """Atomic write with mode 0600: temp file in the same dir, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def render_config(data: Mapping[str, Any]) -> str:
    """The on-disk form: 2-space JSON, non-ASCII kept, trailing newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_locked(
    target: Path,
    other: Path,
    mutate: Callable[[dict[str, Any]], dict[str, Any] | None],
    check: Callable[[dict[str, Any], dict[str, Any] | None], None],
) -> tuple[dict[str, Any], bool]:
    """Apply `mutate` to `target` under its write lock; returns (new data, written).

    `mutate` gets a deep copy of the file's current object (`{}` when absent) and returns the new
    object (or None to keep the one it was given, mutated in place). `check(new, other's data)` raises
    to refuse it, and then nothing is written. An unchanged object writes nothing (no backup, no new
    mtime), so re-running the same command is idempotent.
    """
    with _FileLock(target.with_name(target.name + ".lock")):
        current = read_config_file(target)
        other_data = read_config_file(other)
        base = copy.deepcopy(current) if current is not None else {}
        new = mutate(copy.deepcopy(base))
        if new is None:
            new = base
        if current is not None and new == current:
            return new, False
        if current is None and not new:
            return new, False
        check(new, other_data)
        if current is not None:
            _backup(target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(target, render_config(new).encode("utf-8"))
    return new, True
