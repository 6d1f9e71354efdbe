"""Diagnostics: what lint and the parser report, and the table of stable codes.

A code is part of our public contract (agents match on it), so every code used
anywhere must be listed in `CODES` with a one-line meaning; spec/workflow-format.md
("Lint codes") documents each with an example, and tests/test_lint_rules.py has
one failing file per code.
"""

from __future__ import annotations

from typing import Any

from akm.views import View

MAX_REPORTED_ERRORS = 50
# Warnings of one code listed one by one before the rest are folded into one entry.
MAX_REPEATED_WARNINGS = 3


class Diagnostic(View):
    """One problem in a workflow file. `line` is a 1-based file line; `column` is 1-based."""

    code: str
    message: str
    line: int
    column: int | None = None
    hint: str | None = None
    # Set on a diagnostic that stands for several folded repeats (see `fold_repeats`).
    count: int | None = None

    def _dump(self, camel: bool) -> dict[str, Any]:
        # The JSON contract omits column/hint/count instead of writing null.
        data = super()._dump(camel)
        for key in ("column", "hint", "count"):
            if data[key] is None:
                del data[key]
        return data


# code -> what it means (errors unless listed in WARNING_CODES)
CODES: dict[str, str] = {
    # file and frontmatter container
    "unreadable_file": "the path does not exist, is not a readable file, or is not UTF-8",
    "file_too_large": "the file is larger than 1 MiB",
    "legacy_format": "the file uses the retired `# Workflow:` / `Step ID:` format",
    "missing_frontmatter": "the file does not start with a `---` YAML frontmatter block",
    "yaml_syntax": "the frontmatter is not valid YAML",
    "duplicate_key": "a YAML mapping repeats a key",
    "yaml_alias_expansion": "YAML aliases are recursive or expand too much",
    "yaml_unsupported_tag": "a YAML tag other than the core-schema ones (!!str, !!int, ...)",
    "frontmatter_not_mapping": "the frontmatter is a list or a scalar instead of a mapping",
    # generic shape errors (the message names the key)
    "unknown_key": "a key that is not allowed at this place",
    "missing_key": "a required key is absent",
    "invalid_type": "a value has the wrong YAML type",
    "invalid_value": "a value has the right type but is not allowed",
    "out_of_range": "a number is outside its allowed range",
    "too_many_entries": "a list or mapping has more entries than allowed",
    "too_large": "a schema, text block or value exceeds its size limit",
    "duplicate_entry": "a list that must hold unique entries repeats one",
    # envelope
    "invalid_xref": "an `xrefs` entry is not a canonical asset ref",
    # params
    "invalid_param_name": "a param name does not match [A-Za-z_][A-Za-z0-9_]*",
    "param_default_invalid": "a param's `default:` does not validate against the param's own schema",
    # steps
    "steps_required": "`steps` is missing, not a list, or empty",
    "invalid_step_id": "a step id is missing or does not match [A-Za-z_][A-Za-z0-9_-]*",
    "duplicate_step_id": "two steps share an id",
    "conflicting_step_kind": "a step mixes keys of different kinds (map/route/unit/inputs)",
    # unit bag
    "invalid_duration": "a timeout is not a positive duration or `none`",
    "invalid_retry_reason": "`retry.on` names a failure reason that cannot be retried",
    "credential_in_llm": "`llm.extra_params` carries a credential-like key",
    "protected_llm_param": "`llm.extra_params` sets a parameter akm controls",
    "exec_invalid_command": "`exec.command` is not a non-empty argv list of strings",
    "exec_cwd_not_relative": "`exec.cwd` is absolute, home-relative or escapes with `..`",
    "exec_invalid_env_name": "an `exec.pass_env` entry is not an environment variable name",
    "exec_engine_conflict": "an exec unit also names `engine`, `model` or `llm`",
    "invalid_env_ref": "an `env` entry is not of the form env/<name>",
    # JSON Schema
    "schema_unsupported_keyword": "a JSON-Schema keyword outside the supported subset",
    "schema_malformed": "a JSON-Schema keyword with an invalid value",
    # references
    "invalid_reference": "a reference does not follow the reference grammar",
    "unknown_step_reference": "a reference names a step that does not exist",
    "forward_reference": "a reference names the same or a later step",
    "param_as_input": "`inputs` lists a param (params are attached to every unit already)",
    "unknown_param_reference": "a reference names a param that is not declared",
    "over_not_array": "`map.over` points at a value whose schema says it is not an array",
    # route
    "route_target_unknown": "a route branch or default names an unknown step",
    "route_target_self": "a route step routes to itself",
    "route_backward": "a route step routes to an earlier step",
    "duplicate_route_match": "two `when` branches have the same match value",
    "empty_route_match": "a `when` branch matches the empty string",
    # body
    "unexpected_heading": "a `## heading` that is not a declared step id",
    "duplicate_section": "two `## <id>` sections for the same step",
    "missing_section": "a unit or map step has no `## <id>` section",
    "empty_section": "a unit or map step's section has no instruction text",
    "duplicate_gate": "a section has more than one `### gate` rubric",
    "text_after_h1": "text after a `# heading` inside the body belongs to no step",
    # report plumbing
    "too_many_errors": "more than 50 errors; the rest are counted, not listed",
    "internal_error": "the parser failed unexpectedly (a bug in akm; please report it)",
    # warnings
    "missing_output_schema": "warning: a unit or map step declares no step `output:` schema",
    "undeclared_output_field": "warning: `map.over` or `route.input` reads a field the upstream step's `output:` "
    "schema does not declare",
}

