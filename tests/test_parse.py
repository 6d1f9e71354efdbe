"""What the parser builds from valid files (spec-format.md §8 items 1-34 and 57-60 as they apply
to parsing), plus the body rules: fences, sections, rubric extraction, preamble, stray H1."""

from __future__ import annotations

import json

import pytest

from akm.format.markdown import extract_block, scan_headings, split_frontmatter, split_lines
from akm.format.model import ExecSpec, GateSpec, RetrySpec, RouteBranch
from akm.format.parse import parse_workflow


def wf(frontmatter: str, body: str) -> str:
    return "---\n" + frontmatter + "---\n" + body


def ok(text: str):
    result = parse_workflow(text, "workflows/t.md")
    assert result.errors == [], [(d.code, d.line, d.message) for d in result.errors]
    assert result.document is not None
    return result.document


def codes(text: str) -> list[tuple[str, int]]:
    return [(d.code, d.line) for d in parse_workflow(text, "t.md").errors]


def messages(text: str) -> str:
    return "\n".join(d.message for d in parse_workflow(text, "t.md").errors)


# ---- §8 parsing and body binding ------------------------------------------------------------


def test_1_minimal() -> None:
    doc = ok(wf("steps: [{id: only}]\n", "## only\n\nDo it.\n"))
    [step] = doc.steps
    assert (step.id, step.kind, step.sequence_index, step.line) == ("only", "unit", 0, 2)
    assert step.unit is None and step.map is None and step.route is None and step.gate is None
    assert step.instructions.text == "Do it."
    assert (step.instructions.start_line, step.instructions.end_line) == (5, 7)
    assert step.section_line == 4
    assert doc.preamble is None and doc.params == {} and doc.params_declared is False
    assert doc.path == "workflows/t.md" and doc.line_count == 7


def test_4_retry_on_is_a_string_key() -> None:
    doc = ok(wf("steps:\n  - id: a\n    unit: { retry: { max: 1, on: [timeout] } }\n", "## a\n\nA.\n"))
    assert doc.steps[0].unit.retry == RetrySpec(max=1, on=["timeout"])


def test_5_updated_date_is_a_string() -> None:
    doc = ok(wf("updated: 2026-01-01\nsteps: [{id: a}]\n", "## a\n\nA.\n"))
    assert doc.updated == "2026-01-01"
    assert '"updated" must be a string' in messages(wf("updated: 5\nsteps: [{id: a}]\n", "## a\n\nA.\n"))


def test_7_two_invalid_ids_in_one_pass() -> None:
    found = codes(wf("steps:\n  - id: a b\n  - id: c d\n", ""))
    assert found == [("invalid_step_id", 3), ("invalid_step_id", 4)]


def test_12_route_step_without_section() -> None:
    doc = ok(
        wf(
            "params:\n  mode: { type: string }\nsteps:\n  - id: r\n    route:\n      input: params.mode\n"
            "      when: [{ match: fast, step: go }]\n      default: go\n  - id: go\n",
            "## go\n\nGo.\n",
        )
    )
    r = doc.steps[0]
    assert r.kind == "route" and r.instructions is None and r.section_line is None
    assert r.route.input == "params.mode"
    assert r.route.when == [RouteBranch(match="fast", step="go")]
    assert r.route.default == "go"


def test_13_rubric_is_byte_exact() -> None:
    body = "## a\n\nDo.\n\n### gate\n- a  \n### Evidence\nKeep.\n#### D\n  x\n"
    step = ok(wf("steps: [{id: a}]\n", body)).steps[0]
    assert step.gate_rubric.text == "- a  \n### Evidence\nKeep.\n#### D\n  x"
    assert step.gate == GateSpec(max_loops=None)


def test_15_whitespace_only_rubric_is_no_rubric() -> None:
    step = ok(wf("steps: [{id: a}]\n", "## a\n\nDo.\n\n### gate\n   \n\t\n")).steps[0]
    assert step.gate_rubric is None and step.gate is None
    assert step.instructions.text == "Do."


