"""Parse and fully check one workflow file: text in, document or diagnostics out.

This is both the parser and the lint engine (spec/decisions.md D10: lint is complete).
Everything that would fail a run for a reason visible in the file is reported
here, including what the upstream tool only found while compiling or freezing:
references to later/unknown steps and undeclared params, duplicate list
entries, out-of-range bounds, unsupported JSON-Schema keywords, text lost after
a stray `# heading`.

`parse_workflow` never raises. All checks run and accumulate (an error in one
step never hides errors in another); only a container failure (size, missing
frontmatter, YAML syntax, legacy format) stops early. A `WorkflowDocument` is
returned only when there are no errors, so the plan compiler can trust it.

This module checks the container and runs the phases in order; the work is in
akm.format.read_envelope / read_schemas / read_unit / read_exec / read_steps
(the frontmatter), bind_sections (the body) and cross_step_checks (rules that
need the whole step list). The limits and key lists live in akm.format.grammar
and are re-exported here, where callers have always imported them from.
"""

from __future__ import annotations

import re

from akm.format.bind_sections import BoundSections, bind_sections, text_block
from akm.format.cross_step_checks import check_references, check_routes, warn_untyped
from akm.format.diagnostics import Diagnostic, fold_repeats, sort_and_cap
from akm.format.field_reader import FieldReader, describe, utf8_len
from akm.format.grammar import MAX_SOURCE_BYTES, TOP_LEVEL_KEYS
from akm.format.markdown import Body, scan_body, split_frontmatter, split_lines
from akm.format.model import GateSpec, Step, WorkflowDocument
from akm.format.read_envelope import read_budget, read_envelope
from akm.format.read_schemas import read_params
from akm.format.read_steps import StepDraft, read_steps
from akm.format.read_unit import read_defaults
from akm.format.yaml12 import YamlProblem, load_yaml
from akm.views import View


class ParseResult(View):
    """`document` is set only when `errors` is empty. Warnings never block."""

    document: WorkflowDocument | None = None
    errors: list[Diagnostic]
    warnings: list[Diagnostic]

    @property
    def ok(self) -> bool:
        return not self.errors


def _quote(path: str) -> str:
    import shlex  # only a legacy file's hint needs it

    return shlex.quote(path)


_STEPS_KEY = re.compile(r"^steps\s*:", re.MULTILINE)


def _frontmatter_declares_steps(text: str) -> bool:
    """`detect_legacy`'s first rule, cheaply: the `---` frontmatter has a `steps:` key (so it is not legacy)."""
    lines = text.replace("\r\n", "\n").split("\n", 1)
    if not lines or lines[0].rstrip("\r") != "---" or len(lines) < 2:
        return False
    rest = lines[1]
    end = 0
    for line in rest.split("\n"):
        if line.rstrip("\r") == "---":
            return _STEPS_KEY.search(rest[:end].replace("\r", "")) is not None
        end += len(line) + 1
    return False


def parse_workflow(text: str, path: str) -> ParseResult:
    """Parse and check one workflow file. Never raises: every problem is a diagnostic."""
    try:
        return _parse(text, path)
    except Exception as exc:  # a bug in akm, not in the file; still never crash lint
        return ParseResult(
            errors=[
                Diagnostic(
                    code="internal_error",
                    message=f"the workflow parser failed unexpectedly: {type(exc).__name__}: {exc}",
                    line=1,
                    hint="this is a bug in akm; please report it with the file",
                )
            ],
            warnings=[],
        )


def _stop(ctx: FieldReader) -> ParseResult:
    return ParseResult(errors=sort_and_cap(ctx.errors), warnings=fold_repeats(ctx.warnings))


