"""Live progress in a real pseudo-terminal (pexpect): `workflow run`'s step board and `status --watch`.

The board is drawn on stderr only when stderr is a terminal, redrawn in place (cursor up, erase
below). Units that must wait
wait for a file the test creates, never for a time window.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import py, write_wf

pexpect = pytest.importorskip("pexpect")

ERASE_BELOW = "\x1b[J"
DEADLINE_S = 120


def flow(project, *, wait_for: str | None = None, first_waits: bool = True) -> None:
    """Two steps: a map of three units (each waits for the file `wait_for` when given, the first one too
    unless `first_waits` is false), then a solo step."""
    wait = ""
    if wait_for:
        skip = "" if first_waits else "os.environ['AKM_ITEM'] != '1' and "
        wait = f"import os, time\nwhile {skip}not os.path.exists({wait_for!r}): time.sleep(0.05)\n"
    write_wf(
        project,
        "flow.md",
        """
        steps:
          - id: fan
            map:
              over: params.items
              concurrency: 1
              unit: { exec: { command: %s } }
            output: { type: array }
          - id: last
            unit: { exec: { command: %s } }
            output: { type: string }
        params:
          items: { type: array, items: { type: integer }, default: [1, 2, 3] }
        """
        % (py(wait + "import json; print(json.dumps('done'))"), py("import json; print(json.dumps('end'))")),
        "## fan\n\nFan out.\n\n## last\n\nFinish.",
    )


def spawn(akm, *args: str) -> "pexpect.spawn":
    return pexpect.spawn(
        akm.argv0[0],
        [*akm.argv0[1:], *args],
        cwd=str(akm.cwd),
        env=akm.env,
        encoding="utf-8",
        dimensions=(30, 110),
        timeout=DEADLINE_S,
    )


def finish(child) -> str:
    child.expect(pexpect.EOF)
    child.close()
    return child.before


def test_workflow_run_draws_a_step_board_in_place_on_a_terminal(akm, project):
    flow(project, wait_for="go", first_waits=False)
    child = spawn(akm, "workflow", "run", "flow.md")
    child.expect(r"running\s+fan\s+1/\d units")  # drawn while the run goes: the first unit finished
    (project / "go").write_text("", encoding="utf-8")
    out = child.before + child.after + finish(child)
    assert child.exitstatus == 0, out
    assert ERASE_BELOW in out and "A" + ERASE_BELOW in out  # redrawn in place: up over the last board, erase
    assert "\x1b[?25l" not in out  # the cursor is never hidden (a killed run cannot leave it hidden)
    final = out[out.rindex("akm run ") :]
    board = final[: final.index("\nrun ")]  # the final board, left on screen, then the result on stdout
    assert "2 step(s) finished, 4 unit(s) done" in board
    lines = [line for line in board.splitlines() if line.strip().startswith("completed")]
    assert [line.split()[1] for line in lines] == ["fan", "last"]
    assert "3/3 units" in lines[0] and "1/1 units" in lines[1]
    assert final[final.index("\nrun ") :].split()[2] == "completed"  # `run RUN  completed  (flow.md)`


def test_no_board_when_stderr_is_not_a_terminal_and_verbose_keeps_its_lines(akm, project):
    flow(project)
    piped = akm("workflow", "run", "flow.md", check=0)
    assert "\x1b" not in piped.stderr and "akm run" not in piped.stderr and "[fan" not in piped.stderr
    child = spawn(akm, "workflow", "run", "flow.md", "--new", "--verbose")
    out = finish(child)
    assert child.exitstatus == 0, out
    assert ERASE_BELOW not in out and "akm run " not in out  # --verbose on a terminal: plain lines, no board
    assert "[fan 3/3]" in out and "[last] step completed" in out


def _wait_until(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _started_run(akm, project):
    """A run driven by another process, its first unit waiting for the file `go`: (process, run id)."""
    flow(project, wait_for="go")
    driver = akm.popen("workflow", "run", "flow.md")

    def first_unit_started():
        runs = akm.json("workflow", "list")["runs"]
        if not runs:
            return None
        rid = runs[0]["runId"]
        page = akm.json("log", "--run", rid)
        return rid if any(e["eventType"] == "workflow_unit_started" for e in page["events"]) else None

    return driver, _wait_until(first_unit_started, "the driven run's first unit to start")


def test_status_watch_follows_a_run_driven_elsewhere_until_it_finishes(akm, project):
    driver, rid = _started_run(akm, project)
    try:
        child = spawn(akm, "workflow", "status", rid, "--watch")
        child.expect(f"akm run {rid[:8]} ")  # the short id (a unique prefix) keeps the header in 80 columns
        child.expect(r"running\s+fan\s+0/1 units")  # the unit in flight, read from the journal
        (project / "go").write_text("", encoding="utf-8")
        out = finish(child)
        assert child.exitstatus == 0, out
        board = out[out.rindex("akm run ") :]
        assert "2 step(s) finished" in board and "3/3 units" in board
        assert f"run {rid}  completed" in out  # then the status text, as without --watch
    finally:
        (project / "go").write_text("", encoding="utf-8")
        driver.communicate(timeout=DEADLINE_S)
    # On a pipe the watch prints one line per event instead (here: the whole finished history).
    piped = akm("workflow", "status", rid, "--watch", "--format", "json", check=0)
    assert "\x1b" not in piped.stderr and "[fan] step completed" in piped.stderr
    assert piped.stderr.rstrip().endswith(f"run {rid} is completed")
    assert json.loads(piped.stdout)["status"] == "completed"


def test_ctrl_c_ends_a_watch_quietly_with_130_and_leaves_the_run_alone(akm, project):
    driver, rid = _started_run(akm, project)
    try:
        child = spawn(akm, "workflow", "status", rid, "--watch")
        child.expect(r"running\s+fan")
        child.sendintr()
        out = finish(child)
        assert child.exitstatus == 130, out
        assert "Traceback" not in out and "interrupted" not in out and "error" not in out
        assert "akm run " in out  # the board it drew stays on screen
        assert akm.json("workflow", "status", rid)["status"] == "active"  # the run goes on
    finally:
        (project / "go").write_text("", encoding="utf-8")
        driver.communicate(timeout=DEADLINE_S)
    assert driver.returncode == 0


def test_watch_of_an_unknown_run_is_a_coded_error(akm):
    out = akm("workflow", "status", "00000000-0000-4000-8000-000000000000", "--watch")
    assert out.returncode == 1 and "error[RUN_NOT_FOUND]" in out.stderr and "Traceback" not in out.stderr


def test_the_board_escapes_what_a_terminal_would_act_on():
    from akm.report.live import Board

    board = Board(started=0.0, clock=lambda: 2.0)
    board.event(
        {
            "eventType": "workflow_unit_started",
            "ts": "1970-01-01T00:00:01Z",
            "metadata": {"stepId": "evil\x1b[2J\u202e", "unitId": "u"},
        }
    )
    lines = board.lines(100, 20)
    assert all("\x1b" not in line and "\u202e" not in line for line in lines)
    assert any("evil\\x1b[2J\\u202e" in line for line in lines)


def test_the_board_shows_what_a_running_agent_unit_is_doing_until_it_finishes():
    from akm.report.live import Board

    board = Board(started=0.0, clock=lambda: 9.0)

    def ev(kind: str, **meta) -> str | None:
        return board.event({"eventType": kind, "ts": "1970-01-01T00:00:01Z", "metadata": {"stepId": "code", **meta}})

    ev("workflow_unit_started", unitId="code:solo")
    line = ev(
        "workflow_unit_activity", unitId="code:solo", turns=2, toolCalls=1, tool="Bash", retries=1, retryStatus=429
    )
    assert line == "[code] code:solo: turn 2 · 1 tool call (last Bash) · 1 retry (HTTP 429)"
    assert any("turn 2 · 1 tool call (last Bash)" in row for row in board.lines(120, 20))
    ev("workflow_unit_finished", unitId="code:solo", status="completed")
    assert not any("turn 2" in row for row in board.lines(120, 20))  # a finished unit is doing nothing
