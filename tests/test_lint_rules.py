"""One minimal failing workflow per lint code, asserting the code and the line it is reported on.

The table doubles as the living index of the codes: `test_every_code_has_a_case` fails when a code
is added to akm.format.diagnostics.CODES without a failing example here.
"""

from __future__ import annotations

import pytest

from akm.format.diagnostics import CODES, WARNING_CODES
from akm.format.lint import lint_paths, lint_text
from akm.format.parse import parse_workflow


def wf(frontmatter: str, body: str = "\n## a\n\nDo it.\n") -> str:
    """A workflow file: frontmatter line k is file line k + 1."""
    return "---\n" + frontmatter + "---\n" + body


OK_STEPS = "steps:\n  - id: a\n"  # lines 2-3

LEGACY = """---
description: Old style
---

# Workflow: Old one

## Step: Do a thing
Step ID: do-it

### Instructions
Do it.
"""

# (code, source, expected line)
UNDECLARED = (
    "steps:\n  - id: a\n    output: { type: object }\n  - id: b\n    map:\n      over: steps.a.output.ordered\n"
    "    output: { type: array }\n"
)

CASES: list[tuple[str, str, int]] = [
    # container
    ("missing_frontmatter", "# Title\n\n## a\n\nDo it.\n", 1),
    ("legacy_format", LEGACY, 5),
    ("yaml_syntax", wf("steps:\n  - id: a\nbad: key: here\n"), 4),
    ("duplicate_key", wf(OK_STEPS + "description: x\ndescription: y\n"), 5),
    ("yaml_alias_expansion", wf(OK_STEPS + "tags: &t [*t]\n"), 4),
    ("yaml_unsupported_tag", wf(OK_STEPS + "updated: !!timestamp 2026-01-01\n"), 4),
    ("frontmatter_not_mapping", wf("- id: a\n"), 2),
    # generic shape
    ("unknown_key", wf(OK_STEPS + "owner: me\n"), 4),
    ("unknown_key", wf(OK_STEPS + "model: gpt\n"), 4),  # §8.6: no top-level model
    ("unknown_key", wf("steps:\n  - id: a\n    gate: { required: true }\n"), 4),  # §8.18
    ("missing_key", wf("steps:\n  - id: a\n    unit:\n      retry: { on: [timeout] }\n"), 5),  # §8.20
    ("invalid_type", wf(OK_STEPS + "updated: 5\n"), 4),  # §8.5
    ("invalid_value", wf(OK_STEPS + "type: skill\n"), 4),
    ("out_of_range", wf("steps:\n  - id: a\n    gate:\n      max_loops: 101\n"), 5),  # §8.40 [R+]
    ("out_of_range", wf(OK_STEPS + "budget: { max_units: 10001 }\n"), 4),  # §8.23
    (
        "too_many_entries",
        wf(
            "steps:\n  - id: a\n    unit:\n      exec:\n        command: [x]\n        pass_env: ["
            + ", ".join(f"V{i}" for i in range(33))
            + "]\n"
        ),
        7,
    ),  # §8.59
    (
        "too_large",
        wf("steps:\n  - id: a\n    unit:\n      exec:\n        command:\n          - " + "x" * 5000 + "\n"),
        7,
    ),
    (
        "duplicate_entry",
        wf(
            "steps:\n  - id: b\n  - id: a\n    inputs:\n      - steps.b.output\n      - steps.b.output\n",
            "\n## b\n\nB.\n\n## a\n\nA.\n",
        ),
        7,
    ),  # §8.41
    ("duplicate_entry", wf("steps:\n  - id: a\n    unit:\n      env: [env/ci, env/ci]\n"), 5),
    ("duplicate_entry", wf("steps:\n  - id: a\n    unit:\n      retry: { max: 1, on: [timeout, timeout] }\n"), 5),
    # envelope / params
    ("invalid_xref", wf(OK_STEPS + "xrefs:\n  - ../escape\n"), 5),
    ("invalid_param_name", wf("params:\n  my-param: { type: string }\n" + OK_STEPS), 3),  # §8.22
    ("param_default_invalid", wf("params:\n  n:\n    type: integer\n    minimum: 1\n    default: 0\n" + OK_STEPS), 6),
    # steps
    ("steps_required", wf("type: workflow\n"), 1),  # §8.3
    ("steps_required", wf("steps: []\n"), 2),
    ("invalid_step_id", wf("steps:\n  - id: valid.ate\n"), 3),  # §8.7
    ("duplicate_step_id", wf("steps:\n  - id: a\n  - id: a\n"), 4),  # §8.8
    (
        "conflicting_step_kind",
        wf(
            "params:\n  xs: { type: array }\nsteps:\n  - id: a\n    map: { over: params.xs }\n"
            "    route: { input: params.xs, when: [{ match: x, step: b }] }\n  - id: b\n",
            "\n## a\n\nA.\n\n## b\n\nB.\n",
        ),
        7,
    ),  # §8.25
    (
        "conflicting_step_kind",
        wf("params:\n  xs: { type: array }\nsteps:\n  - id: a\n    map: { over: params.xs }\n    unit: {}\n"),
        7,
    ),
    (
        "conflicting_step_kind",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: r\n    route: { input: params.m, when: [{ match: x, step: a }] }\n"
            "    inputs: [params.m]\n  - id: a\n"
        ),
        7,
    ),
    # unit bag
    ("invalid_duration", wf("steps:\n  - id: a\n    unit: { timeout: 1h }\n"), 4),  # §8.19
    ("invalid_duration", wf("defaults:\n  timeout: 0\n" + OK_STEPS), 3),
    (
        "invalid_retry_reason",
        wf("steps:\n  - id: a\n    unit:\n      retry:\n        max: 1\n        on: [flaky]\n"),
        7,
    ),
    (
        "credential_in_llm",
        wf("steps:\n  - id: a\n    unit:\n      llm:\n        extra_params:\n          nested: { api_key: x }\n"),
        7,
    ),  # §8.28
    (
        "protected_llm_param",
        wf("steps:\n  - id: a\n    unit:\n      llm:\n        extra_params:\n          model: x\n"),
        7,
    ),  # §8.28
    (
        "exec_invalid_command",
        wf('steps:\n  - id: a\n    unit:\n      exec:\n        command: "bun test"\n'),
        6,
    ),  # §8.58
    (
        "exec_cwd_not_relative",
        wf("steps:\n  - id: a\n    unit:\n      exec:\n        command: [x]\n        cwd: ../x\n"),
        7,
    ),
    (
        "exec_invalid_env_name",
        wf("steps:\n  - id: a\n    unit:\n      exec:\n        command: [x]\n        pass_env: [1BAD]\n"),
        7,
    ),
    ("invalid_env_ref", wf("steps:\n  - id: a\n    unit:\n      env: [ci]\n"), 5),
    (
        "exec_engine_conflict",
        wf("steps:\n  - id: a\n    unit:\n      exec: { command: [x] }\n      engine: fast\n"),
        6,
    ),  # §8.58
    # schemas
    (
        "schema_unsupported_keyword",
        wf(
            "steps:\n  - id: a\n    output:\n      type: object\n      properties:\n        v:\n          type: string\n"
            '          pattern: "^v"\n'
        ),
        9,
    ),
    ("schema_malformed", wf("params:\n  p:\n    type: strin\n" + OK_STEPS), 4),
    # references
    ("invalid_reference", wf("steps:\n  - id: a\n    map: { over: changed_files }\n"), 4),  # §8.24
    ("unknown_step_reference", wf("steps:\n  - id: a\n    inputs:\n      - steps.ghost.output\n"), 5),  # §8.29
    (
        "forward_reference",
        wf("steps:\n  - id: a\n    inputs: [steps.b.output.x]\n  - id: b\n", "\n## a\n\nA.\n\n## b\n\nB.\n"),
        4,
    ),  # §8.29
    ("forward_reference", wf("steps:\n  - id: a\n    inputs: [steps.a.output]\n"), 4),  # self
    (
        "param_as_input",
        wf("params:\n  payload: { type: string }\nsteps:\n  - id: a\n    inputs: [params.payload]\n"),
        6,
    ),  # §8.30
    (
        "unknown_param_reference",
        wf(
            "params:\n  other: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.mode\n"
            "      when: [{ match: x, step: a }]\n  - id: a\n"
        ),
        7,
    ),  # §8.31 (an error for us, D10)
    ("unknown_param_reference", wf("steps:\n  - id: a\n    map:\n      over: params.files\n"), 5),
    (
        "over_not_array",
        wf("params:\n  files: { type: string }\nsteps:\n  - id: a\n    map:\n      over: params.files\n"),
        7,
    ),
    # route
    (
        "route_target_unknown",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when:\n"
            "        - { match: x, step: nowhere }\n"
        ),
        9,
    ),  # §8.26
    (
        "route_target_self",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when: [{ match: x, step: b }]\n"
            "      default: r\n  - id: b\n",
            "\n## b\n\nB.\n",
        ),
        9,
    ),
    (
        "route_backward",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: b\n  - id: r\n    route:\n      input: params.m\n"
            "      when: [{ match: x, step: b }]\n",
            "\n## b\n\nB.\n",
        ),
        9,
    ),
    (
        "duplicate_route_match",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when:\n"
            '        - { match: 1, step: b }\n        - { match: "1", step: c }\n  - id: b\n  - id: c\n',
            "\n## b\n\nB.\n\n## c\n\nC.\n",
        ),
        10,
    ),  # §8.27
    (
        "empty_route_match",
        wf(
            "params:\n  m: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when:\n"
            '        - { match: "", step: b }\n  - id: b\n',
            "\n## b\n\nB.\n",
        ),
        9,
    ),
    # body
    ("unexpected_heading", wf("steps:\n  - id: deploy\n", "\n## deployment\n\nShip.\n"), 6),  # §8.9
    ("missing_section", wf("steps:\n  - id: deploy\n", "\n## deployment\n\nShip.\n"), 3),  # §8.9
    ("missing_section", wf(OK_STEPS, "\n```\n## a\n```\n"), 3),  # §8.10: fenced heading ignored
    ("empty_section", wf(OK_STEPS, "\n## a\n\n### gate\n\n- done\n"), 6),  # §8.11
    ("duplicate_section", wf(OK_STEPS, "\n## a\n\nOne.\n\n## a\n\nTwo.\n"), 10),
    ("duplicate_gate", wf(OK_STEPS, "\n## a\n\nDo.\n\n### gate\n\nx\n\n### Other\n\n### gate\n\ny\n"), 16),  # §8.14
    ("text_after_h1", wf(OK_STEPS, "\n## a\n\nDo.\n\n# Appendix\n\nlost text\n"), 10),
    # report plumbing
    ("too_many_errors", wf(OK_STEPS + "".join(f"k{i}: 1\n" for i in range(60))), 53),
    ("internal_error", None, 1),  # type: ignore[list-item]  (non-str input; see test below)
    # warnings
    ("missing_output_schema", wf(OK_STEPS), 3),
    ("undeclared_output_field", wf(UNDECLARED, "\n## a\n\nA.\n\n## b\n\nB.\n"), 7),
]