def _parse(text: str, path: str) -> ParseResult:
    """The container checks, each of which stops early; then the frontmatter and body phases."""
    if not isinstance(text, str):
        raise TypeError("workflow text must be a str")
    ctx = FieldReader()
    size = utf8_len(text)
    if size > MAX_SOURCE_BYTES:
        ctx.error(
            "file_too_large",
            f"the file is {size} bytes; a workflow may be at most 1 MiB ({MAX_SOURCE_BYTES} bytes)",
            line=1,
            hint="move long reference material into separate files the steps read",
        )
        return _stop(ctx)

    legacy = None
    if not _frontmatter_declares_steps(text):  # a current file is never legacy: spare it the detector's import
        from akm.format.upgrade import detect_legacy

        legacy = detect_legacy(text)
    if legacy is not None:
        reason = re.sub(r"\s*at line \d+", "", legacy.reason or "") or "legacy markers in the body"
        ctx.error(
            "legacy_format",
            f"this file uses the retired workflow format ({reason}); it cannot be run as is",
            line=max(1, legacy.line),
            hint=f"convert it with `akm workflow upgrade {_quote(path)} --write`",
        )
        return _stop(ctx)

    lines = split_lines(text)
    fm = split_frontmatter(lines)
    if fm is None:
        hint = "start the file with a line `---`, the YAML (with a `steps:` list), then a line `---`"
        if text.startswith("\ufeff"):
            hint = "the file starts with a byte-order mark (U+FEFF); save it as UTF-8 without BOM"
        ctx.error(
            "missing_frontmatter",
            "the file must start with a YAML frontmatter block (`---` ... `---`) declaring a non-empty `steps` list",
            line=1,
            hint=hint,
        )
        return _stop(ctx)

    ydoc = load_yaml(fm.yaml_text)
    ctx = FieldReader(ydoc, fm.close_line)
    if ydoc.problems:
        for p in ydoc.problems:
            ctx.errors.append(_yaml_diagnostic(p, fm.close_line))
        return _stop(ctx)

    root = ydoc.value if ydoc.value is not None else {}
    if not isinstance(root, dict):
        ctx.error(
            "frontmatter_not_mapping",
            f"the frontmatter must be a YAML mapping of keys, not {describe(root)}",
            line=2,
            hint="write `key: value` lines, including a `steps:` list",
        )
        return _stop(ctx)

    return _check_workflow(ctx, root, lines, fm.body_start_line, path)


def _yaml_diagnostic(p: YamlProblem, close_line: int) -> Diagnostic:
    """A YAML load problem as a diagnostic on its file line, with a hint for its kind."""
    # YAML text line 1 is file line 2.
    line = min(p.line + 1, close_line)
    if p.code == "duplicate_key":
        message = p.message.split(" (first")[0] + (
            f" (first defined on line {p.first_line + 1})" if p.first_line else ""
        )
        hint = "each key may appear once per mapping; merge the entries or rename one"
    elif p.code == "yaml_unsupported_tag":
        message = p.message
        hint = "remove the tag; plain values are typed by YAML 1.2 core rules"
    elif p.code == "yaml_alias_expansion":
        message = f"YAML {p.message}"
        hint = "write the values out instead of using anchors and aliases"
    else:
        message = f"invalid YAML: {p.message}"
        hint = (
            "check indentation (spaces, not tabs) and quoting near this line; quote values "
            "that contain ': ' or start with a special character"
        )
    return Diagnostic(code=p.code, message=message, line=line, column=p.column, hint=hint)


def _check_workflow(ctx: FieldReader, root: dict, lines: list[str], body_start: int, path: str) -> ParseResult:
    """Run every phase (each reports on `ctx` and never stops the others), then build the document."""
    ctx.check_keys(root, (), TOP_LEVEL_KEYS, "the frontmatter")
    envelope, doc_fields = read_envelope(ctx, root)
    params = read_params(ctx, root)
    defaults = read_defaults(ctx, root)
    budget = read_budget(ctx, root)
    steps = read_steps(ctx, root)
    check_routes(ctx, steps.drafts)
    body = scan_body(lines, body_start)
    sections = bind_sections(ctx, steps.drafts, body, steps.invalid_ids)
    params_declared = "params" in root
    check_references(ctx, steps.drafts, steps.refs, params, params_declared, root)
    warn_untyped(ctx, steps.drafts)

    errors = sort_and_cap(ctx.errors)
    warnings = fold_repeats(ctx.warnings)
    if errors:
        return ParseResult(errors=errors, warnings=warnings)
    document = WorkflowDocument(
        path=path,
        title=_title(body),
        envelope=envelope,
        params=params,
        params_declared=params_declared,
        defaults=defaults,
        budget=budget,
        steps=[_step(d, sections) for d in steps.drafts],
        preamble=text_block(body.preamble),
        line_count=len(lines),
        **doc_fields,
    )
    return ParseResult(document=document, errors=[], warnings=warnings)


def _step(d: StepDraft, sections: BoundSections) -> Step:
    instr, rubric, section_line = sections.get(d.index, (None, None, None))
    # A `### gate` rubric alone makes a gate (with the default loop bound).
    gate = d.gate if d.has_gate else (GateSpec() if rubric is not None else None)
    return Step(
        id=d.id or "",
        sequence_index=d.index,
        line=d.line,
        end_line=d.end_line,
        kind=d.kind,  # type: ignore[arg-type]
        unit=d.unit,
        map=d.map,
        route=d.route,
        inputs=d.inputs,
        output=d.output,
        gate=gate,
        instructions=instr,
        gate_rubric=rubric,
        section_line=section_line,
    )


def _title(body: Body) -> str | None:
    """The first `# heading` before any `## step` section, if there is one."""
    first_h2 = next((h.line for h in body.headings if h.level == 2), None)
    title = next(
        (h.text for h in body.headings if h.level == 1 and (first_h2 is None or h.line < first_h2)),
        None,
    )
    return title or None
