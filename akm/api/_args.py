"""The plain argument rules of the api: durations, whole numbers, output formats, limits, the working directory.

A leaf: it imports nothing of the api, so the request models (`_models`) and the calls share these rules
without importing each other (the models apply them inside pydantic validators, the read paths call them
directly and never import pydantic).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

from akm.errors import UsageError
from akm.format.grammar import MAX_TIMEOUT_MS as MAX_TIMEOUT_MS  # re-exported: about 24 days, what a timer holds
from akm.text import quoted, whole_number


def _of(kind: type, name: str, optional: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise TypeError(f"{name} {value!r}: expected {'nothing or ' if optional else ''}{kind.__name__}")
        return value

    return check


_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")

INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the stable code of a bad argument value, whatever the front


_DURATION_UNITS = (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000))


def parse_duration_ms(value: str | int, name: str = "timeout") -> int:
    """A positive duration in ms from `500ms`, `30s`, `5m`, `1h` or a bare number of ms (UsageError naming the
    argument `name` if not)."""
    try:
        return _duration_ms(value, name)
    except ValueError as exc:
        from akm.codes import Code

        raise UsageError(f"{exc}.", code=Code.INVALID_ARGUMENT, details={"argument": name}) from None


def _duration_ms(value: str | int, name: str = "timeout") -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} {value!r}: expected a duration like 500ms, 30s or 5m")
    if isinstance(value, int):
        ms = value
    else:
        raw, scale = str(value).strip().lower(), 1
        for suffix, factor in _DURATION_UNITS:
            if raw.endswith(suffix) and raw[: -len(suffix)].isdigit():
                raw, scale = raw[: -len(suffix)], factor
                break
        if not raw.isdigit() or not raw.isascii():
            raise ValueError(f"{name} {value!r}: expected a duration like 500ms, 30s or 5m")
        number = whole_number(raw)
        if number is None:
            raise ValueError(f"{name} {quoted(value)} is too long: at most {MAX_TIMEOUT_MS} ms (about 24 days)")
        ms = number * scale
    if ms <= 0:
        raise ValueError(f"{name} {value!r}: a duration must be longer than zero")
    if ms > MAX_TIMEOUT_MS:
        raise ValueError(f"{name} {value!r} is too long: at most {MAX_TIMEOUT_MS} ms (about 24 days)")
    return ms


def _whole_number(value: Any, name: str, minimum: int, maximum: int | None = None) -> int:
    """An int from an int or its decimal text, within [minimum, maximum]."""
    span = f"from {minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit() and (parsed := whole_number(value)) is not None:
        number = parsed
    else:
        raise ValueError(f"{name} {quoted(value)}: expected a whole number {span}")
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"{name} {value!r}: expected a whole number {span}")
    return number


def check_output_format(value: str, allowed: tuple[str, ...] = ("text", "json")) -> str:
    """Validate a requested output format against what the command can render."""
    if value not in allowed:
        from akm.codes import Code

        raise UsageError(
            f"format {value!r}: expected one of {', '.join(allowed)}.",
            code=Code.INVALID_ARGUMENT,
            details={"argument": "format", "allowed": list(allowed)},
        )
    return value


MAX_EVENT_LIMIT = 10_000
MAX_PAGE = 10_000  # the most items one page of a list (units, runs) may ask for


# A path or ref longer than this is refused before it reaches the filesystem (PATH_MAX is 4096 on Linux).
MAX_TARGET_CHARS = 4096


def _work_dir(cwd: str | None) -> Path:
    """The directory a call works in: `cwd` (an MCP argument, an api caller's) or the process's. A NUL
    byte, an over-long path or text that is not UTF-8 is INVALID_PATH here, not a ValueError or OSError
    from deep inside path resolution."""
    if not cwd:
        return Path(os.getcwd())
    from akm.text import require_utf8, shown

    require_utf8(cwd, "cwd")
    if "\0" in cwd:
        from akm.codes import Code

        raise UsageError(f"cwd {shown(cwd)} contains a NUL character, which no path can hold.", code=Code.INVALID_PATH)
    if len(cwd) > MAX_TARGET_CHARS:
        from akm.codes import Code

        raise UsageError(
            f"cwd is {len(cwd)} characters long, over the {MAX_TARGET_CHARS}-character limit for a path: {shown(cwd)}",
            code=Code.INVALID_PATH,
        )
    return Path(cwd)
