"""Upstream compatibility (issue 23 item 6): the colon env ref, and gate rows told apart from units."""

from __future__ import annotations

import json
import sys

from akm import api
from akm.format.parse import parse_workflow


def test_the_colon_env_ref_is_read_as_env_slash_name(tmp_path):
    """Upstream freezes and runs `env: [env:secrets]` (native-executor.test.ts); our lint refused it."""
    source = (
        '---\nsteps:\n  - id: a\n    unit:\n      env: ["env:secrets", env/ci, "env:ci"]\n'
        '      exec: { command: ["true"] }\n---\n\n## a\n\nx\n'
    )
    parsed = parse_workflow(source, "wf.md")
    assert parsed.errors == []
    assert parsed.document.steps[0].unit.env == ["env/secrets", "env/ci"]


def test_a_colon_env_ref_binds_the_env_file(tmp_path):
    project = tmp_path / "p"
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "secrets.env").write_text("GREETING=hello-from-env\n", encoding="utf-8")
    (project / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      env: ["env:secrets"]\n      exec:\n        command: '
        + json.dumps([sys.executable, "-c", "import os; print(len(os.environ['GREETING']))"])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    res = api.run_workflow("w.md", cwd=str(project))
    assert res.run.status == "completed" and res.run.steps[0].output == "14"


GATED = '---\nsteps:\n  - id: a\n    unit:\n      exec: { command: ["true"] }\n---\n\n## a\n\nDo a.\n\n### gate\n\n- it is done\n'


def test_status_units_marks_gate_rows_with_their_phase(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "g.md").write_text(GATED, encoding="utf-8")
    run_id = api.run_workflow("g.md", cwd=str(project)).run.run_id
    assert api.next_brief(run_id).to_json()["kind"] == "judge"
    api.report_unit(
        run_id,
        "a.gate:l1",
        status="completed",
        verdict={"complete": True, "missing": [], "feedback": ""},
        cwd=str(project),
    )
    view = api.run_status(run_id, units=True).to_json()
    phases = {u["unitId"]: u["phase"] for u in view["units"]}
    assert phases == {"a:solo": "unit", "a.gate:l1": "gate"}
    assert view["steps"][0]["unitCount"] == 1  # the gate row is no unit
