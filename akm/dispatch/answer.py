"""Turning a unit's text answer into one JSON value — and saying exactly what is wrong when it is not.

Two readers, one per kind of producer:

* `parse_command_json` — a command's stdout must be exactly one JSON value
  (surrounding whitespace allowed). Programs can be held to that, so nothing is
  guessed: a log line before the value, text after it, `NaN` or `1e999` are
  each reported as what they are, with line and column.
* `extract_model_json` — a model or agent answers in prose. Think blocks and a
  code fence around the answer are removed; then the answer must hold exactly
  ONE top-level JSON object or array. Two values are ambiguous and refused
  (the corrective re-prompt asks for one), never silently "the first".

Both raise `AnswerError` whose message is user-facing and quotes a short,
clipped excerpt of the offending text (the caller has already redacted it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from akm.text import JS_WHITESPACE

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE_OPEN = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\r?\n")
_FENCE_CLOSE = re.compile(r"\r?\n?```\s*\Z")
EXCERPT = 60


class AnswerError(ValueError):
    """The text is not one usable JSON value; `str(exc)` says why and where."""


def _excerpt(text: str, pos: int) -> str:
    piece = text[pos : pos + EXCERPT]
    suffix = "…" if len(text) > pos + EXCERPT else ""
    return json.dumps(piece + suffix, ensure_ascii=False)


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {col}"


class _Decoder(json.JSONDecoder):
    """Standard JSON, minus the JavaScript constants and numbers no JSON document can hold."""

    def __init__(self) -> None:
        super().__init__(parse_constant=self._constant, parse_float=self._float, parse_int=self._int)

    @staticmethod
    def _int(literal: str) -> int:
        if len(literal) > 4000:  # int() refuses > 4300 digits, with advice meant for programmers
            raise ValueError(f"the number {literal[:12]}… has {len(literal)} digits, too many to read")
        return int(literal)

    @staticmethod
    def _constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON value")

    @staticmethod
    def _float(literal: str) -> float:
        value = float(literal)
        if math.isinf(value):
            raise ValueError(f"the number {literal} is out of range")
        return value


_DECODER = _Decoder()


# A JSON string, or a bare token (number or word): enough to walk a value token by token.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?[A-Za-z0-9_.+]+(?:[eE][-+]?\d+)?')


def _token_position(text: str, start: int, exc: ValueError) -> int:
    """Where the token a decoder hook refused (`1e999`, `NaN`) sits: the first bare token outside
    strings that spells it, in decoding order (the decoder stops at the first one it refuses)."""
    message = str(exc)
    for m in _TOKEN.finditer(text, start):
        token = m.group()
        if not token.startswith('"') and (
            f"the number {token} " in message
            or message.startswith(f"{token} ")
            or f"the number {token[:12]}… has {len(token)} digits" in message
        ):
            return m.start()
    return start


# The deepest answer akm takes. Deeper values (json reads ~1000 levels) break the recursive
# readers downstream — `status` rendering, redaction — as internal errors. A value deeper than
# canonical JSON's 64 levels is still taken, but a later step cannot hash it as an input and fails.
MAX_ANSWER_DEPTH = 200


def _nodes(value: Any) -> Iterator[tuple[Any, int]]:
    """Every node of a JSON value with its depth (iterative: the value may be ~1000 deep).
    A caller stops at the first node it refuses, so nothing deeper is ever walked."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        yield v, depth
        if isinstance(v, (dict, list)):
            stack.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict) else v))


def recordable_problem(value: Any) -> str | None:
    """Why a structured value (an MCP caller's result) cannot be recorded, or None."""
    for v, depth in _nodes(value):
        if isinstance(v, float) and not math.isfinite(v):
            return "it holds a non-finite number"
        if isinstance(v, (dict, list)) and depth >= MAX_ANSWER_DEPTH:
            return f"it nests deeper than {MAX_ANSWER_DEPTH} levels"
    return None


def _nesting_over(value: Any, limit: int) -> bool:
    """Does `value` nest deeper than `limit` levels?"""
    return any(isinstance(v, (dict, list)) and depth >= limit for v, depth in _nodes(value))


