"""unit outputs that are valid JSON but break canonicalisation crash the engine or strand rows."""

from __future__ import annotations

import pytest

from akm.errors import AkmError
from tests.helpers import db_rows, py, run, steps_of, write_wf

DEEP = py("import json; v = 0\nfor _ in range(80): v = [v]\nprint(json.dumps(v))")


def test_deeply_nested_output_consumed_later_is_not_an_internal_error(project):
    """A 80-deep JSON artifact (valid JSON, fine for the output schema) is fed to a later step.

    canonical.normalize refuses depth > 64 with CanonicalError (a ValueError), which
    build_work_list / UnitHasher do not catch: the drive dies with a non-AkmError
    (CLI exit 70 + traceback) on every re-run, instead of failing the step.
    """
    wf = write_wf(
        project,
        "deep.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {DEEP} }} }}
            output: {{ type: array }}
          - id: b
            inputs: [steps.a.output]
            unit: {{ exec: {{ command: {py('print("ok")')} }} }}
        """,
        "## a\n\nx\n\n## b\n\nx",
    )
    res = run(wf, project)  # no error at all: the step that cannot hash its input fails
    assert res.run.status == "failed"
    steps = steps_of(res)
    assert steps["a"]["status"] == "completed"
    assert steps["b"]["status"] == "failed"
    assert steps["b"]["notes"] == 'Step "b" cannot identify its units: value nests deeper than 64 levels.'


def test_deeply_nested_vote_values_do_not_crash_reduce(project):
    wf = write_wf(
        project,
        "deepvote.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: v
            map:
              over: params.xs
              reducer: vote
              unit:
                exec: {{ command: {DEEP} }}
                output: {{ type: array }}
        """,
        "## v\n\nx",
    )
    res = run(wf, project, params={"xs": [1, 2, 3]})
    assert res.run.status == "failed"
    notes = steps_of(res)["v"]["notes"]
    assert "3 succeeded, 0 failed" in notes
    assert "vote failed: a unit result cannot be compared (value nests deeper than 64 levels)" in notes


def test_out_of_range_number_does_not_strand_a_running_row(project):
    """stdout `1e400` is one valid JSON value; json.loads makes it inf and compact_json refuses it.

    The exception is raised while building finish_unit's arguments, so the row is never
    finished: it stays `running` after the invocation has exited (and is reported stale later).
    """
    wf = write_wf(
        project,
        "inf.md",
        f"""
        steps:
          - id: a
            unit:
              exec: {{ command: {py('print("1e400")')} }}
              output: {{ type: number }}
        """,
        "## a\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert db_rows("SELECT status FROM units") != [("running",)], steps_of(res)["a"]["notes"]


def test_nul_in_exec_cwd_is_a_lint_error_and_nothing_runs(project):
    """`cwd: "sub\\0dir"` once passed lint and crashed exec's os.path.realpath at run time."""
    (project / "nul.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: ["true"]\n        cwd: "sub\\0dir"\n'
        "---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    with pytest.raises(AkmError) as info:
        run(project / "nul.md", project)
    assert info.value.code == "WORKFLOW_INVALID"
    assert "unit.exec.cwd contains a NUL character" in info.value.message
    assert "[exec_cwd_not_relative]" in info.value.message
    assert db_rows("SELECT status FROM units") == []
