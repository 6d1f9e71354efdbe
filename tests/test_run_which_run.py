"""Which run `workflow run FILE` continues, warnings on stderr, and `--new` (issue 6 items 3 and 4)."""

from __future__ import annotations

import json
import sqlite3
import threading

from akm import paths
from akm.errors import UsageError
from tests.helpers import py, run, write_wf

TWO_STEPS = """\
---
params:
  who: { type: string, default: world }
steps:
  - id: a
    unit:
      exec: { command: [python3, -c, "import json,os; print(json.dumps(json.loads(os.environ['AKM_PARAMS'])['who']))"] }
    output: { type: string }
  - id: b
    unit:
      exec: { command: [python3, -c, "print(2)"] }
    output: { type: integer }
---
## a
a
## b
b
"""


def _wf(project):
    (project / "two.md").write_text(TWO_STEPS)
    return "two.md"


EDITABLE = """\
---
steps:
  - id: a
    unit: { exec: { command: [python3, -c, "print(1)"] } }
    output: { type: integer }
  - id: b
    unit: { exec: { command: [python3, -c, "print('Tea for a few.')"] } }
    output: { type: string }
---
## a
a
## b
b
"""


def test_edited_file_warning_is_on_stderr_in_text_mode_and_names_from(cli, project):
    wf = project / "e.md"
    wf.write_text(EDITABLE.replace("print('Tea for a few.')", "import json; print(json.dumps('Tea for a few.'))"))
    cli("workflow", "run", "e.md", "--max-steps", "1", check=4)
    wf.write_text(wf.read_text().replace("Tea for a few.", "Coffee for a few."))
    proc = cli("workflow", "run", "e.md", check=0)
    assert "changed since run" in proc.stderr, proc.stderr
    rid = json.loads(cli("workflow", "list", "--format", "json", check=0).stdout)["runs"][0]["runId"]
    assert f"akm workflow run e.md --from {rid}" in proc.stderr, proc.stderr  # a new run reusing what is unchanged
    assert "Tea for a few." in proc.stdout  # the frozen plan ran (and text mode shows the output)
    fresh = cli.json("workflow", "run", "e.md", "--new")
    assert fresh["started"] is True
    assert {s["id"]: s["output"] for s in fresh["run"]["steps"]}["b"] == "Coffee for a few."


def test_lint_warnings_of_the_workflow_are_printed_on_stderr_in_text_mode(cli, project):
    (project / "w.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      exec: { command: [python3, -c, 'print(1)'] }\n---\n## a\nx\n"
    )
    proc = cli("workflow", "run", "w.md", check=0)
    assert "warning:" in proc.stderr and "missing_output_schema" in proc.stderr, proc.stderr


def test_other_params_start_their_own_run_beside_a_stopped_one(cli, project):
    wf = _wf(project)
    first = cli.json("workflow", "run", wf, "--who", "alice", "--max-steps", "1", check=4)
    other = cli.json("workflow", "run", wf, "--who", "bob")
    assert other["started"] is True and other["run"]["runId"] != first["run"]["runId"]
    assert other["run"]["status"] == "completed"
    # the stopped run is untouched and still continues with its own params
    again = cli.json("workflow", "run", wf, "--who", "alice")
    assert again["started"] is False and again["run"]["runId"] == first["run"]["runId"]
    assert again["run"]["params"] == {"who": "alice"} and again["run"]["status"] == "completed"


def test_same_params_continue_defaults_included_and_new_forces_a_fresh_run(cli, project):
    wf = _wf(project)
    first = cli.json("workflow", "run", wf, "--max-steps", "1", check=4)
    assert first["run"]["params"] == {"who": "world"}
    same = cli.json("workflow", "run", wf, "--who", "world", "--max-steps", "1", check=0)  # = the default
    assert same["run"]["runId"] == first["run"]["runId"] and same["started"] is False
    forced = cli.json("workflow", "run", wf, "--new", "--max-steps", "1", check=4)
    assert forced["started"] is True and forced["run"]["runId"] != first["run"]["runId"]
    runs = cli.json("workflow", "list", "--active")["runs"]
    assert [r["runId"] for r in runs] == [forced["run"]["runId"]]


def test_the_same_file_spelled_from_a_subdirectory_continues_without_a_changed_warning(cli, project, monkeypatch):
    """The plan must not depend on how the path was spelled: `two.md` from the root and `../two.md`
    from a subdirectory are one unchanged file (main warned "changed since" and named --new)."""
    (project / ".git").mkdir()
    wf = _wf(project)
    first = cli.json("workflow", "run", wf, "--max-steps", "1", check=4)
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    proc = cli("workflow", "run", "../" + wf, check=0)
    assert "changed since" not in proc.stderr, proc.stderr
    assert first["run"]["runId"] in proc.stdout and "completed" in proc.stdout


def test_new_with_a_run_id_is_a_usage_error(cli, project):
    wf = _wf(project)
    run_id = cli.json("workflow", "run", wf, "--max-steps", "1", check=4)["run"]["runId"]
    proc = cli("workflow", "run", run_id, "--new", check=2)
    assert "NEW_RUN_NEEDS_WORKFLOW" in proc.stderr


def test_two_identical_starts_racing_end_with_one_run(project):
    wf = write_wf(
        project,
        "race.md",
        f"""
        params:
          who: {{ type: string }}
        steps:
          - id: hello
            unit: {{ exec: {{ command: {py('print("hi")')} }} }}
        """,
        "## hello\n\nx",
    )
    run(wf, project, param_pairs=[("who", "zed")], max_steps=0)  # creates the journal
    lock = sqlite3.connect(paths.journal_path(), isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")  # both starts queue on the write lock, whatever order they reach it
    outcomes: list = []

    def start() -> None:
        try:
            outcomes.append(run(wf, project, param_pairs=[("who", "alice")]))
        except UsageError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    lock.execute("COMMIT")
    lock.close()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    con = sqlite3.connect(paths.journal_path())
    alice = con.execute(
        "SELECT id, status FROM runs WHERE params_json = ?", (json.dumps({"who": "alice"}, separators=(",", ":")),)
    ).fetchall()
    con.close()
    assert len(alice) == 1 and alice[0][1] == "completed", alice
    for o in outcomes:  # each either drove it, found it done, or was told another driver holds it
        assert (isinstance(o, UsageError) and o.code == "LEASE_HELD") or o.run.run_id == alice[0][0], o
