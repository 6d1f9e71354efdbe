"""Every current corpus file compiles to a plan that round-trips; legacy files upgrade to clean files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from akm.format.lint import lint_text
from akm.format.parse import parse_workflow
from akm.plan.compile import compile_plan
from akm.plan.model import Plan
from tests.helpers import CORPUS, ROOT, corpus_files, needs_shared

CURRENT = corpus_files("current")
LEGACY = corpus_files("legacy")


@pytest.mark.parametrize("path", CURRENT + [ROOT / "examples" / "hello.md"], ids=lambda p: p.name)
def test_compiles_and_round_trips(path: Path):
    parsed = parse_workflow(path.read_text(encoding="utf-8"), str(path))
    assert parsed.errors == [] and parsed.document is not None
    plan = compile_plan(parsed.document, title=path.stem)
    text = plan.canonical()
    again = Plan.model_validate(json.loads(text))
    assert again.canonical() == text and again.plan_hash() == plan.plan_hash()
    assert [s.step_id for s in plan.steps] == [s.id for s in parsed.document.steps]
    # compiling twice is deterministic
    assert (
        compile_plan(parse_workflow(path.read_text(encoding="utf-8"), str(path)).document, title=path.stem).plan_hash()
        == plan.plan_hash()
    )


def test_exec_only_example_freezes_without_engines():
    path = ROOT / "examples" / "hello.md"
    plan = compile_plan(parse_workflow(path.read_text(), str(path)).document, title="hello")
    assert plan.execution.engines == {}
    greet = plan.step("greet")
    assert greet.root.kind == "map" and greet.root.concurrency == 4
    assert greet.root.template.exec.timeout_ms == 600_000 and greet.root.template.invocation is None
    assert plan.step("names").root.output_schema == {"type": "array", "items": {"type": "string"}}  # D5


@needs_shared()
@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.name)
def test_legacy_refused_then_upgraded_by_the_cli(akm, project, path: Path):
    target = project / path.name
    shutil.copy(path, target)
    refused = akm.json("workflow", "lint", path.name, check=1)
    codes = [e["code"] for e in refused["files"][0]["errors"]]
    assert codes == ["legacy_format"]
    assert "workflow upgrade" in refused["files"][0]["errors"][0]["hint"]
    akm("workflow", "upgrade", path.name, "--write", check=0)
    assert akm.json("workflow", "lint", path.name)["ok"] is True
    assert lint_text(target.read_text(), str(target)).ok
    run = akm("workflow", "run", path.name, "--format", "json")
    assert run.returncode == 3, run.stderr  # agent work: parked for the calling session
    assert json.loads(run.stdout)["run"]["status"] == "awaiting_session"


@needs_shared()
def test_the_shared_corpus_is_present():
    """The corpus lives beside the checkout (../shared): outside CI its absence skips with the reason,
    in CI it fails here (the parametrized tests above would otherwise just run zero cases)."""
    assert len(CURRENT) >= 15 and len(LEGACY) >= 5, f"corpus not found at {CORPUS}"
