"""Recognise and convert workflows written in the retired (legacy) markdown format.

The legacy format described steps only in prose:

    # Workflow: Publish a stash
    ## Step: Prepare the layout
    Step ID: prepare-layout
    ### Instructions
    ...
    ### Completion Criteria
    - ...

with free-form `params:` descriptions and no `steps:` list. Today's format declares the steps in the
frontmatter and binds each `## <id>` section to one. Lint uses `detect_legacy` to say *why* a file
looks legacy (instead of a wall of "unexpected heading" errors), and `upgrade_legacy` produces a
current-format file a person can review:

* frontmatter keeps the envelope keys, turns each legacy param description into
  `{type: string, description: ...}`, parks keys the format does not know under
  `provenance.legacy_frontmatter` (nothing is lost), and adds `steps:` with one `- id:` per step;
* each step becomes `## <id>` with its instructions, and its completion criteria become the
  `### gate` rubric (so they are judged, fail-closed, instead of being advisory prose);
* text outside any step (intro, notes between or after steps) becomes the preamble.

The conversion is pure text-to-text; it never touches the filesystem.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from akm.codes import Code
from akm.errors import UsageError
from akm.format.grammar import ENVELOPE_KEYS
from akm.format.schema import check_schema_definition
from akm.format.yaml12 import load_yaml
from akm.format.yaml_stock import Yaml12Resolver
from akm.record import dataclass, field

UPGRADE_FAILED = "UPGRADE_FAILED"

# Same heading/fence rules as the current-format body scanner, so what we emit binds as intended.
_HEADING = re.compile(r"(#{1,6})\s+(.+)\Z")
_CLOSING_HASHES = re.compile(r"\s+#+\Z")
_FENCE = re.compile(r"\s*(```|~~~)")
_STEPS_KEY = re.compile(r"^steps\s*:", re.MULTILINE)
_WORKFLOW_TITLE = re.compile(r"Workflow\s*:\s*(.*)\Z", re.IGNORECASE)
_STEP_ID_LINE = re.compile(
    r"\s*(?:[-*+]\s+)?(?:\*\*|__)?Step[ \t]*ID\s*(?:\*\*|__)?\s*:\s*(?:\*\*|__)?\s*(?P<id>.*?)\s*\Z",
    re.IGNORECASE,
)
_STEP_TITLE = re.compile(r"Step\b(?:\s*\d+)?\s*[:.)\-\u2013\u2014]\s*(?P<title>\S.*)\Z", re.IGNORECASE)
_BOLD_PART = re.compile(r"\s*(?:\*\*|__)(?P<name>[^*_]+?)\s*:?\s*(?:\*\*|__)\s*:?\s*\Z")
_STEP_ID_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_PARAM_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_INSTRUCTION_PARTS = {"instructions", "instruction"}
_CRITERIA_PARTS = {
    "completion criteria",
    "completion criterion",
    "acceptance criteria",
    "success criteria",
    "exit criteria",
    "done when",
    "definition of done",
}

_STRING_KEYS = ("description", "when_to_use", "updated", "timestamp", "stale_after")
_KEY_ALIASES = {
    "when-to-use": "when_to_use",
    "whenToUse": "when_to_use",
    "stale-after": "stale_after",
    "staleAfter": "stale_after",
}
_STATUSES = ("draft", "stable", "deprecated")


@dataclass(frozen=True)
class LegacyMarker:
    """What makes a file look legacy: the 1-based line of the first marker and a short reason."""

    line: int
    reason: str


@dataclass
class _Line:
    idx: int  # 0-based index into the whole file
    text: str
    in_fence: bool  # inside (or delimiting) a fenced code block
    level: int = 0  # heading level, 0 when not a heading
    heading: str = ""


@dataclass
class _Step:
    start: int  # index into body lines of the heading or orphan "Step ID:" line
    level: int  # heading level used to find the step's end (2 for an orphan Step ID line)
    title: str | None
    raw_id: str | None
    id_line: int | None
    end: int = 0  # exclusive
    step_id: str = ""
    content: list[_Line] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Splitting and scanning
# --------------------------------------------------------------------------------------------


def _split(text: str) -> tuple[list[str], str | None, int]:
    """(all lines, frontmatter YAML or None, index of first body line)."""
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[0].rstrip("\r") == "---":
        for i in range(1, len(lines)):
            if lines[i].rstrip("\r") == "---":
                return lines, "\n".join(lines[1:i]).replace("\r", ""), i + 1
    return lines, None, 0


def _scan(lines: list[str], start: int) -> list[_Line]:
    out: list[_Line] = []
    in_fence = False
    for idx in range(start, len(lines)):
        raw = lines[idx].rstrip("\r")
        if _FENCE.match(raw):
            in_fence = not in_fence
            out.append(_Line(idx, raw, True))
            continue
        line = _Line(idx, raw, in_fence)
        if not in_fence:
            m = _HEADING.match(raw)
            if m:
                line.level = len(m.group(1))
                line.heading = _CLOSING_HASHES.sub("", m.group(2).strip()).strip()
        out.append(line)
    return out


def _step_id_of(line: _Line) -> str | None:
    if line.in_fence or line.level:
        return None
    m = _STEP_ID_LINE.match(line.text)
    return m.group("id") if m else None


def _part_name(line: _Line) -> str | None:
    """'instructions' / 'criteria' when the line is a heading (or bold line) naming a step part."""
    if line.in_fence:
        return None
    if line.level:
        name = line.heading
    else:
        m = _BOLD_PART.match(line.text)
        if not m:
            return None
        name = m.group("name")
    key = re.sub(r"\s+", " ", name.strip().strip("*_").rstrip(":").strip()).lower()
    if key in _INSTRUCTION_PARTS:
        return "instructions"
    if key in _CRITERIA_PARTS:
        return "criteria"
    return None


def detect_legacy(text: str) -> LegacyMarker | None:
    """Say whether `text` is a legacy-format workflow, and what gives it away (None if it is not).

    A file whose frontmatter declares `steps:` is never legacy. Otherwise the markers are a
    `# Workflow: <name>` H1, `Step ID: <id>` lines, or `## Step: <title>` headings (outside code).
    """
    lines, fm, body_start = _split(text)
    if fm is not None and _STEPS_KEY.search(fm):
        return None
    first_id: int | None = None
    first_step_heading: int | None = None
    for line in _scan(lines, body_start):
        if line.level == 1 and _WORKFLOW_TITLE.match(line.heading):
            return LegacyMarker(line.idx + 1, f'"# Workflow:" H1 at line {line.idx + 1}')
        if first_id is None and _step_id_of(line) is not None:
            first_id = line.idx + 1
        if first_step_heading is None and line.level and _STEP_TITLE.match(line.heading):
            first_step_heading = line.idx + 1
    if first_id is not None:
        return LegacyMarker(first_id, f'"Step ID:" line at line {first_id} and no steps: list in the frontmatter')
    if first_step_heading is not None:
        return LegacyMarker(
            first_step_heading,
            f'"Step:" heading at line {first_step_heading} and no steps: list in the frontmatter',
        )
    return None


# --------------------------------------------------------------------------------------------
# Body conversion
# --------------------------------------------------------------------------------------------


def _find_steps(body: list[_Line]) -> list[_Step]:
    steps: list[_Step] = []
    id_positions = [i for i, ln in enumerate(body) if _step_id_of(ln) is not None]
    claimed: set[int] = set()
    if id_positions:
        for pos in id_positions:
            raw_id = _step_id_of(body[pos])
            heading_pos = None
            for back in range(pos - 1, -1, -1):
                if _step_id_of(body[back]) is not None:
                    break
                if body[back].level:
                    if _part_name(body[back]) is None and back not in claimed:
                        heading_pos = back
                    break
            if heading_pos is not None:
                claimed.add(heading_pos)
                head = body[heading_pos]
                m = _STEP_TITLE.match(head.heading)
                title = m.group("title").strip() if m else head.heading
                steps.append(_Step(heading_pos, head.level, title, raw_id, pos))
            else:
                steps.append(_Step(pos, 2, None, raw_id, pos))
    else:
        for i, ln in enumerate(body):
            m = _STEP_TITLE.match(ln.heading) if ln.level else None
            if m:
                steps.append(_Step(i, ln.level, m.group("title").strip(), None, None))
    steps.sort(key=lambda s: s.start)

    starts = [s.start for s in steps]
    for n, step in enumerate(steps):
        limit = starts[n + 1] if n + 1 < len(steps) else len(body)
        end = limit
        for i in range(step.start + 1, limit):
            if body[i].level and body[i].level <= step.level:
                end = i
                break
        step.end = end
        step.content = [body[i] for i in range(step.start + 1, end) if i != step.id_line]
    return steps


def _shift_heading(line: _Line, base: int, floor: int = 3) -> str:
    """Re-level a heading so it nests under `## <id>` (never H1/H2) and is never `### gate`."""
    level = min(6, max(floor, line.level - base + 2))
    text = line.heading
    if level == 3 and text == "gate":
        text = "Gate"
    return "#" * level + " " + text


def _trim(lines: list[str]) -> str:
    """Drop edge blank lines; close a code fence left open so it cannot swallow what follows."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    kept = lines[start:end]
    if sum(1 for ln in kept if _FENCE.match(ln)) % 2:
        kept.append("```")
    return "\n".join(kept)