ERROR_CASES = [c for c in CASES if c[0] not in WARNING_CODES and c[0] != "internal_error"]


def test_undeclared_output_field_is_the_case_of_issue_33() -> None:
    """`{type: object}` with no properties read as `.ordered`: a result `{"order": [...]}` passes its schema and
    fails the fan-out only when it runs. Declared fields, typed extra fields and untyped steps say nothing."""
    found = parse_workflow(wf(UNDECLARED, "\n## a\n\nA.\n\n## b\n\nB.\n"), "wf.md")
    (w,) = [w for w in found.warnings if w.code == "undeclared_output_field"]
    assert "ordered" in w.message and "declares no properties" in w.message and "required: [ordered]" in w.hint
    near = UNDECLARED.replace("{ type: object }", "{ type: object, properties: { orderd: { type: array } } }")
    (w,) = [w for w in parse_workflow(wf(near, "\n## a\n\nA.\n\n## b\n\nB.\n"), "wf.md").warnings]
    assert "(it declares orderd)" in w.message and 'did you mean "orderd"' in w.hint.lower()
    for quiet in (
        UNDECLARED.replace("{ type: object }", "{ type: object, properties: { ordered: { type: array } } }"),
        UNDECLARED.replace("{ type: object }", "{ type: object, additionalProperties: { type: array } }"),
        UNDECLARED.replace("    output: { type: object }\n", ""),
    ):
        codes = [w.code for w in parse_workflow(wf(quiet, "\n## a\n\nA.\n\n## b\n\nB.\n"), "wf.md").warnings]
        assert "undeclared_output_field" not in codes, quiet


