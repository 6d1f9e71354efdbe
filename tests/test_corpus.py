"""The shared corpus: every current workflow parses with zero errors; every legacy one is refused
with exactly `legacy_format`."""

from __future__ import annotations

from pathlib import Path

import pytest

from akm.format.lint import lint_paths
from akm.format.parse import parse_workflow
from tests.helpers import CORPUS, corpus_files, needs_shared

CURRENT = corpus_files("current")
LEGACY = corpus_files("legacy")

pytestmark = needs_shared()


@pytest.mark.parametrize("path", CURRENT, ids=[p.name for p in CURRENT])
def test_current_corpus_parses_clean(path: Path) -> None:
    result = parse_workflow(path.read_text(encoding="utf-8"), str(path))
    assert result.errors == [], [(d.code, d.line, d.message) for d in result.errors]
    doc = result.document
    assert doc is not None and doc.steps
    for step in doc.steps:
        if step.kind != "route":
            assert step.instructions is not None and step.instructions.text.strip()
    for w in result.warnings:
        assert w.code in ("missing_output_schema", "undeclared_output_field")
    # issue 33: the corpus's own case of a fan-out over a field its upstream schema does not declare
    undeclared = [w.line for w in result.warnings if w.code == "undeclared_output_field"]
    assert bool(undeclared) == (path.name == "github-issues-parallel-implementer.md"), undeclared


@pytest.mark.parametrize("path", LEGACY, ids=[p.name for p in LEGACY])
def test_legacy_corpus_is_refused_with_one_code(path: Path) -> None:
    result = parse_workflow(path.read_text(encoding="utf-8"), str(path))
    assert [d.code for d in result.errors] == ["legacy_format"]
    assert result.document is None
    assert "akm workflow upgrade" in result.errors[0].hint


def test_corpus_specifics() -> None:
    by_name = {p.name: p for p in CURRENT}
    gated = parse_workflow(by_name["gated-agent.md"].read_text(), "g.md").document
    assert gated.steps[0].gate_rubric.text == "- The result contains `qa-agent-success`."
    typed = parse_workflow(by_name["typed-route.md"].read_text(), "t.md").document
    choose = typed.steps[0]
    assert choose.kind == "route" and choose.instructions is None
    assert [(b.match, b.step) for b in choose.route.when] == [("true", "finish")]
    fixture = parse_workflow(by_name["all-types-workflow.md"].read_text(), "a.md").document
    assert fixture.updated == "2025-06-01" and fixture.title == "All Types Fixture"


def test_lint_directories_skip_readme(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# not a workflow\n")
    sub = tmp_path / "nested"
    sub.mkdir()
    for p in CURRENT[:3]:
        (sub / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("ignored")
    report = lint_paths([str(tmp_path)])
    assert report.ok is True
    assert sorted(Path(f.path).name for f in report.files) == sorted(p.name for p in CURRENT[:3])
    both = lint_paths([str(tmp_path), str(CORPUS / "legacy")])
    assert both.ok is False and len(both.files) == 3 + len(LEGACY)