def _decode_at(text: str, start: int) -> tuple[Any, int]:
    """raw_decode with our messages; raises AnswerError naming the position.

    A value nesting deeper than `MAX_ANSWER_DEPTH` is refused here, where it enters: accepted,
    `status` could not show it.
    """
    try:
        value, stop = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip(JS_WHITESPACE)):
            raise AnswerError(
                f"the JSON value is cut off: the text ends at {_where(text, exc.pos)} before the value is complete"
            ) from None
        what = exc.msg[:1].lower() + exc.msg[1:]
        raise AnswerError(f"invalid JSON at {_where(text, exc.pos)}: {what} (near {_excerpt(text, exc.pos)})") from None
    except ValueError as exc:  # our constant/float hooks: they are not told where they are
        raise AnswerError(f"invalid JSON at {_where(text, _token_position(text, start, exc))}: {exc}") from None
    except RecursionError:
        raise AnswerError("the JSON value is nested too deeply to read") from None
    if _nesting_over(value, MAX_ANSWER_DEPTH):
        raise AnswerError(
            f"the JSON value starting at {_where(text, start)} nests deeper than {MAX_ANSWER_DEPTH} "
            f"levels; akm records at most {MAX_ANSWER_DEPTH}"
        )
    return value, stop


def parse_command_json(stdout: str) -> Any:
    """Exactly one JSON value, nothing before or after it (whitespace aside)."""
    start = len(stdout) - len(stdout.lstrip(JS_WHITESPACE))
    end = len(stdout.rstrip(JS_WHITESPACE))
    if start >= end:
        raise AnswerError("the output is empty; one JSON value was expected")
    body = stdout[:end]
    first = body[start]
    for constant in ("NaN", "Infinity", "-Infinity"):
        if body.startswith(constant, start):
            raise AnswerError(f"{constant} at {_where(body, start)} is not a JSON value")
    if first not in '{["-0123456789tfn':
        newline = body.find("\n", start)
        line_end = newline if newline != -1 else end
        hint = " (a log line before the value? send logs to stderr)" if newline != -1 else ""
        raise AnswerError(
            f"the output does not start with a JSON value: {_where(body, start)} reads "
            f"{_excerpt(body[:line_end], start)}{hint}"
        )
    value, stop = _decode_at(body, start)
    if stop < end:
        rest = stop + (len(body[stop:]) - len(body[stop:].lstrip(JS_WHITESPACE)))
        raise AnswerError(
            f"text follows the JSON value at {_where(body, rest)}: {_excerpt(body, rest)} "
            "(print exactly one JSON value; send logs to stderr)"
        )
    return value


def _strip_wrapping(text: str) -> str:
    text = _THINK.sub("", text).strip(JS_WHITESPACE)
    opened = _FENCE_OPEN.match(text)
    if opened:
        text = text[opened.end() :]
        text = _FENCE_CLOSE.sub("", text)
    return text.strip(JS_WHITESPACE)


def extract_model_json(answer: str) -> Any:
    """The one JSON object or array in a model's answer (prose around it allowed)."""
    text = _strip_wrapping(answer)
    if not text:
        raise AnswerError("the answer is empty; one JSON value was expected")
    try:
        return parse_command_json(text)
    except AnswerError as strict_error:
        if text[0] in "{[":
            raise strict_error  # it is meant to be JSON: report the real problem, with position
    found: list[tuple[int, Any]] = []
    i = 0
    while i < len(text) and len(found) < 2:
        j = min((k for k in (text.find("{", i), text.find("[", i)) if k != -1), default=-1)
        if j == -1:
            break
        try:
            value, stop = _DECODER.raw_decode(text, j)
        except (ValueError, RecursionError):
            i = j + 1
            continue
        if isinstance(value, (dict, list)):
            found.append((j, value))
            i = stop
        else:
            i = j + 1
    if not found:
        raise AnswerError(f"no JSON object or array found in the answer (it begins {_excerpt(text, 0)})")
    if len(found) > 1:
        raise AnswerError(
            f"the answer holds more than one JSON value (at {_where(text, found[0][0])} and "
            f"{_where(text, found[1][0])}); answer with exactly one"
        )
    if _nesting_over(found[0][1], MAX_ANSWER_DEPTH):
        raise AnswerError(
            f"the JSON value at {_where(text, found[0][0])} nests deeper than {MAX_ANSWER_DEPTH} "
            f"levels; akm records at most {MAX_ANSWER_DEPTH}"
        )
    return found[0][1]