@pytest.mark.parametrize(("code", "source", "line"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_code_and_line(code: str, source: str, line: int) -> None:
    result = parse_workflow(source, "wf.md")
    found = [(d.code, d.line) for d in result.errors]
    assert (code, line) in found, found
    assert result.document is None
    for d in result.errors:
        assert d.code in CODES, d.code
        assert d.message.strip()


def test_warning_code_and_line() -> None:
    result = parse_workflow(wf(OK_STEPS), "wf.md")
    assert result.errors == []
    assert [(w.code, w.line) for w in result.warnings] == [("missing_output_schema", 3)]


def test_non_string_input_is_an_internal_error_not_an_exception() -> None:
    result = parse_workflow(None, "wf.md")  # type: ignore[arg-type]
    assert [(d.code, d.line) for d in result.errors] == [("internal_error", 1)]


def test_file_too_large_in_text_and_on_disk(tmp_path) -> None:
    big = wf(OK_STEPS) + "x" * (1024 * 1024)
    assert [(d.code, d.line) for d in parse_workflow(big, "big.md").errors] == [("file_too_large", 1)]
    path = tmp_path / "big.md"
    path.write_text(big)
    report = lint_paths([str(path)])
    assert [(d.code, d.line) for d in report.files[0].errors] == [("file_too_large", 1)]


def test_unreadable_file_missing_and_not_utf8(tmp_path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"---\nsteps:\n  - id: a\n---\n\n## a\n\n\xff\xfe oops\n")
    report = lint_paths([str(tmp_path / "nope.md"), str(bad)])
    assert report.ok is False
    assert [(d.code, d.line) for d in report.files[0].errors] == [("unreadable_file", 1)]
    assert [(d.code, d.line) for d in report.files[1].errors] == [("unreadable_file", 8)]
    assert "UTF-8" in report.files[1].errors[0].message


def test_every_code_has_a_case() -> None:
    covered = {c[0] for c in CASES} | {"file_too_large", "unreadable_file"}
    assert covered == set(CODES)


def test_legacy_gives_exactly_one_error_with_upgrade_hint() -> None:
    result = parse_workflow(LEGACY, "old flow.md")
    assert len(result.errors) == 1
    err = result.errors[0]
    assert err.code == "legacy_format"
    assert err.hint == "convert it with `akm workflow upgrade 'old flow.md' --write`"


def test_too_many_errors_caps_at_fifty_plus_trailer() -> None:
    result = parse_workflow(wf(OK_STEPS + "".join(f"k{i}: 1\n" for i in range(60))), "wf.md")
    assert len(result.errors) == 51
    assert all(d.code == "unknown_key" for d in result.errors[:50])
    trailer = result.errors[-1]
    assert trailer.code == "too_many_errors"
    assert "10 more error(s)" in trailer.message and "60 in total" in trailer.message
    assert trailer.line == result.errors[49].line


def test_errors_are_sorted_by_line() -> None:
    src = wf("steps:\n  - id: a\n    unit: { timeout: 1h }\nowner: me\n", "\n## zzz\n\nx\n\n## a\n\nA.\n")
    lines = [d.line for d in parse_workflow(src, "wf.md").errors]
    assert lines == sorted(lines) and len(lines) == 3


# ---- spec-format.md §7.5 Example E --------------------------------------------------------

EXAMPLE_E = """---
type: workflow
owner: me
steps:
  - id: fetch.data
  - id: scan
    inputs: [params.target, steps.later.output]
    unit: { timeout: 1h, retry: { max: 1, on: [flaky] } }
  - id: route-it
    route:
      input: steps.scan.output.kind
      when: [{ match: a, step: scan }, { match: a, step: later }]
    unit: { engine: x }
  - id: later
---

## fetch.data

x

## scan

### gate

nothing before the gate

## later

ok

## extra

stray
"""


def test_example_e_reports_every_problem_in_one_pass() -> None:
    result = parse_workflow(EXAMPLE_E, "broken.md")
    got = [(d.line, d.code) for d in result.errors]
    # The 11 upstream parse errors, minus "the emptied-id step has no section" (the invalid id is
    # already reported at its step), plus the two compile-stage problems upstream only finds after
    # the parse errors are fixed (we report everything at once, D10).
    assert got == [
        (3, "unknown_key"),
        (5, "invalid_step_id"),
        (7, "param_as_input"),
        (7, "forward_reference"),
        (8, "invalid_duration"),
        (8, "invalid_retry_reason"),
        (12, "route_backward"),
        (12, "duplicate_route_match"),
        (13, "conflicting_step_kind"),
        (17, "unexpected_heading"),
        (21, "empty_section"),
        (31, "unexpected_heading"),
    ]
    by_code = {d.code: d for d in result.errors}
    assert "1h" in by_code["invalid_duration"].message
    assert "flaky" in by_code["invalid_retry_reason"].message
    assert "scan" in by_code["route_backward"].message
    assert "fetch.data" in by_code["invalid_step_id"].message


def test_lint_text_report_shape() -> None:
    report = lint_text(EXAMPLE_E, "broken.md")
    dumped = report.model_dump()
    assert set(dumped) == {"path", "ok", "errors", "warnings"}
    assert dumped["ok"] is False
    first = dumped["errors"][0]
    assert set(first) == {"code", "message", "line", "column", "hint"}
    empty_section = next(e for e in dumped["errors"] if e["code"] == "empty_section")
    assert "column" not in empty_section  # None fields are omitted, not null


def test_spec_lists_every_code() -> None:
    from pathlib import Path

    spec = (Path(__file__).resolve().parents[1] / "spec" / "workflow-format.md").read_text(encoding="utf-8")
    table = spec.split("## Lint codes", 1)[1]
    listed = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert listed == set(CODES)
