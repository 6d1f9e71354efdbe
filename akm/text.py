"""Text that came from outside: is it UTF-8, and how to quote it in a message.

Why this module: on POSIX, argv entries and file names are bytes. Python hands
bytes that are not valid UTF-8 over as lone surrogates (`\\udcff`), and an MCP
client can send lone surrogates in JSON (`"\\ud800"`). Such a string looks like
text until it reaches SQLite, `json.dumps` into a file, or a strict stdout —
and then fails far from where it came in, as an internal error. akm stores
runs, params and paths as text, so it refuses such values where they enter,
with a message that says which value and where the bad byte is.

Messages also quote what the user gave; a 5000-character argument must not
become a 5000-character error, so every echo goes through `shown()`.
"""

from __future__ import annotations

import re
from typing import Any

from akm.errors import UsageError

NOT_UTF8 = "NOT_UTF8"
_SURROGATE = re.compile("[\ud800-\udfff]")
SHOWN_LIMIT = 120
# What JavaScript's `String.prototype.trim` strips (ECMAScript WhiteSpace and LineTerminator): how upstream
# trims a flag value, a unit's stdout and an answer, so akm trims the same.
JS_WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def surrogate_at(text: str) -> int | None:
    """Index of the first character that is not valid Unicode text (a lone surrogate), or None."""
    m = _SURROGATE.search(text)
    return m.start() if m else None


def _describe_bad_char(text: str, index: int) -> str:
    ch = ord(text[index])
    if 0xDC80 <= ch <= 0xDCFF:  # surrogateescape: an undecodable byte from argv or a file name
        return f"byte 0x{ch - 0xDC00:02x} at character {index + 1}"
    return f"a lone surrogate U+{ch:04X} at character {index + 1}"


def require_utf8(text: str, what: str) -> str:
    """`text` unchanged, or a `NOT_UTF8` usage error naming `what` and the first bad character."""
    index = surrogate_at(text)
    if index is None:
        return text
    from akm.codes import Code

    raise UsageError(
        f"{what} is not valid UTF-8 text ({_describe_bad_char(text, index)}): {shown(text)}",
        code=Code.NOT_UTF8,
        hint="akm records names, paths and values as UTF-8 text; rename the file or directory, "
        "or pass the value in UTF-8.",
    )


def require_utf8_value(value: Any, what: str) -> Any:
    """Like `require_utf8` for every string (and object key) inside a JSON-like value.

    A label (`params.xs[3]`) is only written out for a bad string or an object's keys: a list param of
    thousands of numbers or strings is checked without building a label per item.
    """
    stack: list[tuple[Any, str, int | None]] = [(value, what, None)]  # (value, where, index in `where`)
    while stack:
        v, where, index = stack.pop()
        if isinstance(v, str):
            if surrogate_at(v) is not None:
                require_utf8(v, where if index is None else f"{where}[{index}]")
        elif isinstance(v, dict):
            label = where if index is None else f"{where}[{index}]"
            for k, item in v.items():
                if isinstance(k, str):
                    require_utf8(k, f"a key in {label}")
                stack.append((item, f"{label}.{k}" if isinstance(k, str) else label, None))
        elif isinstance(v, (list, tuple)):
            label = where if index is None else f"{where}[{index}]"
            stack.extend((item, label, i) for i, item in enumerate(v))
    return value


def shown(text: str, limit: int = SHOWN_LIMIT) -> str:
    """`text` quoted for a message: clipped to `limit` characters, bad characters escaped."""
    clipped = text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"
    return '"' + clipped.encode("utf-8", "backslashreplace").decode("utf-8") + '"'


def quoted(value: Any) -> str:
    """A value as messages have always quoted it (repr), clipped by `shown` when it is long."""
    return repr(value) if len(str(value)) <= 120 else shown(str(value))


_WHOLE = re.compile(r"[+-]?[0-9]+")
# More digits than any count, offset or duration akm takes (2^63 has 19). Checked before int(),
# which refuses over 4300 digits with a ValueError whose advice is for programmers.
MAX_WHOLE_DIGITS = 40


def whole_number(text: str) -> int | None:
    """`text` — an optional sign and ASCII digits — as an int; None when it is not one, or is too
    long to be any number akm accepts (callers then report their own range)."""
    text = text.strip()
    if not _WHOLE.fullmatch(text) or len(text.lstrip("+-").lstrip("0")) > MAX_WHOLE_DIGITS:
        return None
    return int(text)


def dollars(amount: float) -> str:
    """US dollars for people: `$4.20` from a dollar up, four decimals below (`$0.0123`), `$0.00` for nothing."""
    return f"${amount:.2f}" if amount >= 1 or amount == 0 else f"${amount:.4f}"