def test_16_rubric_alone_gives_empty_gate_and_frontmatter_gate_wins() -> None:
    step = ok(wf("steps: [{id: a}]\n", "## a\n\nDo.\n\n### gate\n\nDone.\n")).steps[0]
    assert step.gate == GateSpec() and step.gate_rubric.text == "Done."
    step = ok(wf("steps:\n  - id: a\n    gate: { max_loops: 3 }\n", "## a\n\nDo.\n")).steps[0]
    assert step.gate == GateSpec(max_loops=3) and step.gate_rubric is None


def test_17_instruction_trimming_and_span() -> None:
    body = "## a\n\n\n    indented first line\ninner  \n\nlast\n\n### gate\nx\n"
    # lines: 4 "## a", 5-6 blank, 7 indented, 8 inner, 9 blank, 10 last, 11 blank, 12 gate, 13 x
    step = ok(wf("steps: [{id: a}]\n", body)).steps[0]
    assert step.instructions.text == "    indented first line\ninner  \n\nlast"
    assert (step.instructions.start_line, step.instructions.end_line) == (5, 11)
    assert (step.gate_rubric.start_line, step.gate_rubric.end_line) == (13, 14)


def test_gate_heading_must_be_exact_lowercase() -> None:
    step = ok(wf("steps: [{id: a}]\n", "## a\n\n### Gate\n\nnot a rubric\n")).steps[0]
    assert step.gate_rubric is None and "### Gate" in step.instructions.text


def test_crlf_file_reads_like_lf() -> None:
    text = wf("steps:\n  - id: a\n    unit: { timeout: 10m }\n", "## a\n\nline one  \nline two\n")
    lf, crlf = ok(text), ok(text.replace("\n", "\r\n"))
    assert lf.steps == crlf.steps
    assert crlf.steps[0].instructions.text == "line one  \nline two"


# ---- frontmatter container ----------------------------------------------------------------


def test_container_variants() -> None:
    assert codes("---\n---\n") == [("steps_required", 1)]
    assert codes("---\nsteps: [{id: a}]\n") == [("missing_frontmatter", 1)]  # never closed
    assert codes("\n---\nsteps: [{id: a}]\n---\n") == [("missing_frontmatter", 1)]
    bom = parse_workflow("\ufeff" + wf("steps: [{id: a}]\n", "## a\n\nA.\n"), "t.md").errors
    assert [d.code for d in bom] == ["missing_frontmatter"] and "byte-order mark" in bom[0].hint
    # the first closing fence wins; a later `---` is body text
    doc = ok("---\nsteps: [{id: a}]\n---\n## a\n\nA.\n\n---\n\nmore\n")
    assert doc.steps[0].instructions.text == "A.\n\n---\n\nmore"


def test_split_frontmatter_positions() -> None:
    fm = split_frontmatter(split_lines("---\na: 1\r\n---\nbody"))
    assert fm is not None and (fm.yaml_text, fm.close_line, fm.body_start_line) == ("a: 1", 3, 4)
    assert split_frontmatter(split_lines("--- \na: 1\n---\n")) is None


def test_yaml_error_line_is_a_file_line() -> None:
    assert codes(wf("description: ok\nsteps: [{id: a}\n", "")) == [("yaml_syntax", 3)]


def test_merge_key_is_unknown_key() -> None:
    assert ("unknown_key", 2) in codes(wf("<<: {steps: []}\nsteps: [{id: a}]\n", "## a\n\nA.\n"))


# ---- §8 frontmatter field rules --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("10m", 600000),
        ('"10S"', 10000),
        ("250", 250),
        ('"250"', 250),
        ("250ms", 250),
        ("2.0", 2),
        ("none", None),
        ("NONE", None),
        ("2147483647", 2147483647),
    ],
)
def test_19_valid_durations(value: str, ms) -> None:
    unit = ok(wf(f"steps:\n  - id: a\n    unit: {{ timeout: {value} }}\n", "## a\n\nA.\n")).steps[0].unit
    assert unit.timeout_set is True and unit.timeout_ms == ms


