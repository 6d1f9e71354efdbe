"""The reference grammar: how frontmatter names a param or a piece of an earlier step's output.

References appear only as whole values (`map.over`, `route.input`, each `inputs` entry), never inside
prose, so the language is deliberately tiny and has no expressions:

    reference := "params" "." ident
               | "steps" "." ident "." "output" segment*
    segment   := "." ident | "[" digit+ "]"
    ident     := [A-Za-z_] [A-Za-z0-9_-]*

Parsing is pure and total: every malformed input raises `ReferenceSyntaxError` (with a 0-based offset
into the trimmed text) and nothing else, so lint can report it with a line number. Resolution walks
plain JSON values at run time and fails loudly (never yields a silent `None`): a missing value or a
`null` is a step failure, because a unit fed "nothing" would otherwise do confident wrong work.
"""

from __future__ import annotations

from typing import Any, Literal

from akm.record import dataclass

# Largest index we accept: JavaScript's safe-integer limit. Bigger can never address a real array and
# Python's int() refuses very long digit strings, which would leak a non-syntax exception.
MAX_INDEX = 2**53 - 1

_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789-")
_DIGITS = frozenset("0123456789")

PathSegment = str | int


class ReferenceSyntaxError(ValueError):
    """A reference string does not follow the grammar; `offset` is 0-based in the trimmed text."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


class ReferenceResolutionError(ValueError):
    """A syntactically valid reference does not lead to a usable value at run time."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Reference:
    """A parsed reference. `text` is the canonical spelling (e.g. `[007]` is written `[7]`)."""

    root: Literal["params", "steps"]
    name: str
    path: tuple[PathSegment, ...]
    text: str

    def __str__(self) -> str:
        return self.text


def format_path(prefix: str, path: tuple[PathSegment, ...] | list[PathSegment]) -> str:
    """Spell `prefix` followed by `.key` / `[i]` segments, the way references and errors show paths."""
    parts = [prefix]
    for seg in path:
        parts.append(f"[{seg}]" if isinstance(seg, int) else f".{seg}")
    return "".join(parts)


def _scan_ident(text: str, pos: int) -> int:
    """Return the end offset of the identifier starting at `pos` (== pos when there is none)."""
    if pos >= len(text) or text[pos] not in _IDENT_START:
        return pos
    end = pos + 1
    while end < len(text) and text[end] in _IDENT_CHARS:
        end += 1
    return end


def parse_reference(text: str) -> Reference:
    """Parse one reference (surrounding whitespace is ignored) or raise `ReferenceSyntaxError`."""
    if not isinstance(text, str):
        raise ReferenceSyntaxError("A reference must be a string", 0)
    src = text.strip()
    if not src:
        raise ReferenceSyntaxError("Empty reference", 0)
    root_end = _scan_ident(src, 0)
    if root_end == 0:
        raise ReferenceSyntaxError(
            f'Reference must start with an identifier ("params" or "steps"); found {src[0]!r}', 0
        )
    root = src[:root_end]
    if root == "params":
        return _parse_param(src, root_end)
    if root == "steps":
        return _parse_step(src, root_end)
    raise ReferenceSyntaxError(f'Unknown root "{root}"; a reference is params.<name> or steps.<id>.output[...]', 0)


def _parse_param(src: str, pos: int) -> Reference:
    if pos >= len(src) or src[pos] != ".":
        raise ReferenceSyntaxError('"params" requires a name: params.<name>', pos)
    name_start = pos + 1
    name_end = _scan_ident(src, name_start)
    if name_end == name_start:
        if name_start >= len(src):
            raise ReferenceSyntaxError('"params" requires a name: params.<name>', name_start)
        raise ReferenceSyntaxError(
            f"Invalid param name at offset {name_start}: a name starts with a letter or underscore",
            name_start,
        )
    if name_end < len(src):
        raise ReferenceSyntaxError(
            f"A params reference takes exactly one name — found trailing {src[name_end:]!r}",
            name_end,
        )
    name = src[name_start:name_end]
    return Reference(root="params", name=name, path=(), text=f"params.{name}")


