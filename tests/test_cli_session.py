"""The session loop from a shell: `akm workflow next` / `akm workflow report`, as a user types them."""

from __future__ import annotations

import io
import json
import sys

from tests.helpers import py, write_wf
from tests.test_session import journal

FLOW = """
    params:
      files: { type: array, items: { type: string } }
    steps:
      - id: review
        map:
          over: params.files
          unit:
            output: { type: object, required: [verdict], properties: { verdict: { type: string } } }
      - id: write
        gate: { max_loops: 2 }
        output: { type: object, required: [text], properties: { text: { type: string } } }
      - id: show
        unit: { exec: { command: %s } }
        inputs: [steps.write.output]
    """ % py("import os; print(os.environ['AKM_INPUTS'])")

BODY = """
    ## review

    Review the file.

    ## write

    Write a sentence.

    ### gate

    - It says hello

    ## show

    Show.
    """


def start(cli, project, monkeypatch) -> str:
    """Start the run from a subdirectory of a git project, as a user in their repo would."""
    (project / ".git").mkdir()
    write_wf(project, "flow.md", FLOW, BODY)
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    out = cli("workflow", "run", "../../flow.md", "--files", '["a.py", "b.py"]', check=3)
    assert "akm workflow next" in out.stdout
    return cli.json("workflow", "list")["runs"][0]["runId"]


def refused(cli, code: str, *args: str) -> str:
    before = journal()
    out = cli(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"error[{code}]" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert journal() == before, "a refused report changed the journal"
    return out.stderr


def test_the_shell_loop_from_a_subdirectory(cli, project, monkeypatch):
    rid = start(cli, project, monkeypatch)

    text = cli("workflow", "next", rid, check=0).stdout
    assert "needs 2 unit(s)" in text and 'item 0: "a.py"' in text
    assert f"-> akm workflow report {rid} review.unit:" in text and "--expect-step review" in text
    brief = cli.json("workflow", "next", rid)
    assert brief["kind"] == "units" and [u["context"]["itemIndex"] for u in brief["units"]] == [0, 1]

    # --result @FILE is read relative to where the user stands; - reads standard input.
    (project / "src" / "deep" / "a.json").write_text('{"verdict": "fine"}', encoding="utf-8")
    first = cli.json(
        "workflow",
        "report",
        rid,
        brief["units"][0]["unitId"],
        "--status",
        "completed",
        "--result",
        "@a.json",
        "--tokens",
        "12",
        "--expect-step",
        "review",
    )
    assert first["recorded"] == "written" and first["remainingUnits"] == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"verdict": "also fine"}'))
    out = cli(
        "workflow", "report", rid, brief["units"][1]["unitId"], "--status", "completed", "--result", "-", check=0
    ).stdout
    assert out.startswith("written: review.unit:") and "Step review completed" in out
    assert f"-> akm workflow run {rid}" in out

    # A solo unit has no item: the text brief must not invent one.
    text = cli("workflow", "next", rid, check=0).stdout
    assert "== unit write:solo" in text and "item " not in text.split("== unit write:solo")[1].splitlines()[1]
    assert "(gate loop 1 of 2)" in text
    cli("workflow", "report", rid, "write:solo", "--status", "completed", "--result", '{"text": "Goodbye"}', check=0)

    judge = cli("workflow", "next", rid, check=0).stdout
    assert "== verdict write.gate:l1" in judge and "It says hello" in judge
    rejected = cli.json(
        "workflow",
        "report",
        rid,
        "write.gate:l1",
        "--status",
        "completed",
        "--verdict",
        '{"complete": false, "missing": ["hello"], "feedback": "Say hello"}',
    )
    assert rejected["stepOutcome"]["kind"] == "next_loop"
    assert "feedback from the last loop: Say hello" in cli("workflow", "next", rid, check=0).stdout
    cli("workflow", "report", rid, "write:solo", "--status", "completed", "--result", '{"text": "hello"}', check=0)
    accepted = cli.json(
        "workflow",
        "report",
        rid,
        "write.gate:l2",
        "--status",
        "completed",
        "--verdict",
        '{"complete": true, "missing": [], "feedback": ""}',
    )
    assert accepted["stepOutcome"]["kind"] == "completed"

    done = cli.json("workflow", "run", rid)
    assert done["run"]["status"] == "completed"
    assert json.loads(done["run"]["steps"][2]["output"]) == {"steps.write.output": {"text": "hello"}}
    assert cli("workflow", "next", rid, check=0).stdout.splitlines()[1] == f"Run {rid} is completed; no work remains."


def test_shell_reports_refused_with_a_code_and_a_hint_and_nothing_written(cli, project, monkeypatch):
    rid = start(cli, project, monkeypatch)
    unit = cli.json("workflow", "next", rid)["units"][0]["unitId"]
    report = ("workflow", "report", rid, unit, "--status", "completed")

    refused(cli, "RESULT_INVALID", *report, "--result", "{bad")
    refused(cli, "RESULT_REQUIRED", *report)
    assert "akm workflow next RUN" in refused(
        cli, "STEP_MISMATCH", *report, "--result", '{"verdict": "x"}', "--expect-step", "write"
    )
    assert "akm workflow next RUN" in refused(
        cli, "UNKNOWN_UNIT", "workflow", "report", rid, "nope", "--status", "completed", "--result", '{"verdict": "x"}'
    )
    # A token count no journal integer can hold is a usage error, not a crash.
    for tokens in ("99999999999999999999999", "9" * 5000, "-3", "²"):
        refused(cli, "INVALID_ARGUMENT", *report, "--result", '{"verdict": "x"}', "--tokens", tokens)
    (project / "src" / "deep" / "latin1.json").write_bytes(b'{"verdict": "\xff"}')
    refused(cli, "UNREADABLE_FILE", *report, "--result", "@latin1.json")

    cli("workflow", "report", rid, unit, "--status", "completed", "--result", '{"verdict": "x"}', check=0)
    assert "--rerun" in refused(cli, "REPORT_CONFLICT", *report, "--result", '{"verdict": "y"}')
    assert "--rerun" in refused(cli, "UNIT_TERMINAL", "workflow", "report", rid, unit, "--status", "running")
    again = cli.json("workflow", "report", rid, unit, "--status", "completed", "--result", '{"verdict": "x"}')
    assert again["recorded"] == "idempotent"


def test_reports_on_a_failed_run_say_how_to_reopen_it(cli, project, monkeypatch):
    rid = start(cli, project, monkeypatch)
    unit = cli.json("workflow", "next", rid)["units"][0]["unitId"]
    cli("workflow", "report", rid, unit, "--status", "failed", "--failure-reason", "timeout", check=0)
    assert cli.json("workflow", "status", rid)["status"] == "failed"
    err = refused(
        cli, "RUN_NOT_ACTIVE", "workflow", "report", rid, unit, "--status", "completed", "--result", '{"verdict": "x"}'
    )
    assert f"akm workflow resume {rid}" in err
