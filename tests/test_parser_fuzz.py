"""Property tests: whatever the input, the parser and lint answer with diagnostics, never an
exception (and never the `internal_error` safety net, which would mean a bug was swallowed)."""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akm.format.diagnostics import CODES
from akm.format.grammar import STEP_KEYS, UNIT_KEYS
from akm.format.lint import lint_text
from akm.format.parse import parse_workflow

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(text: str) -> None:
    result = parse_workflow(text, "fuzz.md")
    n_lines = text.count("\n") + text.count("\r") + 1
    for d in result.errors + result.warnings:
        assert d.code in CODES and d.code != "internal_error", (d.code, d.message)
        assert 1 <= d.line <= n_lines, (d.code, d.line, n_lines)
        assert d.message
    assert (result.document is None) == bool(result.errors)
    assert len(result.errors) <= 51
    report = lint_text(text, "fuzz.md")
    assert report.ok == (not result.errors)
    json.dumps(report.model_dump())


# ---- arbitrary text -----------------------------------------------------------------------

MARKDOWNISH = st.sampled_from(
    [
        "---",
        "---\n",
        "\n",
        "\r\n",
        "## ",
        "### gate",
        "# ",
        "```",
        "~~~",
        "steps:",
        "  - id: a",
        "- ",
        ": ",
        "{",
        "}",
        "[",
        "]",
        "&a",
        "*a",
        "!!",
        "\t",
        "\ufeff",
        "Step ID: x",
        "# Workflow: y",
        "a",
        "\x00",
        "\ud800",
    ]
)


@FUZZ
@given(st.text())
def test_arbitrary_text(text: str) -> None:
    check(text)


@FUZZ
@given(st.lists(st.one_of(MARKDOWNISH, st.text(max_size=8)), max_size=40).map("".join))
def test_markdown_shaped_text(text: str) -> None:
    check(text)
    check("---\n" + text)


# ---- arbitrary YAML frontmatter -----------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "on",
            "yes",
            "no",
            "none",
            "10m",
            "1h",
            "0",
            "params.x",
            "steps.a.output",
            "steps.b.output.k[0]",
            "timeout",
            "worktree",
            "continue",
            "vote",
            "",
            "a",
            "b",
            "../x",
            "fast",
        ]
    ),
)
KEYS = st.one_of(
    st.text(max_size=10),
    st.sampled_from(
        STEP_KEYS + UNIT_KEYS + ("steps", "params", "over", "when", "match", "step", "command", "max", "on")
    ),
)
JSONISH = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(KEYS, children, max_size=5)),
    max_leaves=30,
)


def document(frontmatter: object, body: str) -> str:
    return "---\n" + yaml.safe_dump(frontmatter, allow_unicode=True) + "---\n" + body


@FUZZ
@given(JSONISH, st.text(max_size=60))
def test_arbitrary_yaml_frontmatter(frontmatter: object, body: str) -> None:
    check(document(frontmatter, body))


STEP_IDS = st.sampled_from(["a", "b", "c", "d", "x.y", "", "1a"])
REFS = st.sampled_from(
    [
        "steps.a.output",
        "steps.b.output.x",
        "steps.c.output[2]",
        "params.p",
        "params.q",
        "junk",
        "steps.d.output",
        "steps.a.outputs",
    ]
)
UNIT = st.fixed_dictionaries(
    {},
    optional={
        "engine": st.sampled_from(["fast", "Bad_Name", ""]),
        "timeout": st.sampled_from(["10m", "none", 0, 5, "1h", True]),
        "retry": st.one_of(
            JSONISH,
            st.fixed_dictionaries(
                {
                    "max": st.integers(-1, 102),
                    "on": st.lists(st.sampled_from(["timeout", "aborted", "flaky", "timeout"]), max_size=3),
                }
            ),
        ),
        "exec": st.one_of(
            JSONISH,
            st.fixed_dictionaries(
                {"command": st.one_of(st.lists(st.text(max_size=5), max_size=3), st.text(max_size=5))},
                optional={
                    "cwd": st.sampled_from(["a", "../b", "/c", "~", "C:d", ""]),
                    "pass_env": st.lists(st.sampled_from(["A", "A", "1B", ""]), max_size=3),
                    "inherit_env": JSONISH,
                },
            ),
        ),
        "output": JSONISH,
        "env": st.lists(st.sampled_from(["env/a", "env/a", ""]), max_size=3),
        "llm": st.one_of(JSONISH, st.fixed_dictionaries({"extra_params": JSONISH})),
    },
)
STEP = st.fixed_dictionaries(
    {"id": STEP_IDS},
    optional={
        "unit": st.one_of(UNIT, JSONISH),
        "map": st.one_of(
            JSONISH,
            st.fixed_dictionaries(
                {"over": REFS},
                optional={
                    "concurrency": st.integers(-1, 70),
                    "reducer": st.sampled_from(["collect", "vote", "x"]),
                    "unit": UNIT,
                },
            ),
        ),
        "route": st.one_of(
            JSONISH,
            st.fixed_dictionaries(
                {
                    "input": REFS,
                    "when": st.lists(st.fixed_dictionaries({"match": SCALARS, "step": STEP_IDS}), max_size=3),
                },
                optional={"default": STEP_IDS},
            ),
        ),
        "inputs": st.one_of(st.lists(REFS, max_size=3), JSONISH),
        "output": JSONISH,
        "gate": st.one_of(JSONISH, st.fixed_dictionaries({"max_loops": st.integers(-1, 102)})),
    },
)
BODY = st.lists(
    st.tuples(
        st.sampled_from(["## a", "## b", "## c", "## d", "## x.y", "# h1", "### gate", "```", "text", ""]),
        st.text(max_size=10),
    ),
    max_size=12,
).map(lambda parts: "\n".join(f"{h}\n{t}" for h, t in parts))