def _split_parts(step: _Step) -> tuple[str, str]:
    """(instructions, criteria) text of one legacy step, headings re-levelled for the new layout."""
    parts: dict[str, list[str]] = {"instructions": [], "criteria": []}
    current = "instructions"
    part_level: int | None = None
    for line in step.content:
        name = _part_name(line)
        if name is not None:
            current = name
            part_level = line.level or step.level + 1
            continue
        if line.level:
            if part_level is not None and line.level <= part_level:
                current, part_level = "instructions", None
            parts[current].append(_shift_heading(line, step.level))
        else:
            parts[current].append(line.text)
    return _trim(parts["instructions"]), _trim(parts["criteria"])


def _prose(lines: list[_Line]) -> str:
    """Text outside steps, for the preamble: H1/H2 headings are demoted so they bind to nothing."""
    out: list[str] = []
    for line in lines:
        if not line.in_fence and not line.text.strip() and out and not out[-1].strip():
            continue  # removing the title line can leave a double blank; keep one
        if line.level and line.level <= 2:
            out.append("### " + line.heading)
        else:
            out.append(line.text)
    return _trim(out)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _sanitise_id(raw: str | None, title: str | None, n: int, used: set[str]) -> str:
    base = (raw or "").strip().strip("`'\"*").strip()
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-")
    if not base and title:
        base = _slug(title)
    if not base:
        base = f"step-{n}"
    if not _STEP_ID_OK.match(base):
        base = "step-" + base
    candidate, k = base, 2
    while candidate in used:
        candidate, k = f"{base}-{k}", k + 1
    used.add(candidate)
    return candidate


