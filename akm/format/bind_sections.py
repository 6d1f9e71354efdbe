"""Bind the markdown body to the steps: each `## <step-id>` section holds that step's instructions.

A level-2 heading is the only thing that ties prose to a step, so it must match
a declared id exactly, appear once, and every unit or map step must have one
(a route step dispatches nothing and needs none). Text that would silently
belong to no step, after a stray `# heading`, is an error rather than lost.
"""

from __future__ import annotations

from typing import Any

from akm.format.field_reader import FieldReader, suggest, utf8_len
from akm.format.grammar import MAX_TEXT_BYTES
from akm.format.markdown import Body
from akm.format.model import TextBlock
from akm.format.read_steps import StepDraft

# Step index -> (instructions, gate rubric, line of its `## id` heading).
BoundSections = dict[int, tuple[TextBlock | None, TextBlock | None, int]]


def text_block(block: Any) -> TextBlock | None:
    """The document model's copy of a scanned markdown block (None stays None)."""
    if block is None:
        return None
    return TextBlock(text=block.text, start_line=block.start_line, end_line=block.end_line)


def bind_sections(ctx: FieldReader, drafts: list[StepDraft], body: Body, invalid_ids: set[str]) -> BoundSections:
    """Match `## id` sections to steps; return {step index: (instructions, rubric, H2 line)}."""
    by_id = {d.id: d for d in drafts if d.id is not None}
    bound: dict[str, Any] = {}
    result: BoundSections = {}
    for section in body.sections:
        head = section.heading
        if head.text not in by_id:
            if head.text in invalid_ids:
                hint = f'"{head.text}" is not a valid step id (see the error at its step); fix the id and this heading together'
            else:
                hint = f"{suggest(head.text, list(by_id))}use ### or deeper for sub-headings inside a step"
            ctx.error(
                "unexpected_heading",
                f'Unexpected level-2 heading "## {head.text}": a ## heading must exactly match a declared step id',
                line=head.line,
                hint=hint,
            )
            continue
        if head.text in bound:
            ctx.error(
                "duplicate_section",
                f'Step "{head.text}" has more than one "## {head.text}" section (the first is on line {bound[head.text].heading.line})',
                line=head.line,
                hint="merge the two sections",
            )
            continue
        bound[head.text] = section
        for extra in section.extra_gate_lines:
            ctx.error(
                "duplicate_gate",
                f'Step "{head.text}" has more than one "### gate" rubric; only one is allowed per step',
                line=extra,
                hint="merge the criteria under the first ### gate heading",
            )
        d = by_id[head.text]
        instr = text_block(section.instructions)
        rubric = text_block(section.rubric)
        for block, name in ((instr, "instructions"), (rubric, "gate rubric")):
            if block is not None and utf8_len(block.text) > MAX_TEXT_BYTES:
                ctx.error(
                    "too_large",
                    f'Step "{d.id}" {name} are {utf8_len(block.text)} bytes; at most {MAX_TEXT_BYTES} are allowed',
                    line=block.start_line,
                    hint="move reference material into files the step reads",
                )
        result[d.index] = (instr, rubric, head.line)
        if d.kind != "route" and instr is None:
            only_gate = " (it holds only a ### gate rubric)" if section.gate_line is not None else ""
            ctx.error(
                "empty_section",
                f'Step "{d.id}" section "## {d.id}" is empty{only_gate}; a {d.kind} step needs instruction text',
                line=head.line,
                hint="write what the step should do under the heading, before any ### gate",
            )
    for d in drafts:
        if d.id is not None and d.kind != "route" and d.id not in bound:
            ctx.error(
                "missing_section",
                f'Step "{d.id}" must have a "## {d.id}" body section with its instructions',
                line=d.line,
                hint=f"add a `## {d.id}` heading to the body followed by what the step should do",
            )
    for stray in body.stray_h1:
        ctx.error(
            "text_after_h1",
            f'Text after the level-1 heading "# {stray.text}" belongs to no step and would be ignored',
            line=stray.line,
            hint="make it a ## <step-id> section, demote the heading to ###, or move the text into the preamble",
        )
    return result