@FUZZ
@given(
    st.lists(STEP, min_size=1, max_size=6),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["p", "q", "bad-name"]), JSONISH, max_size=3)),
    BODY,
)
def test_random_step_lists(steps: list, params: object, body: str) -> None:
    frontmatter: dict = {"steps": steps}
    if params is not None:
        frontmatter["params"] = params
    check(document(frontmatter, body))


# ---- no false positives: generated valid workflows parse clean --------------------------------

PROSE = st.text(alphabet=st.sampled_from("abc XYZ.,-_*\t"), min_size=1, max_size=40).filter(lambda s: s.strip())


@st.composite
def valid_workflows(draw):
    n = draw(st.integers(1, 6))
    ids = [f"s{i}" for i in range(n)]
    steps, body, expected = [], ["", "# Title", "", draw(PROSE), ""], {}
    for i, sid in enumerate(ids):
        step: dict = {"id": sid}
        kind = draw(st.sampled_from(["unit", "map", "route"] if i < n - 1 else ["unit", "map"]))
        if kind == "route":
            later = ids[i + 1 :]
            targets = draw(st.lists(st.sampled_from(later), min_size=1, max_size=3))
            step["route"] = {
                "input": "params.mode",
                "when": [{"match": f"m{j}", "step": t} for j, t in enumerate(targets)],
            }
            if draw(st.booleans()):
                step["route"]["default"] = draw(st.sampled_from(later))
        else:
            unit: dict = {}
            if draw(st.booleans()):
                unit["exec"] = {"command": draw(st.lists(PROSE, min_size=1, max_size=3))}
            else:
                unit["model"] = "m"
            unit["timeout"] = draw(st.sampled_from(["10m", "none", 250, "90s", "5000ms"]))
            if draw(st.booleans()):
                unit["retry"] = {"max": draw(st.integers(0, 100)), "on": ["timeout"]}
            if kind == "map":
                step["map"] = {"over": "params.items", "concurrency": draw(st.integers(1, 64)), "unit": unit}
            else:
                step["unit"] = unit
            earlier = [s for s in ids[:i]]
            if earlier and draw(st.booleans()):
                step["inputs"] = sorted(
                    set(f"steps.{s}.output" for s in draw(st.lists(st.sampled_from(earlier), min_size=1)))
                )
            step["output"] = {"type": "object"}
        if kind != "route" or draw(st.booleans()):
            text = draw(PROSE)
            expected[sid] = text.strip("\n") if kind != "route" else None
            body += [f"## {sid}", "", text, ""]
            if draw(st.booleans()):
                body += ["### gate", "", draw(PROSE), ""]
        steps.append(step)
    fm = {"params": {"items": {"type": "array"}, "mode": {"type": "string"}}, "steps": steps}
    return document(fm, "\n".join(body)), expected


@FUZZ
@given(valid_workflows())
def test_generated_valid_workflows_parse_clean(case) -> None:
    text, expected = case
    result = parse_workflow(text, "gen.md")
    assert result.errors == [], [(d.code, d.line, d.message) for d in result.errors]
    assert result.warnings == []
    doc = result.document
    assert [s.id for s in doc.steps] == [f"s{i}" for i in range(len(doc.steps))]
    for step in doc.steps:
        if expected.get(step.id) is not None:
            assert step.instructions.text == expected[step.id]  # one-line prose comes back byte-exact
