"""Typed reads of frontmatter values that report, instead of raise, when a value is wrong.

Every reader in the parser goes through a `FieldReader`: it owns the error and
warning lists and turns a YAML path (`("steps", 0, "unit")`) into the file line
a diagnostic points at. Each small reader (`text`, `integer`, `choice`, ...)
reports one diagnostic and returns None on a bad value, so the caller can keep
going and every problem in the file is reported in one pass. Message wording
lives in these helpers so the same mistake reads the same wherever it is made.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from akm.format.diagnostics import Diagnostic
from akm.format.grammar import MAX_JSON_DEPTH
from akm.format.yaml12 import YamlDoc, js_string


def utf8_len(text: str) -> int:
    """UTF-8 byte length that tolerates lone surrogates (API callers can pass any str)."""
    return len(text.encode("utf-8", "surrogatepass"))


def describe(value: Any) -> str:
    """How a value reads in a message: its YAML kind, plus the value when short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {js_string(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'the string "{shown}"'
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    return type(value).__name__


def as_int(value: Any) -> int | None:
    """An integer, accepting integral floats (`2.0`) as YAML/JSON authors expect."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """A `did you mean "x"? ` prefix for a hint, or "" when nothing is close."""
    import difflib  # only a refusal needs it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"? ' if close else ""


def corrected_name(name: str, valid: re.Pattern[str], invalid_chars: str, filler: str, lead: str) -> str:
    """A nearby valid name to offer in a hint, or "" when the simple repair does not give one.

    Characters matching `invalid_chars` become `filler`; a leading digit gets `lead` in front.
    """
    fixed = re.sub(invalid_chars, filler, name)
    if fixed and fixed[0].isdigit():
        fixed = lead + fixed
    return fixed if fixed and valid.match(fixed) and fixed != name else ""


def _json_len(value: Any) -> int:
    return utf8_len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True))


def _json_value_problem(value: Any, depth: int = 0) -> tuple[str, str] | None:
    """(code, message) when a value cannot travel as canonical JSON in the plan."""
    if depth > MAX_JSON_DEPTH:
        return ("too_large", f"nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        return ("invalid_value", f"contains {js_string(value)}, which JSON cannot represent")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for v in children:
        found = _json_value_problem(v, depth + 1)
        if found:
            return found
    return None


class FieldReader:
    """Collects diagnostics and turns YAML paths into file lines."""

    def __init__(self, ydoc: YamlDoc | None = None, close_line: int = 1) -> None:
        """Without `ydoc` (checks made before the YAML is loaded) a path-anchored diagnostic falls back to line 1."""
        self.ydoc = ydoc
        self.close_line = close_line
        self.errors: list[Diagnostic] = []
        self.warnings: list[Diagnostic] = []

    def _last_yaml_line(self) -> int:
        """The last file line that holds YAML: anchors never point into the closing fence or the body."""
        return max(self.close_line - 1, 2)

    def mark(self, ypath: tuple, key: bool = False) -> tuple[int, int | None]:
        if self.ydoc is None:
            return (1, None)
        m = self.ydoc.mark_of(ypath, key=key)
        if m is None:
            return (2, None)
        # YAML text line 1 is file line 2 (after the opening fence).
        return (min(m[0] + 1, self._last_yaml_line()), m[1])

    def line(self, ypath: tuple, key: bool = False) -> int:
        return self.mark(ypath, key)[0]

    def end_line(self, ypath: tuple, start: int) -> int:
        """Last file line of the value at `ypath` (never before `start`, never past the frontmatter)."""
        end = self.ydoc.value_end_lines.get(ypath) if self.ydoc else None
        if end is None:
            return start
        return max(start, min(end + 1, self._last_yaml_line()))

    def error(
        self,
        code: str,
        message: str,
        ypath: tuple = (),
        *,
        key: bool = False,
        hint: str | None = None,
        line: int | None = None,
    ) -> None:
        if line is None:
            line, column = self.mark(ypath, key)
        else:
            column = None
        self.errors.append(Diagnostic(code=code, message=message, line=line, column=column, hint=hint))

    def warn(self, code: str, message: str, line: int, hint: str | None = None) -> None:
        self.warnings.append(Diagnostic(code=code, message=message, line=line, hint=hint))

    def duplicate(self, what: str, entry: str, ypath: tuple) -> None:
        """One wording for every list that must not repeat an entry."""
        self.error("duplicate_entry", f'{what} lists "{entry}" more than once', ypath, hint="remove the repeated entry")

    # --- small typed readers; each reports and returns None on a bad value ---

    def check_keys(
        self,
        node: dict,
        ypath: tuple,
        allowed: tuple[str, ...],
        where: str,
        hint: str | None = None,
        placed: Callable[[str, Any], str | None] | None = None,
    ) -> None:
        """Report keys outside `allowed`; the default hint suggests a close key and lists the allowed ones.
        `placed(key, value)` may say where a key that belongs elsewhere goes instead (then its hint leads)."""
        for k in node:
            if k not in allowed:
                default = hint if hint is not None else f"{suggest(k, allowed)}allowed keys: {', '.join(allowed)}"
                elsewhere = placed(k, node[k]) if placed is not None else None
                self.error(
                    "unknown_key",
                    f'Unknown key "{k}" in {where}',
                    ypath + (k,),
                    key=True,
                    hint=f"{elsewhere}; {default}" if elsewhere else default,
                )

    def mapping(self, value: Any, ypath: tuple, what: str, hint: str | None = None) -> dict | None:
        if isinstance(value, dict):
            return value
        self.error("invalid_type", f"{what} must be a mapping, not {describe(value)}", ypath, hint=hint)
        return None

    def strict_mapping(
        self,
        value: Any,
        ypath: tuple,
        what: str,
        allowed: tuple[str, ...],
        hint: str | None = None,
        unknown_hint: str | None = None,
        placed: Callable[[str, Any], str | None] | None = None,
    ) -> dict | None:
        """A mapping whose keys must come from `allowed`: unknown keys are reported, the mapping is still returned."""
        node = self.mapping(value, ypath, what, hint=hint)
        if node is not None:
            self.check_keys(node, ypath, allowed, what, hint=unknown_hint, placed=placed)
        return node

    def section(
        self, root: dict, key: str, allowed: tuple[str, ...] | None = None, hint: str | None = None
    ) -> dict | None:
        """The top-level mapping `key:`; None when absent or not a mapping. Unknown keys are reported."""
        if key not in root:
            return None
        if allowed is None:
            return self.mapping(root[key], (key,), f'"{key}"', hint=hint)
        return self.strict_mapping(root[key], (key,), f'"{key}"', allowed, hint=hint)

    def text(self, value: Any, ypath: tuple, what: str) -> str | None:
        """A non-empty string, trimmed."""
        if not isinstance(value, str):
            self.error("invalid_type", f"{what} must be a string, not {describe(value)}", ypath)
            return None
        if not value.strip():
            self.error("invalid_value", f"{what} must not be empty", ypath)
            return None
        return value.strip()

    def integer(self, value: Any, ypath: tuple, what: str, lo: int, hi: int | None) -> int | None:
        n = as_int(value)
        bounds = f"from {lo} through {hi}" if hi is not None else f"at least {lo}"
        if n is None:
            self.error("invalid_type", f"{what} must be a whole number {bounds}, not {describe(value)}", ypath)
            return None
        if n < lo or (hi is not None and n > hi):
            self.error("out_of_range", f"{what} must be {bounds}; got {n}", ypath)
            return None
        return n

    def boolean(self, value: Any, ypath: tuple, what: str) -> bool | None:
        if isinstance(value, bool):
            return value
        self.error(
            "invalid_type",
            f"{what} must be true or false, not {describe(value)}",
            ypath,
            hint="YAML 1.2: only true/false are booleans (yes/no/on/off are strings)",
        )
        return None

    def choice(self, value: Any, ypath: tuple, what: str, choices: tuple[str, ...]) -> str | None:
        if isinstance(value, str) and value in choices:
            return value
        self.error(
            "invalid_value",
            f"{what} must be one of {', '.join(choices)}; got {describe(value)}",
            ypath,
        )
        return None

    def entries(
        self, value: Any, ypath: tuple, what: str, of: str, *, limit: int, hint: str | None = None
    ) -> list | None:
        """A non-empty list (`of` names its entries in the message); None when not a list or empty.

        Too many entries is reported but the list is still returned, so its entries get checked too.
        """
        if not isinstance(value, list):
            self.error("invalid_type", f"{what} must be a list of {of}, not {describe(value)}", ypath, hint=hint)
            return None
        if not value:
            self.error("invalid_value", f"{what} must not be an empty list", ypath, hint="remove the key instead")
            return None
        if len(value) > limit:
            self.error("too_many_entries", f"{what} has {len(value)} entries; at most {limit} are allowed", ypath)
        return value

    def string_list(self, value: Any, ypath: tuple, what: str, *, limit: int, unique: bool) -> list[str] | None:
        """A non-empty list of non-empty (trimmed) strings."""
        items = self.entries(value, ypath, what, "strings", limit=limit)
        if items is None:
            return None
        ok = len(items) <= limit
        out: list[str] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            text = self.text(item, ypath + (i,), f"{what}[{i}]")
            if text is None:
                ok = False
                continue
            if unique and text in seen:
                self.duplicate(what, text, ypath + (i,))
                ok = False
                continue
            seen.add(text)
            out.append(text)
        return out if ok else None

    # --- values that travel into the plan as JSON (schemas, llm.extra_params) ---

    def json_value(self, value: Any, ypath: tuple, what: str) -> bool:
        """True when `value` can be written as canonical JSON (finite numbers, bounded nesting)."""
        problem = _json_value_problem(value)
        if problem:
            self.error(problem[0], f"{what} {problem[1]}", ypath)
            return False
        return True

    def json_size(self, value: Any, ypath: tuple, what: str, limit: int) -> bool:
        """True when `value` is at most `limit` bytes as compact JSON."""
        size = _json_len(value)
        if size > limit:
            self.error("too_large", f"{what} is {size} bytes as JSON; at most {limit} are allowed", ypath)
            return False
        return True
