"""The markdown half of a workflow file: frontmatter container and body sections.

Deliberately not a CommonMark parser. The format needs only three things from
the body, and they must be predictable for authors and agents alike:

* a `---` frontmatter block at byte 0,
* level-2 headings (`## <step-id>`) that open step sections, with fenced code
  skipped so examples inside ``` blocks are never taken for headings,
* an optional `### gate` sub-section holding the step's completion rubric.

Text is extracted byte-exact (indentation, trailing spaces, inner blank lines
kept; only edge blank lines dropped; CRLF read as LF) because instructions and
rubrics are hashed into the plan.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from akm.record import dataclass, field

_LINE_SPLIT = re.compile(r"\r?\n")
_HEADING = re.compile(r"(#{1,6})\s+(.+)\Z", re.DOTALL)
_FENCE = re.compile(r"\s*(```|~~~)")
_CLOSING_HASHES = re.compile(r"\s+#+\Z")


def split_lines(text: str) -> list[str]:
    """File lines (index i is line i+1). A trailing newline yields a final empty line."""
    return _LINE_SPLIT.split(text)


@dataclass(frozen=True)
class Frontmatter:
    """Where the frontmatter sits. `yaml_text` line k is file line k + 1."""

    yaml_text: str
    close_line: int  # the closing `---`
    body_start_line: int  # first line after the closing fence


def split_frontmatter(lines: list[str]) -> Frontmatter | None:
    """Find `---` at line 1 and the first later line that is exactly `---`.

    Returns None when the file does not open with a complete frontmatter block.
    `\\r` characters are removed from the YAML text so YAML never sees a lone CR
    as a line break (which would shift every line number after it).
    """
    if not lines or lines[0] != "---":
        return None
    for idx in range(1, len(lines)):
        if lines[idx] == "---":
            yaml_text = "\n".join(lines[1:idx]).replace("\r", "")
            return Frontmatter(yaml_text=yaml_text, close_line=idx + 1, body_start_line=idx + 2)
    return None


@dataclass(frozen=True)
class Heading:
    line: int
    level: int
    text: str


@dataclass(frozen=True)
class Block:
    """Extracted text plus the source span it came from (before edge trimming)."""

    text: str
    start_line: int
    end_line: int


@dataclass
class Section:
    """One `## <text>` section: its heading and the text it holds."""

    heading: Heading
    end_line: int  # last line of the section (inclusive)
    instructions: Block | None = None
    rubric: Block | None = None
    gate_line: int | None = None
    extra_gate_lines: list[int] = field(default_factory=list)


@dataclass
class StrayH1:
    """An H1 after the first step section, followed by text that belongs to no step."""

    line: int
    text: str
    first_text_line: int


@dataclass
class Body:
    sections: list[Section]
    preamble: Block | None
    headings: list[Heading]
    stray_h1: list[StrayH1]
    line_count: int


def scan_headings(lines: list[str], start_line: int) -> list[Heading]:
    """ATX headings from `start_line` on, ignoring anything inside ``` / ~~~ fences.

    Any line whose first non-blank characters are three backticks or tildes
    toggles the fence state (kind and length are not matched); an unclosed fence
    hides the rest of the file. Headings need the hashes at column 1 and at
    least one whitespace after them; a closing run of `#` is dropped.
    """
    headings: list[Heading] = []
    in_fence = False
    for idx in range(max(0, start_line - 1), len(lines)):
        line = lines[idx]
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = _HEADING.match(line)
        if not m:
            continue
        text = _CLOSING_HASHES.sub("", m.group(2).strip()).strip()
        headings.append(Heading(line=idx + 1, level=len(m.group(1)), text=text))
    return headings


def extract_block(lines: list[str], start_line: int, end_line: int) -> Block | None:
    """Lines start..end (1-based, inclusive) minus blank edge lines, joined with LF.

    The span recorded is the untrimmed one. Empty -> None.
    """
    chunk = lines[start_line - 1 : end_line] if end_line >= start_line else []
    first, last = 0, len(chunk)
    while first < last and not chunk[first].strip():
        first += 1
    while last > first and not chunk[last - 1].strip():
        last -= 1
    if first == last:
        return None
    return Block(text="\n".join(chunk[first:last]), start_line=start_line, end_line=end_line)


def scan_body(lines: list[str], body_start_line: int) -> Body:
    """Split the body into preamble, `##` sections (with gate rubric) and stray-H1 regions."""
    headings = scan_headings(lines, body_start_line)
    last_line = len(lines)
    bounds = [h for h in headings if h.level <= 2]
    sections: list[Section] = []
    stray: list[StrayH1] = []
    first_h2 = next((h for h in headings if h.level == 2), None)

    # `### gate` lines in file order: each section takes the ones inside its span with a
    # bisect, so a file with thousands of sections stays linear instead of sections x headings.
    gate_lines = [h.line for h in headings if h.level == 3 and h.text == "gate"]

    for pos, head in enumerate(bounds):
        end = bounds[pos + 1].line - 1 if pos + 1 < len(bounds) else last_line
        if head.level == 1:
            if first_h2 is not None and head.line > first_h2.line:
                text_line = next((n for n in range(head.line + 1, end + 1) if lines[n - 1].strip()), None)
                if text_line is not None:
                    stray.append(StrayH1(line=head.line, text=head.text, first_text_line=text_line))
            continue
        section = Section(heading=head, end_line=end)
        inside = gate_lines[bisect_right(gate_lines, head.line) : bisect_right(gate_lines, end)]
        if inside:
            section.gate_line = inside[0]
            section.extra_gate_lines.extend(inside[1:])
        instr_end = section.gate_line - 1 if section.gate_line is not None else end
        section.instructions = extract_block(lines, head.line + 1, instr_end)
        if section.gate_line is not None:
            section.rubric = extract_block(lines, section.gate_line + 1, end)
        sections.append(section)

    pre_end = first_h2.line - 1 if first_h2 is not None else last_line
    preamble = None
    if pre_end >= body_start_line:
        text = "\n".join(lines[body_start_line - 1 : pre_end]).strip()
        if text:
            preamble = Block(text=text, start_line=body_start_line, end_line=pre_end)
    return Body(sections=sections, preamble=preamble, headings=headings, stray_h1=stray, line_count=last_line)
