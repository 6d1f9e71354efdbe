"""Param `default:` is applied, recorded and visible; a route `default:` covers an unset param (issue 6 item 2)."""

from __future__ import annotations

import shutil

from akm import api
from tests.helpers import ROOT, py, run, steps_of, write_wf

ECHO_PARAMS = py('import os; print(os.environ["AKM_PARAMS"])')


def test_defaults_are_applied_recorded_and_reach_units(project):
    wf = write_wf(
        project,
        "d.md",
        f"""
        params:
          count: {{ type: integer, minimum: 1, default: 3 }}
          mode: {{ type: string, enum: [fast, slow], default: fast }}
          tags: {{ type: array, items: {{ type: string }} }}
        steps:
          - id: show
            unit: {{ exec: {{ command: {ECHO_PARAMS} }} }}
            output: {{ type: object }}
        """,
        "## show\n\nx",
    )
    res = run(wf, project, param_pairs=[("mode", "slow")])
    assert res.run.status == "completed"
    assert res.run.params == {"mode": "slow", "count": 3}  # the snapshot holds the default
    assert steps_of(res)["show"]["output"] == {"mode": "slow", "count": 3}
    assert api.run_status(res.run.run_id).params == {"mode": "slow", "count": 3}
    typed = run(wf, project, params={})  # the typed (MCP) path applies them too
    assert typed.run.params == {"count": 3, "mode": "fast"}


def test_status_text_shows_the_params_with_defaults(cli, project):
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    run_id = cli.json("workflow", "run", "hello.md")["run"]["runId"]
    text = cli("workflow", "status", run_id, check=0).stdout
    assert 'params: {"count": 3}' in text, text


def test_hello_example_runs_with_its_default(cli, project):
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    assert ".get(" not in (ROOT / "examples" / "hello.md").read_text()  # no hand-coded default
    res = cli.json("workflow", "run", "hello.md")
    steps = {s["id"]: s for s in res["run"]["steps"]}
    assert steps["names"]["output"] == ["friend-1", "friend-2", "friend-3"]


def test_route_default_branch_over_an_unset_optional_param(project):
    wf = write_wf(
        project,
        "r.md",
        f"""
        params:
          mode: {{ type: string }}
        steps:
          - id: pick
            route:
              input: params.mode
              when:
                - {{ match: fast, step: quick }}
              default: careful
          - id: quick
            unit: {{ exec: {{ command: {py('print("quick")')} }} }}
          - id: careful
            unit: {{ exec: {{ command: {py('print("careful")')} }} }}
        """,
        "## quick\n\nq\n\n## careful\n\nc",
    )
    res = run(wf, project)
    assert res.run.status == "completed", [s.model_dump() for s in res.run.steps]
    st = {s.id: s.status for s in res.run.steps}
    assert st == {"pick": "completed", "quick": "skipped", "careful": "completed"}
    fast = run(wf, project, param_pairs=[("mode", "fast")])
    assert {s.id: s.status for s in fast.run.steps}["quick"] == "completed"


def test_route_over_an_unset_param_without_default_branch_fails_clearly(project):
    wf = write_wf(
        project,
        "r2.md",
        f"""
        params:
          mode: {{ type: string }}
        steps:
          - id: pick
            route:
              input: params.mode
              when:
                - {{ match: fast, step: quick }}
          - id: quick
            unit: {{ exec: {{ command: {py('print("quick")')} }} }}
        """,
        "## quick\n\nq",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert "params.mode" in (res.run.steps[0].notes or "")


def test_a_default_that_does_not_fit_its_schema_is_a_lint_error(cli, project):
    (project / "bad.md").write_text(
        "---\nparams:\n  n: { type: integer, minimum: 1, default: 0 }\nsteps:\n  - id: a\n"
        "    unit: { exec: { command: [python3, -c, 'print(1)'] } }\n    output: { type: integer }\n---\n## a\nx\n"
    )
    report = cli.json("workflow", "lint", "bad.md", check=1)
    assert [e["code"] for e in report["files"][0]["errors"]] == ["param_default_invalid"]
    proc = cli("workflow", "run", "bad.md", check=2)
    assert "param_default_invalid" in proc.stderr
