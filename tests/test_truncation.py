"""Output over the capture cap is data, not a silent success (issue 6 items 6, 7, 8).

What a step gets (spec/engine.md §4 "exec units"): without an output schema the unit completes
with the first 1 MiB of its stdout as its artifact — no marker inside it — and the unit row,
the `workflow_unit_finished` event, the step evidence, the step summary, `status --units` and a
warning all say it was truncated. With a schema the unit fails `exec_output_limit`.
"""

from __future__ import annotations

import json
import sys

from akm import api
from akm.cli import main
from akm.dispatch.exec import STDOUT_CAPTURE_BYTES
from tests.helpers import db_rows, run, steps_of, write_wf

PY = sys.executable


def writer(n_bytes: int, prefix: str = "") -> str:
    code = (
        f"import sys\nsys.stdout.write({prefix!r})\nb = sys.stdout.buffer\nsys.stdout.flush()\n"
        f"for _ in range({n_bytes // 65536}): b.write(b'a' * 65536)\n"
    )
    return json.dumps([PY, "-c", code])


def test_truncated_stdout_completes_marked_as_truncated_everywhere(project, capsys):
    wf = write_wf(
        project,
        "big.md",
        f"""
        steps:
          - id: dump
            unit: {{ exec: {{ command: {writer(3 * 1024 * 1024)} }} }}
        """,
        "## dump\n\nx",
    )
    warnings: list[str] = []
    res = run(wf, project, on_warning=lambda w: warnings.append(w.message))  # api.RunWarning
    assert res.run.status == "completed"
    step = steps_of(res)["dump"]
    assert step["output"] == "a" * STDOUT_CAPTURE_BYTES  # the beginning, and nothing else in it
    assert "Output truncated at the capture cap" in step["summary"] and "dump:solo" in step["summary"]
    assert any("dump:solo: its output was cut at the capture limit" in w for w in warnings)
    assert any("cut at the capture limit" in w for w in res.warnings)

    assert db_rows("SELECT unit_id, status, truncated FROM units") == [("dump:solo", "completed", 1)]
    (evidence,) = db_rows("SELECT evidence_json FROM steps WHERE step_id = 'dump'")[0]
    evidence = json.loads(evidence)
    assert evidence["truncatedUnits"] == ["dump:solo"]  # kept even when the 1 MiB bound abridges the rest
    (meta,) = db_rows("SELECT metadata_json FROM events WHERE event_type = 'workflow_unit_finished'")[0]
    assert json.loads(meta)["truncated"] is True

    assert main(["workflow", "status", res.run.run_id, "--units", "--format", "json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [(u["unitId"], u["truncated"]) for u in view["units"]] == [("dump:solo", True)]
    assert main(["workflow", "status", res.run.run_id, "--units"]) == 0
    assert "unit dump:solo: completed (output truncated at the capture cap)" in capsys.readouterr().out


def test_plain_status_text_says_a_step_output_was_cut(project, capsys):
    """Without --units the step line and the result header say the output is only a beginning."""
    wf = write_wf(
        project,
        "big.md",
        f"""
        steps:
          - id: dump
            unit: {{ exec: {{ command: {writer(2 * 1024 * 1024)} }} }}
        """,
        "## dump\n\nx",
    )
    res = run(wf, project)
    assert [s["truncatedUnits"] for s in res.run.to_json()["steps"]] == [1]
    assert main(["workflow", "status", res.run.run_id]) == 0
    out = capsys.readouterr().out
    assert "completed  dump  — 1 unit; output of 1 unit cut at the capture cap (only its beginning was kept)" in out
    assert "result (output of step dump; only its beginning: cut at the capture cap):" in out


def test_output_under_the_cap_is_not_marked(project):
    wf = write_wf(
        project,
        "small.md",
        f"""
        steps:
          - id: say
            unit: {{ exec: {{ command: {writer(65536)} }} }}
        """,
        "## say\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "completed" and "truncated" not in steps_of(res)["say"]["summary"]
    assert db_rows("SELECT truncated FROM units") == [(0,)]
    assert api.run_status(res.run.run_id, units=True).units[0].truncated is False


def test_truncated_stdout_with_a_schema_fails_exec_output_limit(project):
    wf = write_wf(
        project,
        "schema.md",
        f"""
        steps:
          - id: data
            unit: {{ exec: {{ command: {writer(2 * 1024 * 1024, "[")} }} }}
            output: {{ type: array }}
        """,
        "## data\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert db_rows("SELECT status, failure_reason FROM units") == [("failed", "exec_output_limit")]
    assert "exec_output_limit" in steps_of(res)["data"]["notes"]


def test_each_units_journal_row_is_bounded_in_a_fan_out(project):
    """A 6-wide fan-out of 3 MiB outputs journals at most the 1 MiB cap per unit (it was 8 MiB)."""
    wf = write_wf(
        project,
        "fan.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: fan
            map:
              over: params.xs
              concurrency: 6
              unit: {{ exec: {{ command: {writer(3 * 1024 * 1024)} }} }}
        """,
        "## fan\n\nx",
    )
    res = run(wf, project, params={"xs": list(range(6))})
    assert res.run.status == "completed"
    sizes = db_rows("SELECT length(result_json), truncated FROM units")
    assert len(sizes) == 6
    assert all(size <= STDOUT_CAPTURE_BYTES + 2 and cut == 1 for size, cut in sizes), sizes
    (evidence,) = db_rows("SELECT evidence_json FROM steps WHERE step_id = 'fan'")[0]
    assert len(json.loads(evidence)["truncatedUnits"]) == 6


def test_a_secret_cut_by_the_cap_does_not_leak_into_the_artifact_or_the_journal(project):
    secret = "sk-live-0123456789abcdefghij"
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "api.env").write_text(f"TOKEN={secret}\n", encoding="utf-8")
    for kept in (1, 5, len(secret) - 1):
        code = (
            "import os, sys\nsys.stdout.write('x' * "
            + str(STDOUT_CAPTURE_BYTES - kept)
            + " + os.environ['TOKEN'] + 'tail')\n"
        )
        wf = write_wf(
            project,
            f"leak{kept}.md",
            f"""
            steps:
              - id: echo
                unit:
                  env: [env/api]
                  exec: {{ command: {json.dumps([PY, "-c", code])} }}
            """,
            "## echo\n\nx",
        )
        res = run(wf, project)
        output = steps_of(res)["echo"]["output"]
        assert output == "x" * (STDOUT_CAPTURE_BYTES - kept) + "[REDACTED]", kept
        assert not any(
            secret[:kept] in (row[0] or "")[-64:]
            for row in db_rows("SELECT result_json FROM units WHERE unit_id = 'echo:solo'")
        )


def test_a_secret_in_a_huge_stderr_does_not_leak_into_the_failure_diagnostic(project):
    """The diagnostic shows stderr's end; on main it showed the end of the first 8 MiB, cut mid-secret."""
    secret = "sk-live-0123456789abcdefghij"
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "api.env").write_text(f"TOKEN={secret}\n", encoding="utf-8")
    code = (
        "import os, sys\nsys.stderr.write('y' * (8 * 1024 * 1024 - 7) + os.environ['TOKEN'] + 'z' * 10)\nsys.exit(1)\n"
    )
    wf = write_wf(
        project,
        "err.md",
        f"""
        steps:
          - id: fail
            unit:
              env: [env/api]
              exec: {{ command: {json.dumps([PY, "-c", code])} }}
        """,
        "## fail\n\nx",
    )
    res = run(wf, project)
    notes = steps_of(res)["fail"]["notes"]
    assert "exited 1" in notes and "[REDACTED]" in notes
    assert secret[:7] not in notes and secret[:7] not in db_rows("SELECT result_json FROM units")[0][0]
