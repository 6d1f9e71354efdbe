"""Legacy workflow detection and conversion (corpus/legacy -> current format)."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from akm.errors import UsageError
from akm.format.upgrade import LegacyMarker, detect_legacy, upgrade_legacy
from akm.format.yaml12 import Yaml12Loader
from tests.helpers import CORPUS, corpus_files, needs_shared

LEGACY = corpus_files("legacy")
CURRENT = corpus_files("current")


def _split(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    fm, body = text[4:].split("\n---\n", 1)
    return yaml.load(fm, Loader=Yaml12Loader), body


def _sections(body: str) -> dict[str, str]:
    """`## id` -> section text, skipping fenced code (same rule as the body scanner)."""
    out: dict[str, list[str]] = {}
    current = None
    in_fence = False
    for line in body.split("\n"):
        if re.match(r"\s*(```|~~~)", line):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,2}\s", line):
            m = re.match(r"##\s+(.+)", line)
            current = m.group(1).strip() if m else None
            if current is not None:
                assert current not in out, f"duplicate section {current}"
                out[current] = []
            continue
        if current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _split_gate(section: str) -> tuple[str, str | None]:
    parts = re.split(r"^### gate$", section, flags=re.MULTILINE)
    assert len(parts) <= 2
    return parts[0].strip(), (parts[1].strip() if len(parts) == 2 else None)


@needs_shared()
def test_corpus_present():
    assert len(LEGACY) == 5 and len(CURRENT) >= 10


@needs_shared()
@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.name)
def test_legacy_corpus_is_detected(path):
    text = path.read_text()
    marker = detect_legacy(text)
    assert isinstance(marker, LegacyMarker)
    h1_line = next(i for i, ln in enumerate(text.split("\n"), 1) if ln.startswith("# Workflow:"))
    assert marker.line == h1_line
    assert marker.reason == f'"# Workflow:" H1 at line {h1_line}'


@needs_shared()
@pytest.mark.parametrize("path", CURRENT, ids=lambda p: p.name)
def test_current_corpus_is_not_legacy(path):
    assert detect_legacy(path.read_text()) is None


@needs_shared()
@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.name)
def test_legacy_corpus_upgrades(path):
    text = path.read_text()
    out = upgrade_legacy(text)
    fm, body = _split(out)

    step_ids = re.findall(r"^Step ID:\s*(\S+)\s*$", text, flags=re.MULTILINE)
    criteria_count = len(re.findall(r"^### Completion Criteria\s*$", text, flags=re.MULTILINE))
    assert step_ids and criteria_count == len(step_ids)
    assert fm["steps"] == [{"id": i} for i in step_ids]
    assert fm["type"] == "workflow"

    # Envelope keys survive; legacy param descriptions become typed param schemas.
    src_fm, _ = _split(text)
    assert fm["description"] == src_fm["description"]
    assert fm["tags"] == src_fm["tags"]
    assert set(fm["params"]) == set(src_fm["params"])
    for name, desc in src_fm["params"].items():
        assert fm["params"][name] == {"type": "string", "description": desc}

    sections = _sections(body)
    assert list(sections) == step_ids
    for sid in step_ids:
        instructions, gate = _split_gate(sections[sid])
        assert instructions, sid
        assert gate and gate.startswith("- "), sid
        assert "Instructions" not in instructions.split("\n")[0]
        assert "### Completion Criteria" not in sections[sid]

    title = re.search(r"^# Workflow:\s*(.+)$", text, flags=re.MULTILINE).group(1)
    assert f"\n# {title}\n" in "\n" + body
    assert "Step ID:" not in out
    assert detect_legacy(out) is None


@needs_shared()
def test_upgrade_keeps_step_text_and_criteria_verbatim():
    text = (CORPUS / "legacy" / "stash-onboard-agent.md").read_text()
    _, body = _split(upgrade_legacy(text))
    instructions, gate = _split_gate(_sections(body)["load-core-assets"])
    assert instructions.startswith("**Load the official onboarding stash**\n\nInstall this repo")
    assert "```bash\nakm add github:itlackey/akm-stash\nakm index\n" in instructions
    assert gate == "- `skill:akm-quickstart` is retrievable.\n- `knowledge:akm-cli-reference` is retrievable."


@needs_shared()
def test_intro_becomes_preamble():
    text = (CORPUS / "legacy" / "stash-dream-memory-consolidation.md").read_text()
    _, body = _split(upgrade_legacy(text))
    preamble = body.split("\n## ", 1)[0]
    assert preamble.strip().startswith("# Dream memory consolidation")
    assert "operator-facing wrapper around `skills/akm-dream`" in preamble


@needs_shared()
@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.name)
def test_upgraded_corpus_lints_clean(path):
    from akm.format.lint import lint_text

    original = lint_text(path.read_text(), str(path))
    assert not original.ok  # the legacy file itself is refused...
    report = lint_text(upgrade_legacy(path.read_text()), str(path))
    assert report.errors == [], [e.message for e in report.errors]  # ...its upgrade is clean


# ------------------------------------------------------------------ synthetic cases

SYNTHETIC = """\
---
description: Synthetic legacy
tags: alpha, beta
when-to-use: When testing
updated: 2026-01-01
version: 3
name: Ignored Name
status: experimental
params:
  my-param: The thing
  on: A YAML-1.1 trap
  count:
    type: integer
    required: true
    description: How many
  plain:
---

Intro before the title.

# Workflow: Synthetic

Overview text.

## Overview heading

More overview.

## Step 1: First thing
Step ID: `1st.step`

Lead text before parts.

### Instructions
Do the first thing.

#### Detail
Nested detail.

### gate
This was a sub-heading named gate.

### Completion Criteria
- first done

### Notes
A note after the criteria.

## Step: Second
**Step ID:** second

**Instructions:**
Second body.

```md
## Step: Not a step
Step ID: fake
# Workflow: fake
```

**Completion Criteria:**
- second done

## Step: Third
Step ID: second

### Completion Criteria
- third done

## Appendix

Closing remarks.
"""


def test_synthetic_upgrade():
    marker = detect_legacy(SYNTHETIC)
    assert marker is not None and marker.line == SYNTHETIC.split("\n").index("# Workflow: Synthetic") + 1 == 21
    out = upgrade_legacy(SYNTHETIC)
    fm, body = _split(out)

    assert fm["steps"] == [{"id": "step-1st-step"}, {"id": "second"}, {"id": "second-2"}]
    assert fm["tags"] == ["alpha", "beta"]
    assert fm["when_to_use"] == "When testing"
    assert fm["updated"] == "2026-01-01"
    assert fm["params"] == {
        "my_param": {"type": "string", "description": "The thing"},
        "on": {"type": "string", "description": "A YAML-1.1 trap"},
        "count": {"type": "integer", "description": "How many"},
        "plain": {"type": "string"},
    }
    assert fm["provenance"] == {"legacy_frontmatter": {"version": 3, "name": "Ignored Name", "status": "experimental"}}
    assert "updated: 2026-01-01\n" in out  # stays a plain YAML 1.2 string

    sections = _sections(body)
    assert list(sections) == ["step-1st-step", "second", "second-2"]

    first, gate1 = _split_gate(sections["step-1st-step"])
    assert first.startswith("**First thing**\n\nLead text before parts.\n\nDo the first thing.")
    assert "#### Detail\nNested detail." in first
    assert "### Gate\nThis was a sub-heading named gate." in first  # renamed: not a rubric
    assert "### Notes\nA note after the criteria." in first
    assert gate1 == "- first done"

    second, gate2 = _split_gate(sections["second"])
    assert "Second body." in second
    assert "## Step: Not a step\nStep ID: fake\n# Workflow: fake" in second  # fenced code untouched
    assert gate2 == "- second done"

    third, gate3 = _split_gate(sections["second-2"])
    assert third == "**Third**" and gate3 == "- third done"

    preamble = body.split("\n## ", 1)[0]
    assert preamble.startswith("\n# Synthetic\n") or preamble.startswith("# Synthetic\n")
    for fragment in (
        "Intro before the title.",
        "Overview text.",
        "### Overview heading",
        "### Appendix",
        "Closing remarks.",
    ):
        assert fragment in preamble
    assert detect_legacy(out) is None

    from akm.format.lint import lint_text

    report = lint_text(out, "synthetic.md")
    assert report.errors == [], [e.message for e in report.errors]


def test_step_headings_without_step_ids():
    text = "---\ndescription: d\n---\n\n# Flow\n\n## Step 1: Build It\nBuild.\n\n## Step 2: Ship it!\n### Completion Criteria\n- shipped\n"
    marker = detect_legacy(text)
    assert marker == LegacyMarker(7, '"Step:" heading at line 7 and no steps: list in the frontmatter')
    fm, body = _split(upgrade_legacy(text))
    assert fm["steps"] == [{"id": "build-it"}, {"id": "ship-it"}]
    assert _split_gate(_sections(body)["ship-it"]) == ("**Ship it!**", "- shipped")


def test_orphan_step_id_lines_and_no_frontmatter():
    text = "Step ID: alpha\nDo alpha.\n\nStep ID: beta\r\nDo beta.\r\n"
    marker = detect_legacy(text)
    assert marker == LegacyMarker(1, '"Step ID:" line at line 1 and no steps: list in the frontmatter')
    fm, body = _split(upgrade_legacy(text))
    assert fm == {"type": "workflow", "steps": [{"id": "alpha"}, {"id": "beta"}]}
    assert _sections(body) == {"alpha": "\nDo alpha.\n", "beta": "\nDo beta.\n"}


def test_not_legacy_cases():
    assert detect_legacy("---\nsteps:\n  - id: a\n---\n\n# Workflow: x\n\n## a\n\nDo.\n") is None
    assert detect_legacy("---\ndescription: d\n---\n\n```\n# Workflow: x\nStep ID: y\n```\n") is None
    assert detect_legacy("") is None
    assert detect_legacy("# Just a doc\n\nStep IDs are discussed here: none.\n") is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("---\nsteps:\n  - id: a\n---\n\n## a\n\nDo.\n", "already declares steps:"),
        ("---\ndescription: d\n---\n\n# Workflow: Empty\n\nNo steps here.\n", "no recognisable steps"),
        ("---\ndescription: [unclosed\n---\n\nStep ID: a\n", "not valid YAML"),
        ("---\n- a list\n---\n\nStep ID: a\n", "must be a YAML mapping"),
        ("---\na: 1\na: 2\n---\n\nStep ID: a\n", "not valid YAML"),
    ],
)
def test_upgrade_failures(text, fragment):
    with pytest.raises(UsageError) as info:
        upgrade_legacy(text)
    assert info.value.code == "UPGRADE_FAILED"
    assert fragment in info.value.message


_legacy_bits = st.sampled_from(
    [
        "---",
        "description: d",
        "params:",
        "  a: b",
        "  - x",
        "tags: [a",
        "on: yes",
        "x: &a [*a]",
        "# Workflow: W",
        "## Step: S",
        "Step ID: s",
        "Step ID:",
        "**Step ID:** t",
        "### Instructions",
        "### Completion Criteria",
        "- done",
        "```",
        "~~~",
        "### gate",
        "# H1",
        "text",
        "",
        "  ",
        "\r",
        "## H2",
        "#### deep",
        "# Step: top",
        "Step ID: 9.x y",
        "  b-c: 3",
        "---",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_legacy_bits, max_size=25))
def test_detect_and_upgrade_are_total(parts):
    text = "\n".join(parts)
    detect_legacy(text)  # never raises
    try:
        out = upgrade_legacy(text)
    except UsageError as exc:
        assert exc.code == "UPGRADE_FAILED"
    else:
        fm, _ = _split(out)
        assert fm["steps"] and detect_legacy(out) is None
        from akm.format.lint import lint_text

        report = lint_text(out, "generated.md")
        assert report.errors == [], [e.message for e in report.errors]