WARNING_CODES = frozenset({"missing_output_schema", "undeclared_output_field"})


def sort_and_cap(errors: list[Diagnostic], limit: int = MAX_REPORTED_ERRORS) -> list[Diagnostic]:
    """Stable sort by (line, column); beyond `limit`, keep the first ones and add one trailer."""
    ordered = sorted(errors, key=lambda d: (d.line, d.column or 0))
    if len(ordered) <= limit:
        return ordered
    kept = ordered[:limit]
    hidden = len(ordered) - limit
    kept.append(
        Diagnostic(
            code="too_many_errors",
            message=f"{hidden} more error(s) not shown ({len(ordered)} in total)",
            line=kept[-1].line,
            hint="fix the errors above and lint again to see the rest",
        )
    )
    return kept


def fold_repeats(warnings: list[Diagnostic], keep: int = MAX_REPEATED_WARNINGS) -> list[Diagnostic]:
    """Keep the first `keep` warnings of each code; fold the rest into one entry per code.

    Why: a generated file with thousands of untyped steps used to print thousands
    of identical lines (and hand an agent thousands of JSON entries). The folded
    entry keeps the code, sits on the first folded line, says which lines it
    stands for, and carries `count` so totals stay exact.
    """
    by_code: dict[str, list[Diagnostic]] = {}
    for w in warnings:
        by_code.setdefault(w.code, []).append(w)
    if all(len(group) <= keep + 1 for group in by_code.values()):
        return warnings  # folding one warning into a summary would hide more than it saves
    out: list[Diagnostic] = []
    for code, group in by_code.items():
        if len(group) <= keep + 1:
            out.extend(group)
            continue
        out.extend(group[:keep])
        rest = group[keep:]
        lines = [d.line for d in rest]
        shown = ", ".join(str(n) for n in lines[:5]) + (f", … {lines[-1]}" if len(lines) > 5 else "")
        out.append(
            Diagnostic(
                code=code,
                line=lines[0],
                count=len(rest),
                message=f"{len(rest)} more {code} warnings like the ones above (lines {shown})",
            )
        )
    return sorted(out, key=lambda d: (d.line, d.column or 0))
