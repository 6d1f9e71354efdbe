"""Units run at the project root whatever directory `workflow run` is typed in (issue 6 item 1)."""

from __future__ import annotations

import os

from tests.helpers import py, run, steps_of, write_wf


def _project_with_subdir(project):
    (project / ".git").mkdir()  # marks the project root
    (project / "pkg" / "inner").mkdir(parents=True)
    return project / "pkg"


def test_units_run_at_the_project_root_from_a_subdirectory(project):
    sub = _project_with_subdir(project)
    wf = write_wf(
        project,
        "where.md",
        f"""
        steps:
          - id: here
            unit: {{ exec: {{ command: {py("import os; print(os.getcwd())")} }} }}
          - id: inner
            unit: {{ exec: {{ command: {py("import os; print(os.getcwd())")}, cwd: pkg/inner }} }}
        """,
        "## here\n\nx\n\n## inner\n\ny",
    )
    res = run(os.path.relpath(wf, sub), sub)
    assert res.run.status == "completed"
    outs = steps_of(res)
    assert outs["here"]["output"] == os.path.realpath(project)
    assert outs["inner"]["output"] == os.path.realpath(project / "pkg" / "inner")


def test_one_run_uses_one_directory_across_invocations(project):
    """Started in a subdirectory, continued from the root: both steps ran in the same place."""
    sub = _project_with_subdir(project)
    wf = write_wf(
        project,
        "two.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("import os; print(os.getcwd())")} }} }}
          - id: b
            unit: {{ exec: {{ command: {py("import os; print(os.getcwd())")} }} }}
        """,
        "## a\n\nx\n\n## b\n\ny",
    )
    first = run(os.path.relpath(wf, sub), sub, max_steps=1)
    assert [s.status for s in first.run.steps] == ["completed", "pending"]
    second = run(first.run.run_id, project)
    outs = steps_of(second)
    assert outs["a"]["output"] == outs["b"]["output"] == os.path.realpath(project)
