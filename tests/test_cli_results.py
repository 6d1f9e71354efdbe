"""Text mode shows what a run produced: step outputs, retries and gate loops, the final artifact (issue 6 item 12)."""

from __future__ import annotations

import shutil

from tests.helpers import ROOT

FLAKY_AND_LOOPING = """\
---
steps:
  - id: flaky
    unit:
      exec:
        command: [python3, -c, "import pathlib, sys; p = pathlib.Path('tries'); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); sys.exit(1 if n < 2 else 0) if n < 2 else print('third time lucky')"]
      retry: { max: 3, on: [non_zero_exit] }
  - id: shape
    unit:
      exec:
        command: [python3, -c, "import json, pathlib; p = pathlib.Path('loops'); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); print(json.dumps(5 if n == 0 else 'a string'))"]
    output: { type: string }
    gate: { max_loops: 2 }
  - id: long
    unit:
      exec:
        command: [python3, -c, "import json; print(json.dumps('\\\\n'.join(f'line {i}' for i in range(100))))"]
    output: { type: string }
---
## flaky
f
## shape
s
## long
l
"""


def test_run_text_shows_outputs_attempts_loops_and_the_result(cli, project):
    (project / "w.md").write_text(FLAKY_AND_LOOPING)
    out = cli("workflow", "run", "w.md", check=0).stdout
    assert "third time lucky" in out, out
    flaky_line = next(line for line in out.splitlines() if " flaky " in line)
    assert "1 unit, 3 attempts" in flaky_line, out
    shape_line = next(line for line in out.splitlines() if " shape " in line)
    assert "1 unit, 2 attempts, 2 gate loops" in shape_line, out
    assert "a string" in out
    # long outputs are clipped, and the user is told how to get all of them
    assert "line 3" in out and "line 99" not in out.split("result")[0]
    run_id = out.split()[1]
    assert f"akm workflow status {run_id} --format json" in out
    # the final artifact of the run
    assert "result (output of step long):" in out


def test_status_text_shows_the_same_outputs(cli, project):
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    run_id = cli.json("workflow", "run", "hello.md", "--count", "2")["run"]["runId"]
    out = cli("workflow", "status", run_id, check=0).stdout
    assert '["friend-1", "friend-2"]' in out and "Hello, friend-2!" in out, out
    assert "result (output of step small-party):" in out and "Tea for a few." in out
    greet = next(line for line in out.splitlines() if " greet " in line)
    assert "2 units" in greet and "attempts" not in greet  # no retries: no attempt count


def test_json_step_views_carry_the_tallies(cli, project):
    (project / "w.md").write_text(FLAKY_AND_LOOPING)
    view = cli.json("workflow", "run", "w.md")["run"]
    tallies = {s["id"]: (s["unitCount"], s["attempts"], s["gateLoops"]) for s in view["steps"]}
    assert tallies == {"flaky": (1, 3, 1), "shape": (1, 2, 2), "long": (1, 1, 1)}
    assert view["outputStepId"] == "long" and view["output"].startswith("line 0\nline 1")