def _parse_step(src: str, pos: int) -> Reference:
    id_start = pos + 1
    id_end = _scan_ident(src, id_start) if pos < len(src) and src[pos] == "." else id_start
    if pos >= len(src) or src[pos] != "." or id_end == id_start:
        raise ReferenceSyntaxError(
            '"steps" must be followed by a step id and ".output" (steps.<id>.output)', min(pos, len(src))
        )
    step_id = src[id_start:id_end]
    if id_end >= len(src):
        raise ReferenceSyntaxError(f'"steps.{step_id}" must be followed by ".output"', id_end)
    out_end = _scan_ident(src, id_end + 1) if src[id_end] == "." else id_end
    if src[id_end] != "." or src[id_end + 1 : out_end] != "output":
        raise ReferenceSyntaxError(f'Expected ".output" after "steps.{step_id}"', id_end)
    path: list[PathSegment] = []
    pos = out_end
    while pos < len(src):
        ch = src[pos]
        if ch == ".":
            seg_end = _scan_ident(src, pos + 1)
            if seg_end == pos + 1:
                raise ReferenceSyntaxError(
                    f"Invalid path segment at offset {pos + 1}: expected a name after '.'", pos + 1
                )
            path.append(src[pos + 1 : seg_end])
            pos = seg_end
        elif ch == "[":
            digits_end = pos + 1
            while digits_end < len(src) and src[digits_end] in _DIGITS:
                digits_end += 1
            if digits_end == pos + 1 or digits_end >= len(src) or src[digits_end] != "]":
                raise ReferenceSyntaxError(f"Invalid indexer at offset {pos}: expected [<non-negative integer>]", pos)
            digits = src[pos + 1 : digits_end].lstrip("0") or "0"
            if len(digits) > 16 or int(digits) > MAX_INDEX:
                raise ReferenceSyntaxError(f"Invalid indexer at offset {pos}: index too large", pos)
            path.append(int(digits))
            pos = digits_end + 1
        else:
            raise ReferenceSyntaxError(f"Unexpected character {ch!r} at offset {pos}", pos)
    canonical = format_path(f"steps.{step_id}.output", tuple(path))
    return Reference(root="steps", name=step_id, path=tuple(path), text=canonical)


def resolve_reference(ref: Reference, params: dict[str, Any], step_outputs: dict[str, Any]) -> Any:
    """Return the value `ref` names, or raise `ReferenceResolutionError` saying exactly where it broke.

    `step_outputs[id]` is what a step published (its evidence `output`, or the whole evidence object
    when it has none, e.g. a route decision). Only own keys count. A final `null` is an error.
    """
    if ref.root == "params":
        if not isinstance(params, dict) or ref.name not in params:
            raise ReferenceResolutionError(f"{ref.text} is not defined in the run's params")
        value = params[ref.name]
        if value is None:
            raise ReferenceResolutionError(f"{ref.text} resolved to null")
        return value

    if not isinstance(step_outputs, dict) or ref.name not in step_outputs:
        raise ReferenceResolutionError(
            f'steps.{ref.name}.output is not available (step "{ref.name}" has no recorded output)'
        )
    value = step_outputs[ref.name]
    walked: list[PathSegment] = []
    for seg in ref.path:
        here = format_path(f"steps.{ref.name}.output", tuple(walked))
        if isinstance(seg, int):
            if not isinstance(value, (list, tuple)):
                raise ReferenceResolutionError(f"{here} is not an array (cannot take [{seg}])")
            if seg >= len(value):
                raise ReferenceResolutionError(f"{here}[{seg}] is out of bounds (array length {len(value)})")
            value = value[seg]
        else:
            if not isinstance(value, dict):
                raise ReferenceResolutionError(f"{here} is not an object (cannot read .{seg})")
            if seg not in value:
                raise ReferenceResolutionError(f"{here}.{seg} is missing")
            value = value[seg]
        walked.append(seg)
    if value is None:
        raise ReferenceResolutionError(f"{ref.text} resolved to null")
    return value
