"""Read an `exec:` block: the argv command a unit runs directly, where, and with which environment.

An exec unit never goes through a shell, so the command must be an argv list of
non-empty strings (numbers and booleans are refused rather than stringified, so
what runs is exactly what was written). `cwd` must stay inside the unit's working
directory, and `pass_env` names variables only: values belong in `env:`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from akm.format.field_reader import FieldReader, describe, utf8_len
from akm.format.grammar import (
    ENV_VAR_RE,
    EXEC_KEYS,
    MAX_EXEC_ARG_BYTES,
    MAX_EXEC_ARGV,
    MAX_EXEC_CWD_CHARS,
    MAX_EXEC_PASS_ENV,
)
from akm.format.model import ExecSpec

_ARGV_HINT = 'write an argv list such as ["make", "test"]; for shell features use ["bash", "-lc", "a | b"] explicitly'


def read_exec(ctx: FieldReader, value: Any, yp: tuple, what: str) -> ExecSpec | None:
    """`what` is the block's own name (`<label>: unit.exec`)."""
    if not isinstance(value, dict):
        ctx.error(
            "invalid_type",
            f'{what} must be a mapping holding a "command" argv list, not {describe(value)}',
            yp,
            hint='e.g. `exec: { command: ["make", "test"] }`',
        )
        return None
    ctx.check_keys(value, yp, EXEC_KEYS, what)
    command = _read_command(ctx, value, yp, what)
    if command is None:
        return None
    spec: dict[str, Any] = {"command": command}
    ok = True
    optional: dict[str, Callable[[Any, tuple, str], Any]] = {
        "cwd": partial(_read_cwd, ctx),
        "pass_env": partial(_read_pass_env, ctx),
        "inherit_env": ctx.boolean,
    }
    for key, read in optional.items():
        if key in value:
            got = read(value[key], yp + (key,), f"{what}.{key}")
            if got is None:
                ok = False
            else:
                spec[key] = got
    return ExecSpec(**spec) if ok else None


def _read_command(ctx: FieldReader, value: dict, yp: tuple, what: str) -> list[str] | None:
    """The argv list. Only its first problem is reported; the caller then skips the rest of the block."""
    cmd = value.get("command")
    cyp = yp + ("command",)
    if "command" not in value or not isinstance(cmd, list) or not cmd:
        got = "it is missing" if "command" not in value else f"got {describe(cmd)}"
        ctx.error(
            "exec_invalid_command",
            f'{what} requires "command": a non-empty argv list, run directly and never through a shell; {got}',
            cyp if "command" in value else yp,
            hint=_ARGV_HINT,
        )
        return None
    if len(cmd) > MAX_EXEC_ARGV:
        ctx.error(
            "too_many_entries",
            f"{what}.command has {len(cmd)} entries; at most {MAX_EXEC_ARGV} entries are allowed",
            cyp,
        )
        return None
    for i, arg in enumerate(cmd):
        if not isinstance(arg, str) or arg == "":
            ctx.error(
                "exec_invalid_command",
                f"{what}.command[{i}] must be a non-empty string, not {describe(arg)}",
                cyp + (i,),
                hint='quote numbers and booleans, e.g. "1"' if not isinstance(arg, str) else None,
            )
            return None
    for i, arg in enumerate(cmd):
        if "\x00" in arg:
            ctx.error(
                "exec_invalid_command",
                f"{what}.command[{i}] contains a NUL character, which no program argument can hold",
                cyp + (i,),
                hint="remove the \\0 (an argv entry is a C string and would end at it)",
            )
            return None
    for i, arg in enumerate(cmd):
        if utf8_len(arg) > MAX_EXEC_ARG_BYTES:
            ctx.error(
                "too_large",
                f"{what}.command[{i}] is {utf8_len(arg)} bytes; each entry may be at most {MAX_EXEC_ARG_BYTES} bytes",
                cyp + (i,),
                hint="put long input in a file and pass its path",
            )
            return None
    return list(cmd)


def _read_cwd(ctx: FieldReader, value: Any, yp: tuple, what: str) -> str | None:
    cwd = ctx.text(value, yp, what)
    if cwd is None:
        return None
    if "\x00" in cwd:
        ctx.error("exec_cwd_not_relative", f"{what} contains a NUL character, which no path can hold", yp)
        return None
    if len(cwd) > MAX_EXEC_CWD_CHARS:
        ctx.error("too_large", f"{what} is {len(cwd)} characters; at most {MAX_EXEC_CWD_CHARS} are allowed", yp)
        return None
    if not _contained_relative(cwd):
        ctx.error(
            "exec_cwd_not_relative",
            f'{what} "{cwd}" must be a RELATIVE path inside the unit\'s working directory '
            "(no absolute paths, drive letters, ~ or ..)",
            yp,
            hint="e.g. `cwd: packages/core`",
        )
        return None
    return cwd


def _read_pass_env(ctx: FieldReader, value: Any, yp: tuple, what: str) -> list[str] | None:
    """Environment variable names to pass through; stops at the first bad entry."""
    if not isinstance(value, list) or not value:
        ctx.error(
            "invalid_type" if not isinstance(value, list) else "invalid_value",
            f"{what} must be a non-empty list of environment variable names; got {describe(value)}",
            yp,
            hint="it passes names only; values for the unit belong in `env:`",
        )
        return None
    if len(value) > MAX_EXEC_PASS_ENV:
        ctx.error(
            "too_many_entries",
            f"{what} has {len(value)} names; at most {MAX_EXEC_PASS_ENV} are allowed",
            yp,
            hint="use `inherit_env: true` to pass the whole environment",
        )
        return None
    names: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not ENV_VAR_RE.match(name):
            ctx.error(
                "exec_invalid_env_name",
                f"{what}[{i}] must be an environment variable name, not {describe(name)}",
                yp + (i,),
                hint="letters, digits and _, not starting with a digit",
            )
            return None
        if name in names:
            ctx.duplicate(what, name, yp + (i,))
            return None
        names.append(name)
    return names


def _contained_relative(path: str) -> bool:
    """True for a relative path that cannot climb out (no root, drive, ~ or `..` segment)."""
    if not path or path[0] in "/\\~" or re.match(r"[A-Za-z]:", path):
        return False
    return ".." not in re.split(r"[/\\]+", path)