@pytest.mark.parametrize("value", ["1h", "0", "1.5s", "true", "-5", "0s", "1 m", "''", "[1]", "2147483648"])
def test_19_invalid_durations(value: str) -> None:
    found = {c for c, _ in codes(wf(f"steps:\n  - id: a\n    unit: {{ timeout: {value} }}\n", "## a\n\nA.\n"))}
    assert found in ({"invalid_duration"}, {"out_of_range"})


def test_timeout_absent_is_not_none() -> None:
    unit = ok(wf("steps:\n  - id: a\n    unit: { on_error: continue }\n", "## a\n\nA.\n")).steps[0].unit
    assert unit.timeout_set is False and unit.timeout_ms is None and unit.on_error == "continue"


def test_20_21_retry_requires_max_and_reasons() -> None:
    m = messages(wf("steps:\n  - id: a\n    unit: { retry: { on: [timeout] } }\n", "## a\n\nA.\n"))
    assert "retry.max is required" in m
    found = codes(wf("steps:\n  - id: a\n    unit: { retry: { max: 1, on: [] } }\n", "## a\n\nA.\n"))
    assert found == [("invalid_value", 4)]


def test_retry_bounds() -> None:
    assert codes(wf("steps:\n  - id: a\n    unit: { retry: { max: 101, on: [timeout] } }\n", "## a\n\nA.\n")) == [
        ("out_of_range", 4)
    ]
    unit = (
        ok(wf("steps:\n  - id: a\n    unit: { retry: { max: 0, on: [aborted, no_change] } }\n", "## a\n\nA.\n"))
        .steps[0]
        .unit
    )
    assert unit.retry == RetrySpec(max=0, on=["aborted", "no_change"])


def test_22_param_names_and_schemas_kept_in_order() -> None:
    doc = ok(
        wf(
            "params:\n  zeta: { type: string, description: Last }\n  alpha: { type: integer, minimum: 1 }\n"
            "steps: [{id: a}]\n",
            "## a\n\nA.\n",
        )
    )
    assert list(doc.params) == ["zeta", "alpha"] and doc.params_declared is True
    assert doc.params["zeta"] == {"type": "string", "description": "Last"}
    assert 'Param name "my-param" is invalid' in messages(
        wf("params:\n  my-param: {type: string}\nsteps: [{id: a}]\n", "")
    )


