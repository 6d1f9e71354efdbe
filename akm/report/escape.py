"""Text from a run made safe inside HTML and SVG.

Unit output, step ids, params and failure reasons are written by workflows and
the programs they run, so every one of them passes through `esc()` before it is
placed in markup: `<`, `>`, `&` and both quotes become entity references (so a
unit that prints `<script>` shows those characters and never creates an
element, in text and in attribute values alike), and C0 control characters
other than tab and newline are dropped (they are not allowed in XML, and an
inline SVG is parsed as such by some viewers).
"""

from __future__ import annotations

import html

_CONTROLS = {c: None for c in range(0x20) if c not in (0x09, 0x0A)} | {0x7F: None}


def esc(text: object) -> str:
    """`text` (anything; str() of it) as HTML/SVG text or attribute content."""
    return html.escape(str(text), quote=True).translate(_CONTROLS)


def clip(text: str, limit: int) -> tuple[str, bool]:
    """The first `limit` characters of `text` and whether anything was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def short(text: str, limit: int) -> str:
    """One line of at most `limit` characters, with an ellipsis when cut (for labels and summaries)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: max(1, limit - 1)] + "…"
