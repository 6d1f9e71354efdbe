"""Every corpus/current workflow can be driven to `completed` by a scripted agent (issue 9 acceptance).

The agent does what an MCP client would: start the run, read `next`, report a schema-valid result for every
session unit and an accepting verdict for every gate, and continue the run until it completes.
"""

from __future__ import annotations

import shutil

import pytest

from akm import api
from tests.conftest import CORPUS
from tests.schema_examples import example

FILES = sorted((CORPUS / "current").glob("*.md")) if (CORPUS / "current").is_dir() else []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_scripted_agent_completes_every_corpus_workflow(project, path):
    from akm.format.schema import validate_instance

    wf = project / path.name
    shutil.copy(path, wf)
    plan, _ = api.compile_workflow_file(wf)
    params = {name: example(schema, i) for i, (name, schema) in enumerate((plan.param_schemas or {}).items())}
    # The agent reads the plan like a careful author would: where a later fan-out iterates over a field of
    # a step's output, that step's answer carries the list (an open `type: object` schema does not say so).
    fan_out_fields: dict[str, list[str]] = {}
    for step in plan.steps:
        over = getattr(step.root, "over", None)
        if over and over.startswith("steps."):
            source, _, rest = over[len("steps."):].partition(".output")
            fan_out_fields.setdefault(source, []).append(rest.lstrip("."))
    res = api.run_workflow(str(wf), params=params, cwd=str(project))
    rid = res.run.run_id
    for _ in range(200):
        if res.run.status == "completed":
            break
        assert res.run.status == "awaiting_session", res.run
        brief = api.next_brief(rid).to_json()
        if brief["kind"] == "judge":
            api.report_unit(rid, brief["judge"]["unitId"], status="completed", verdict={"complete": True},
                            has_verdict=True, cwd=str(project))
        else:
            assert brief["kind"] == "units", brief
            for i, unit in enumerate(brief["units"]):
                value = example(unit["outputSchema"], i) if unit["outputSchema"] else f"done: {unit['unitId']}"
                for field in fan_out_fields.get(brief["stepId"], []):
                    value = {**(value if isinstance(value, dict) else {}), field: [f"item-{k}" for k in range(2)]}
                if unit["outputSchema"]:
                    assert validate_instance(value, unit["outputSchema"]) == []
                out = api.report_unit(rid, unit["unitId"], status="completed", result=value, has_result=True,
                                      expect_step=brief["stepId"], cwd=str(project))
                assert out.recorded == "written"
        res = api.run_workflow(rid, cwd=str(project))
    assert res.run.status == "completed", res.run
    assert all(s.status in ("completed", "skipped") for s in res.run.steps)