def test_23_budget_bounds() -> None:
    doc = ok(wf("budget: { max_units: 10000, max_tokens: 5 }\nsteps: [{id: a}]\n", "## a\n\nA.\n"))
    assert (doc.budget.max_units, doc.budget.max_tokens) == (10000, 5)
    assert codes(wf("budget: { max_units: 10001 }\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [("out_of_range", 2)]
    assert codes(wf("budget: { max_tokens: 0 }\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [("out_of_range", 2)]


def test_24_reference_syntax_messages() -> None:
    assert 'Unknown root "changed_files"' in messages(
        wf("steps:\n  - id: a\n    map: { over: changed_files }\n", "## a\n\nA.\n")
    )
    assert 'Unknown root "the"' in messages(
        wf('steps:\n  - id: a\n    map: { over: "the params.files list" }\n', "## a\n\nA.\n")
    )


def test_25_kind_conflict_messages() -> None:
    m = messages(
        wf(
            "params: {xs: {type: array}}\nsteps:\n  - id: a\n    map: { over: params.xs }\n"
            "    route: { input: params.xs, when: [{match: x, step: b}] }\n  - id: b\n",
            "## a\n\nA.\n## b\n\nB.\n",
        )
    )
    assert 'at most one of "map" or "route"' in m
    assert 'belongs at "map.unit"' in messages(
        wf(
            "params: {xs: {type: array}}\nsteps:\n  - id: a\n    map: { over: params.xs }\n    unit: {}\n",
            "## a\n\nA.\n",
        )
    )


def test_26_route_target_messages() -> None:
    base = "params: {{m: {{type: string}}}}\nsteps:\n  - id: b\n  - id: r\n    route: {{ input: params.m, when: [{{match: x, step: {t}}}] }}\n"
    assert "routes to unknown step" in messages(wf(base.format(t="zz"), "## b\n\nB.\n"))
    assert "must not route to itself" in messages(wf(base.format(t="r"), "## b\n\nB.\n"))
    assert "routes backward" in messages(wf(base.format(t="b"), "## b\n\nB.\n"))


def test_27_match_values_are_js_strings() -> None:
    doc = ok(
        wf(
            "params: {m: {type: string}}\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when:\n"
            "        - { match: true, step: b }\n        - { match: 1.0, step: b }\n        - { match: 1e3, step: b }\n"
            '        - { match: "false", step: b }\n  - id: b\n',
            "## b\n\nB.\n",
        )
    )
    assert [w.match for w in doc.steps[0].route.when] == ["true", "1", "1000", "false"]
    dup = wf(
        "params: {m: {type: string}}\nsteps:\n  - id: r\n    route:\n      input: params.m\n      when:\n"
        '        - { match: 1, step: b }\n        - { match: "1", step: c }\n  - id: b\n  - id: c\n',
        "## b\n\nB.\n## c\n\nC.\n",
    )
    assert 'duplicate "when" match "1"' in messages(dup)


def test_28_llm_options() -> None:
    doc = ok(
        wf(
            "defaults:\n  llm: { temperature: 0.2, max_tokens: 100 }\nsteps:\n  - id: a\n    unit:\n      llm:\n"
            "        enable_thinking: false\n        extra_params: { top_k: 5, nested: { x: [1] } }\n",
            "## a\n\nA.\n",
        )
    )
    assert doc.defaults.llm.authored() == {"temperature": 0.2, "max_tokens": 100}
    assert doc.steps[0].unit.llm.authored() == {
        "enable_thinking": False,
        "extra_params": {"top_k": 5, "nested": {"x": [1]}},
    }
    assert "cannot carry credentials" in messages(
        wf("steps:\n  - id: a\n    unit: { llm: { extra_params: { api_key: x } } }\n", "## a\n\nA.\n")
    )
    assert "protected by AKM" in messages(
        wf("steps:\n  - id: a\n    unit: { llm: { extra_params: { Response-Format: x } } }\n", "## a\n\nA.\n")
    )


# ---- §8 compile-stage rules, reported by the parser (D10) ------------------------------------


def test_29_30_reference_semantics() -> None:
    m = messages(wf("steps:\n  - id: a\n    inputs: [steps.b.output.x]\n  - id: b\n", "## a\n\nA.\n## b\n\nB.\n"))
    assert "does not come before this step" in m
    assert '"ghost" is not a step in this workflow' in messages(
        wf("steps:\n  - id: a\n    inputs: [steps.ghost.output]\n", "## a\n\nA.\n")
    )
    assert "names a param, not a step output" in messages(
        wf("params: {p: {type: string}}\nsteps:\n  - id: a\n    inputs: [params.p]\n", "## a\n\nA.\n")
    )


def test_31_undeclared_params_are_errors_for_us() -> None:
    with_block = wf(
        "params: {other: {type: string}}\nsteps:\n  - id: r\n    route: { input: params.mode, when: [{match: x, step: b}] }\n  - id: b\n",
        "## b\n\nB.\n",
    )
    without = wf(
        "steps:\n  - id: r\n    route: { input: params.mode, when: [{match: x, step: b}] }\n  - id: b\n", "## b\n\nB.\n"
    )
    assert codes(with_block) == [("unknown_param_reference", 5)]
    assert codes(without) == [("unknown_param_reference", 4)]
    assert "declares no params" in messages(without)


def test_32_w1_unit_output_alone_does_not_silence() -> None:
    result = parse_workflow(
        wf(
            "steps:\n  - id: a\n    unit: { output: { type: object } }\n  - id: b\n    output: { type: string }\n",
            "## a\n\nA.\n## b\n\nB.\n",
        ),
        "t.md",
    )
    assert [(w.code, w.line) for w in result.warnings] == [("missing_output_schema", 3)]


def test_34_on_error_layers_are_kept_separately() -> None:
    doc = ok(
        wf(
            "defaults: { on_error: continue, engine: fast-1, model: m }\nsteps:\n  - id: a\n    unit: { on_error: fail }\n  - id: b\n",
            "## a\n\nA.\n## b\n\nB.\n",
        )
    )
    assert doc.defaults.on_error == "continue" and doc.defaults.engine == "fast-1"
    assert doc.steps[0].unit.on_error == "fail" and doc.steps[1].unit is None


def test_references_are_stored_canonically_and_earlier_steps_resolve() -> None:
    doc = ok(
        wf(
            "params: {files: {type: array}}\nsteps:\n  - id: plan\n    output: { type: object, properties: { items: { type: array } } }\n"
            "  - id: fan\n    inputs: [' steps.plan.output.items[007] ']\n    map: { over: steps.plan.output.items, concurrency: 3, reducer: vote }\n"
            "  - id: each\n    map:\n      over: params.files\n      unit: { exec: { command: [wc, -l] } }\n",
            "## plan\n\nP.\n## fan\n\nF.\n## each\n\nE.\n",
        )
    )
    fan, each = doc.steps[1], doc.steps[2]
    assert fan.inputs == ["steps.plan.output.items[7]"]
    assert (fan.kind, fan.map.over, fan.map.concurrency, fan.map.reducer, fan.map.unit) == (
        "map",
        "steps.plan.output.items",
        3,
        "vote",
        None,
    )
    assert (each.map.concurrency, each.map.reducer) == (None, "collect")
    assert each.map.unit.exec == ExecSpec(command=["wc", "-l"])


def test_over_not_array_follows_the_step_schema() -> None:
    src = wf(
        "steps:\n  - id: plan\n    output: { type: object, properties: { n: { type: integer } } }\n"
        "  - id: fan\n    map: { over: steps.plan.output.n }\n",
        "## plan\n\nP.\n## fan\n\nF.\n",
    )
    assert codes(src) == [("over_not_array", 6)]


def test_bounds_on_concurrency_and_loops() -> None:
    assert codes(
        wf(
            "params: {xs: {type: array}}\nsteps:\n  - id: a\n    map: { over: params.xs, concurrency: 65 }\n",
            "## a\n\nA.\n",
        )
    ) == [("out_of_range", 5)]
    assert codes(
        wf(
            "params: {xs: {type: array}}\nsteps:\n  - id: a\n    map: { over: params.xs, concurrency: 0 }\n",
            "## a\n\nA.\n",
        )
    ) == [("out_of_range", 5)]
    assert codes(wf("steps:\n  - id: a\n    gate: { max_loops: 0 }\n", "## a\n\nA.\n")) == [("out_of_range", 4)]


def test_schema_keyword_line_anchors() -> None:
    src = wf(
        "params:\n  p:\n    type: object\n    properties:\n      x: { type: string, const: a }\n"
        "steps:\n  - id: a\n    unit:\n      output:\n        type: string\n        format: date\n",
        "## a\n\nA.\n",
    )
    result = parse_workflow(src, "t.md")
    assert [(d.code, d.line) for d in result.errors] == [
        ("schema_unsupported_keyword", 6),
        ("schema_unsupported_keyword", 12),
    ]
    assert "one-value enum" in result.errors[0].hint


def test_non_finite_numbers_in_schemas_are_refused() -> None:
    assert codes(wf("params:\n  p: { type: number, default: .nan }\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [
        ("invalid_value", 3)
    ]


# ---- §8 exec units (57-60) -------------------------------------------------------------------


def test_57_exec_unit() -> None:
    unit = (
        ok(wf('steps:\n  - id: t\n    unit: { exec: { command: ["bun", "run", "t"] } }\n', "## t\n\nRun.\n"))
        .steps[0]
        .unit
    )
    assert unit.exec == ExecSpec(command=["bun", "run", "t"], cwd=None, pass_env=[], inherit_env=False)
    assert unit.engine is None and unit.model is None


def test_58_exec_errors() -> None:
    base = "steps:\n  - id: t\n    unit:\n      exec:\n        command: [x]\n        cwd: {cwd}\n"
    for cwd in ["../x", "/abs", "~/x", "C:x", "'a\\\\..\\\\b'", "a/../../b"]:
        assert codes(wf(base.format(cwd=cwd), "## t\n\nT.\n")) == [("exec_cwd_not_relative", 7)], cwd
    unit = ok(wf(base.format(cwd="./packages/core"), "## t\n\nT.\n")).steps[0].unit
    assert unit.exec.cwd == "./packages/core"
    assert "non-empty argv list" in messages(
        wf('steps:\n  - id: t\n    unit: { exec: { command: "bun test" } }\n', "## t\n\nT.\n")
    )
    m = messages(
        wf(
            "steps:\n  - id: t\n    unit: { exec: { command: [x] }, engine: fast, model: m, llm: { temperature: 1 } }\n",
            "## t\n\nT.\n",
        )
    )
    assert m.count('declares both "exec" and') == 3
    assert codes(wf("steps:\n  - id: t\n    unit: { exec: { command: [x, 1] } }\n", "## t\n\nT.\n")) == [
        ("exec_invalid_command", 4)
    ]
    assert codes(wf("steps:\n  - id: t\n    unit: { exec: { command: [] } }\n", "## t\n\nT.\n")) == [
        ("exec_invalid_command", 4)
    ]
    assert codes(wf("steps:\n  - id: t\n    unit: { exec: [x] }\n", "## t\n\nT.\n")) == [("invalid_type", 4)]
    assert codes(wf("steps:\n  - id: t\n    unit: { exec: { command: [x], shell: true } }\n", "## t\n\nT.\n")) == [
        ("unknown_key", 4)
    ]


def test_59_pass_env_and_inherit_env() -> None:
    unit = (
        ok(
            wf(
                "steps:\n  - id: t\n    unit:\n      exec: { command: [x], inherit_env: false, pass_env: [A, B_2] }\n"
                "      env: [env/ci]\n      isolation: worktree\n",
                "## t\n\nT.\n",
            )
        )
        .steps[0]
        .unit
    )
    assert unit.exec == ExecSpec(command=["x"], pass_env=["A", "B_2"], inherit_env=False)
    assert unit.env == ["env/ci"] and unit.isolation == "worktree"
    assert "more than once" in messages(
        wf("steps:\n  - id: t\n    unit: { exec: { command: [x], pass_env: [A, A] } }\n", "## t\n\nT.\n")
    )


def test_60_exec_timeouts_are_recorded_per_layer() -> None:
    doc = ok(
        wf(
            "defaults: { timeout: 45s }\nsteps:\n  - id: t\n    unit: { exec: { command: [x] }, timeout: 5s }\n"
            "  - id: u\n    unit: { exec: { command: [x] }, timeout: none }\n",
            "## t\n\nT.\n## u\n\nU.\n",
        )
    )
    assert (doc.defaults.timeout_set, doc.defaults.timeout_ms) == (True, 45000)
    assert doc.steps[0].unit.timeout_ms == 5000
    assert (doc.steps[1].unit.timeout_set, doc.steps[1].unit.timeout_ms) == (True, None)


# ---- body rules ------------------------------------------------------------------------------


def test_fences_hide_headings_and_toggle_without_matching_kind() -> None:
    lines = split_lines("## a\n```py\n## hidden\n~~~\n## b\n   ```\n## hidden2\n")
    assert [(h.line, h.text) for h in scan_headings(lines, 1)] == [(1, "a"), (5, "b")]


def test_unclosed_fence_swallows_the_rest() -> None:
    assert codes(wf("steps: [{id: a}, {id: b}]\n", "## a\n\n```\nA.\n\n## b\n\nB.\n")) == [("missing_section", 2)]


def test_heading_forms() -> None:
    lines = split_lines("#NoSpace\n ## indented\n## a ##\n####### seven\n##\ttab\n")
    assert [(h.level, h.text) for h in scan_headings(lines, 1)] == [(2, "a"), (2, "tab")]


def test_extract_block_keeps_inner_text_and_reports_untrimmed_span() -> None:
    lines = ["", "  ", "  x  ", "", "y", " "]
    block = extract_block(lines, 1, 6)
    assert (block.text, block.start_line, block.end_line) == ("  x  \n\ny", 1, 6)
    assert extract_block(lines, 1, 2) is None and extract_block(lines, 3, 2) is None


def test_preamble_title_and_h1_before_steps() -> None:
    doc = ok(wf("steps: [{id: a}]\n", "\n# My Flow\n\nIntro text.\n\n### gate\nnot a rubric\n\n## a\n\nA.\n"))
    assert doc.title == "My Flow"
    assert doc.preamble.text == "# My Flow\n\nIntro text.\n\n### gate\nnot a rubric"
    assert doc.steps[0].gate_rubric is None


def test_h1_after_steps_without_text_is_fine_with_text_is_an_error() -> None:
    ok(wf("steps: [{id: a}]\n", "## a\n\nA.\n\n# Appendix\n\n\n"))
    src = wf("steps: [{id: a}, {id: b}]\n", "## a\n\nA.\n\n# Notes\nlost\n## b\n\nB.\n")
    assert codes(src) == [("text_after_h1", 8)]


def test_envelope_keys() -> None:
    doc = ok(
        wf(
            "type: workflow\ndescription: D\ntags: [x, ' y ']\nwhen_to_use: W\nstatus: stable\nstale_after: 30d\n"
            "xrefs: [skills/review, 'core//knowledge/a#part']\ngenerated: { by: me, at: '2026' }\nverified: []\n"
            "provenance: { source: x }\nsteps: [{id: a}]\n",
            "## a\n\nA.\n",
        )
    )
    assert (doc.description, doc.tags, doc.when_to_use, doc.status) == ("D", ["x", "y"], "W", "stable")
    assert doc.envelope["xrefs"] == ["skills/review", "core//knowledge/a#part"]
    assert doc.envelope["generated"] == {"by": "me", "at": "2026"}
    assert codes(wf("generated: { at: x }\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [("missing_key", 2)]
    assert codes(wf("status: final\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [("invalid_value", 2)]


def test_engine_name_grammar() -> None:
    assert codes(wf("defaults: { engine: Fast_1 }\nsteps: [{id: a}]\n", "## a\n\nA.\n")) == [("invalid_value", 2)]
    assert (
        ok(wf("defaults: { engine: local-llm2 }\nsteps: [{id: a}]\n", "## a\n\nA.\n")).defaults.engine == "local-llm2"
    )


def test_document_is_plain_data_for_the_compiler() -> None:
    doc = ok(wf("steps: [{id: a}]\n", "## a\n\nA.\n"))
    dumped = doc.model_dump()
    assert dumped["steps"][0]["id"] == "a" and dumped["steps"][0]["instructions"]["text"] == "A."
    assert json.loads(json.dumps(dumped)) == dumped  # nothing but JSON data, nested records included
    assert ok(wf("steps: [{id: a}]\n", "## a\n\nA.\n")) == doc and doc != ok(wf("steps: [{id: b}]\n", "## b\n\nA.\n"))


def test_document_records_refuse_unknown_and_missing_fields() -> None:
    """The parser builds them by keyword: a misspelt field must fail loudly, as `extra=forbid` did."""
    with pytest.raises(TypeError, match="unknown field"):
        RetrySpec(max=1, on=["timeout"], tries=2)
    with pytest.raises(TypeError, match="missing required field 'on'"):
        RetrySpec(max=1)


def test_step_frontmatter_spans() -> None:
    doc = ok(
        wf(
            "steps:\n  - id: a\n    unit:\n      timeout: 5s\n    # comment\n  - id: b\n  - id: c\n"
            "    inputs: [steps.a.output,\n      steps.b.output]\n",
            "## a\n\nA.\n## b\n\nB.\n## c\n\nC.\n",
        )
    )
    assert [(s.id, s.line, s.end_line) for s in doc.steps] == [("a", 3, 5), ("b", 7, 7), ("c", 8, 10)]
