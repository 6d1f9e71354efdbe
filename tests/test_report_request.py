"""A report is one request through api, engine and store, and decides its step once (issue 36).

* The api takes the request model itself (what the MCP tool validates) or its fields, and answers the same.
* The engine decides a step once per report: after its write (under the finalize lock), never before it for
  a unit's result, and the brief a report answers with is built from that same decision. A verdict decides
  before its write (what it judges) and after it (what the verdict made of the step), as the drive loop does.
* The engine's session protocol returns typed records; the camelCase JSON keys are written by the api's
  views alone (an error's `details` excepted: they are the error contract's).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from akm import api
from akm.engine import current_step
from tests.test_session import start

ENGINE = Path(__file__).resolve().parent.parent / "akm" / "engine"
PROTOCOL = ("session", "session_types", "briefs", "current_step", "resends", "report_values", "report_finish")

MAP = """
    params:
      xs: { type: array }
    steps:
      - id: m
        map: { over: params.xs }
    """


@pytest.fixture
def decisions(monkeypatch):
    """How many times the step was decided (`decide_step` itself runs, counted)."""
    calls: list[str] = []
    real = current_step.decide_step

    def counted(**kw):
        decision = real(**kw)
        calls.append(decision.kind)
        return decision

    monkeypatch.setattr(current_step, "decide_step", counted)
    return calls


def test_the_request_model_and_its_fields_are_one_report(project):
    from akm.api._models import ReportRequest

    rid = start(project, MAP, "## m\n\nDo it.", xs=["a", "b"])
    units = [u.unit_id for u in api.next_brief(rid).units]
    by_model = api.report_unit(ReportRequest(run_id=rid, unit_id=units[0], result="A", cwd=str(project)))
    by_fields = api.report_unit(rid, units[1], result="B", cwd=str(project))
    assert by_model.recorded == by_fields.recorded == "written"
    assert (by_model.remaining_units, by_model.step_outcome) == (1, None)
    assert by_fields.step_outcome is not None and by_fields.step_outcome.kind == "completed"
    again = api.report_unit(ReportRequest(run_id=rid, unit_id=units[0], result="A", cwd=str(project)))
    assert again.recorded == "idempotent"


def test_a_unit_report_decides_its_step_once_after_its_write(project, decisions):
    rid = start(project, MAP, "## m\n\nDo it.", xs=["a", "b", "c"])
    units = [u.unit_id for u in api.next_brief(rid).units]
    decisions.clear()
    claim = api.report_unit(rid, units[0], status="running", cwd=str(project))
    assert claim.recorded == "heartbeat" and claim.remaining_units == 3
    assert decisions == []  # a claim finishes nothing: it decides nothing
    api.report_unit(rid, units[0], result="A", cwd=str(project))
    assert decisions == ["work"]
    api.report_unit(rid, units[1], result="B", cwd=str(project))
    api.report_unit(rid, units[2], result="C", cwd=str(project))
    assert decisions == ["work", "work", "complete"]


def test_the_brief_a_report_answers_with_is_not_decided_again(project, decisions):
    rid = start(project, "steps:\n  - id: d\n    gate: { max_loops: 2 }", "## d\n\nDraft.\n\n### gate\n\n- Good.")
    decisions.clear()
    out = api.report_unit(rid, "d:solo", result="draft", cwd=str(project))
    assert out.step_outcome is not None and out.step_outcome.kind == "awaiting_verdict"
    assert out.brief is not None and out.brief.kind == "judge" and out.brief.judge is not None
    assert decisions == ["judge"]
    decisions.clear()
    verdict = {"complete": False, "missing": ["more"], "feedback": "Again."}
    out = api.report_unit(rid, out.brief.judge.unit_id, verdict=verdict, cwd=str(project))
    assert out.step_outcome is not None and out.step_outcome.kind == "next_loop"
    assert out.brief is not None and out.brief.units[0].attempt_id == "d:solo~l2"
    # before the write: the artifact awaits this verdict; after it: the next loop's work
    assert decisions == ["judge", "work"]


def _camel_keys(path: Path) -> list[str]:
    """camelCase string keys of the dict literals in a module, an error's `details=` excepted."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    details = {
        id(kw.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "details"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and id(node) not in details:
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    text = key.value
                    if text[:1].islower() and any(c.isupper() for c in text) and text.isalnum():
                        found.append(f"{path.name}:{key.lineno} {text!r}")
    return found


def test_the_engine_session_protocol_writes_no_front_json():
    found = [k for name in PROTOCOL for k in _camel_keys(ENGINE / f"{name}.py")]
    assert not found, "camelCase keys belong in the api's views (akm/api/_briefs.py):\n" + "\n".join(found)
    assert _camel_keys(Path(api.__file__).parent / "_briefs.py"), "the check finds what it looks for"