# --------------------------------------------------------------------------------------------
# Frontmatter conversion
# --------------------------------------------------------------------------------------------


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return None


def _param_schema(value: Any) -> dict[str, Any]:
    """A legacy param entry (usually a one-line description) as a current-format schema."""
    if value is None:
        return {"type": "string"}
    if isinstance(value, dict):
        kept = {k: v for k, v in value.items() if isinstance(k, str)}
        bad_roots = {p.keyword for p in check_schema_definition(kept) if not p.path}
        kept = {k: v for k, v in kept.items() if k not in bad_roots}
        kept.setdefault("type", "string")
        if not check_schema_definition(kept):
            return kept
        desc = _as_text(value.get("description"))
        return {"type": "string", "description": desc} if desc else {"type": "string"}
    text = _as_text(value)
    if text is None or not text.strip():
        return {"type": "string"}
    return {"type": "string", "description": text.strip()}


def _param_name(raw: Any, used: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", str(raw).strip()) or "param"
    if not _PARAM_NAME_OK.match(name):
        name = "_" + name
    candidate, k = name, 2
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    used.add(candidate)
    return candidate


def _convert_params(value: Any) -> dict[str, Any]:
    entries: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and "name" in item:
                rest = {k: v for k, v in item.items() if k != "name"}
                entries.append(
                    (item["name"], rest if len(rest) != 1 or "description" not in rest else rest["description"])
                )
            elif isinstance(item, dict) and len(item) == 1:
                entries.extend(item.items())
            elif _as_text(item):
                entries.append((item, None))
    used: set[str] = set()
    return {_param_name(name, used): _param_schema(schema) for name, schema in entries}


def _convert_frontmatter(fm: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(current-format envelope + params, legacy title if the frontmatter named one)."""
    out: dict[str, Any] = {"type": "workflow"}
    parked: dict[str, Any] = {}
    title: str | None = None
    for raw_key, value in fm.items():
        key = _KEY_ALIASES.get(raw_key, raw_key)
        if key == "params":
            params = _convert_params(value)
            if params:
                out["params"] = params
            continue
        if key in ("name", "title") and title is None and _as_text(value):
            title = _as_text(value)
        if key == "type":
            if value != "workflow":
                parked["type"] = value
            continue
        if key in _STRING_KEYS:
            text = _as_text(value)
            if text is not None and key not in out:
                out[key] = text
                continue
        elif key == "tags":
            items = value.split(",") if isinstance(value, str) else value
            if isinstance(items, list):
                tags = [t.strip() for t in (_as_text(i) for i in items) if t and t.strip()]
                if tags:
                    out["tags"] = tags
                continue
        elif key == "status":
            if value in _STATUSES:
                out["status"] = value
                continue
        elif key in ENVELOPE_KEYS and key not in out:
            out[key] = value
            continue
        parked[str(raw_key)] = value
    if parked:
        prov = out.get("provenance")
        if isinstance(prov, dict):
            prov = dict(prov)
        elif prov is None:
            prov = {}
        else:
            prov = {"legacy_provenance": prov}
        prov["legacy_frontmatter"] = parked
        out["provenance"] = prov
    # Keep `params` after the envelope keys, as in hand-written files.
    if "params" in out:
        out["params"] = out.pop("params")
    return out, title


class _Dumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, Yaml12Resolver):
    """Block YAML whose plain scalars read back identically under YAML 1.2 (`yes`, dates stay plain)."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        yaml.emitter.Emitter.__init__(
            self, stream, canonical=None, indent=2, width=4096, allow_unicode=True, line_break=None
        )
        yaml.serializer.Serializer.__init__(
            self, encoding=None, explicit_start=None, explicit_end=None, version=None, tags=None
        )
        yaml.representer.SafeRepresenter.__init__(self, default_style=None, default_flow_style=False, sort_keys=False)
        Yaml12Resolver.__init__(self)

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)  # indent list items under their key


