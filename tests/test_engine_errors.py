"""unit outputs that are valid JSON but break canonicalisation crash the engine or strand rows."""

from __future__ import annotations

import pytest

from akm.errors import AkmError
from tests.test_engine import db_rows, py, run, steps_of, write_wf

DEEP = py('import json; v = 0\nfor _ in range(80): v = [v]\nprint(json.dumps(v))')


def test_deeply_nested_output_consumed_later_is_not_an_internal_error(project):
    """A 80-deep JSON artifact (valid JSON, fine for the output schema) is fed to a later step.

    canonical.normalize refuses depth > 64 with CanonicalError (a ValueError), which
    build_work_list / UnitHasher do not catch: the drive dies with a non-AkmError
    (CLI exit 70 + traceback) on every re-run, instead of failing the step.
    """
    wf = write_wf(project, "deep.md", f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {DEEP} }} }}
            output: {{ type: array }}
          - id: b
            inputs: [steps.a.output]
            unit: {{ exec: {{ command: {py('print("ok")')} }} }}
        """, "## a\n\nx\n\n## b\n\nx")
    try:
        res = run(wf, project)
    except AkmError:
        return  # a clean user-facing error is acceptable
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"engine raised a non-AkmError: {type(exc).__name__}: {exc}")
    assert res.run.status == "failed"


def test_deeply_nested_vote_values_do_not_crash_reduce(project):
    wf = write_wf(project, "deepvote.md", f"""
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
        """, "## v\n\nx")
    try:
        res = run(wf, project, params={"xs": [1, 2, 3]})
    except AkmError:
        return
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"engine raised a non-AkmError: {type(exc).__name__}: {exc}")
    assert res.run.status in ("completed", "failed")


def test_out_of_range_number_does_not_strand_a_running_row(project):
    """stdout `1e400` is one valid JSON value; json.loads makes it inf and compact_json refuses it.

    The exception is raised while building finish_unit's arguments, so the row is never
    finished: it stays `running` after the invocation has exited (and is reported stale later).
    """
    wf = write_wf(project, "inf.md", f"""
        steps:
          - id: a
            unit:
              exec: {{ command: {py('print("1e400")')} }}
              output: {{ type: number }}
        """, "## a\n\nx")
    res = run(wf, project)
    assert res.run.status == "failed"
    assert db_rows("SELECT status FROM units") != [("running",)], steps_of(res)["a"]["notes"]


def test_nul_in_exec_cwd_is_a_unit_failure_not_an_internal_error(project):
    """Lint accepts `cwd: "sub\\0dir"`; exec's os.path.realpath raises ValueError, which nothing catches
    (serial path: exception escapes drive_run -> CLI exit 70; the unit row is left `running`)."""
    (project / "nul.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: ["true"]\n        cwd: "sub\\0dir"\n'
        "---\n\n## a\n\nx\n", encoding="utf-8")
    try:
        res = run(project / "nul.md", project)
    except AkmError:
        res = None
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"engine raised a non-AkmError: {type(exc).__name__}: {exc}; "
                    f"unit rows: {db_rows('SELECT unit_id, status FROM units')}")
    if res is not None:
        assert res.run.status == "failed"
    assert ("running",) not in db_rows("SELECT status FROM units")
