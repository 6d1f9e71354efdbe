"""a step whose evidence exceeds 1 MiB behaves differently on resume than live.

The artifact (900 KB, under the 1 MiB capture cap) appears twice in the evidence (output and
the unit entry), so the evidence passes its 1 MiB bound and is abridged."""

from __future__ import annotations

from tests.helpers import py, run, steps_of, write_wf

BIG = py('import json; print(json.dumps({"kind": "small", "blob": "x" * 900_000}))')
KIND = py('import json,os; print(json.loads(os.environ["AKM_INPUTS"])["steps.a.output.kind"])')


def _wf(project):
    return write_wf(
        project,
        "big.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {BIG} }} }}
            output: {{ type: object }}
          - id: b
            inputs: [steps.a.output.kind]
            unit: {{ exec: {{ command: {KIND} }} }}
        """,
        "## a\n\nbig\n\n## b\n\nuse kind",
    )


def test_large_output_reference_live(project):
    """Control: in one invocation step b sees a's full artifact."""
    res = run(_wf(project), project)
    assert res.run.status == "completed", steps_of(res)["b"]["notes"]
    assert steps_of(res)["b"]["output"] == "small"


def test_large_output_reference_after_stop_and_rerun(project):
    """Stopping between a and b (kill -9, --max-steps, timeout) must not change what b sees."""
    first = run(_wf(project), project, max_steps=1)
    assert first.run.status == "active" and steps_of(first)["a"]["status"] == "completed"
    res = run(first.run.run_id, project)
    assert res.run.status == "completed", steps_of(res)["b"]["notes"]
    assert steps_of(res)["b"]["output"] == "small"