def _represent_list(dumper: _Dumper, data: list) -> yaml.Node:
    scalars = all(isinstance(v, (str, int, float, bool)) or v is None for v in data)
    short = sum(len(str(v)) for v in data) < 60
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=scalars and short)


_Dumper.add_representer(list, _represent_list)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def upgrade_legacy(text: str) -> str:
    """Convert a legacy-format workflow to the current format (see module docstring).

    Raises `UsageError` with code `UPGRADE_FAILED` when the text already declares `steps:`, its
    frontmatter is not valid YAML, or no steps can be recognised.
    """
    lines, fm_text, body_start = _split(text)
    if fm_text is not None and _STEPS_KEY.search(fm_text):
        raise UsageError(
            "Nothing to upgrade: the frontmatter already declares steps: (current format)",
            code=Code.UPGRADE_FAILED,
        )
    fm: Any = {}
    if fm_text is not None:
        # The same strict reader lint uses: what it refuses (recursive aliases, duplicate
        # keys, odd tags) cannot be carried into a file that must lint clean.
        doc = load_yaml(fm_text)
        if doc.problems:
            raise UsageError(
                f"Cannot upgrade: the frontmatter is not valid YAML ({doc.problems[0].message})",
                code=Code.UPGRADE_FAILED,
            )
        fm = doc.value
        if fm is None:
            fm = {}
        if not isinstance(fm, dict):
            raise UsageError("Cannot upgrade: the frontmatter must be a YAML mapping", code=Code.UPGRADE_FAILED)

    body = _scan(lines, body_start)
    steps = _find_steps(body)
    if not steps:
        raise UsageError(
            'Cannot upgrade: no recognisable steps (expected headings followed by "Step ID: <id>" '
            'lines, or "## Step: <title>" headings)',
            code=Code.UPGRADE_FAILED,
        )

    envelope, fm_title = _convert_frontmatter(fm)

    # Prose outside steps: the intro (minus the title H1), and anything between or after steps.
    title: str | None = None
    outside: list[list[_Line]] = []
    intro = body[: steps[0].start]
    for i, line in enumerate(intro):
        if line.level == 1:
            m = _WORKFLOW_TITLE.match(line.heading)
            title = (m.group(1).strip() if m else line.heading) or None
            intro = intro[:i] + intro[i + 1 :]
            break
    outside.append(intro)
    for n, step in enumerate(steps):
        nxt = steps[n + 1].start if n + 1 < len(steps) else len(body)
        gap = body[step.end : nxt]
        if any(ln.text.strip() and not ln.level for ln in gap):
            outside.append(gap)
    preamble = "\n\n".join(p for p in (_prose(seg) for seg in outside) if p)
    title = title or fm_title

    used: set[str] = set()
    sections: list[str] = []
    for n, step in enumerate(steps, start=1):
        step.step_id = _sanitise_id(step.raw_id, step.title, n, used)
        instructions, criteria = _split_parts(step)
        lead = f"**{step.title}**" if step.title else ""
        if instructions:
            instructions = f"{lead}\n\n{instructions}" if lead else instructions
        elif lead:
            instructions = lead
        elif criteria:
            instructions = "Do the work this step's completion criteria describe."
        else:
            raise UsageError(f'Cannot upgrade: step "{step.step_id}" has no instructions', code=Code.UPGRADE_FAILED)
        section = f"## {step.step_id}\n\n{instructions}\n"
        if criteria:
            section += f"\n### gate\n\n{criteria}\n"
        sections.append(section)

    envelope["steps"] = [{"id": s.step_id} for s in steps]
    fm_out = yaml.dump(envelope, Dumper=_Dumper)

    parts = [f"---\n{fm_out}---\n"]
    if title:
        parts.append(f"# {title}\n")
    if preamble:
        parts.append(preamble + "\n")
    parts.extend(sections)
    return "\n".join(parts)
