"""`workflow run --detach` starts the driver in the background; `workflow wait` waits for the run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

from akm import api, cli
from tests.helpers import process_gone, py, wait_until, write_wf


def fan(project: Path, starts: Path, release: Path | None = None, count: int = 4) -> Path:
    hold = (
        f"\nwhile not pathlib.Path({str(release)!r}).exists() and time.time() < end: time.sleep(0.05)"
        if release
        else ""
    )
    body = (
        f"import json, os, pathlib, time; item = json.loads(os.environ['AKM_ITEM']); end = time.time() + 120\n"
        f"open({str(starts)!r}, 'a').write(item + '\\n'){hold}\nprint(item)"
    )
    return write_wf(
        project,
        "fan.md",
        f"""
        params:
          xs: {{ type: array, default: {json.dumps([f"i{n}" for n in range(count)])} }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 2
              unit: {{ exec: {{ command: {py(body)} }} }}
        """,
        "## each\n\nE.",
    )


def test_detach_prints_the_run_id_at_once_and_wait_returns_its_exit_status(akm, project, tmp_path):
    fan(project, tmp_path / "starts")
    t0 = time.monotonic()
    detached = akm.json("workflow", "run", "fan.md", "--detach")
    took = time.monotonic() - t0
    assert detached["status"] == "active" and detached["started"] is True and detached["pid"] > 0
    log = Path(detached["log"])
    assert log.parent == akm.data_dir / "logs" and log.name == f"{detached['runId']}.log"
    waited = akm("workflow", "wait", detached["runId"], "--format", "json", "--timeout", "120s", timeout=180)
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["run"]["status"] == "completed"
    assert "each 4/4" in log.read_text() or "[each" in log.read_text()  # the driver's --verbose lines
    again = akm.json("workflow", "run", detached["runId"], "--detach")  # a finished run gets no driver
    assert again["status"] == "completed" and again["pid"] is None
    assert took < 60  # measured by hand: about 0.3 s; the bound only catches a detach that drives in the foreground


def test_wait_times_out_with_124_and_a_kill_9_of_the_detached_driver_redoes_only_in_flight_units(
    akm, project, tmp_path
):
    starts, release = tmp_path / "starts", tmp_path / "release"
    fan(project, starts, release, count=4)
    detached = akm.json("workflow", "run", "fan.md", "--detach")
    rid = detached["runId"]
    wait_until(lambda: starts.exists() and len(starts.read_text().split()) == 2)  # concurrency 2: two in flight
    timed_out = akm("workflow", "wait", rid, "--timeout", "300ms")
    assert timed_out.returncode == 124 and "--timeout expired" in timed_out.stdout
    os.kill(detached["pid"], signal.SIGKILL)
    wait_until(lambda: process_gone(detached["pid"]), what="the killed driver to exit")
    in_flight = set(starts.read_text().split())
    release.write_text("go")
    resumed = akm("workflow", "run", rid, "--format", "json", timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    ran = starts.read_text().split()
    assert sorted(ran) == sorted(list(in_flight) * 2 + [f"i{n}" for n in range(4) if f"i{n}" not in in_flight])


def test_wait_in_process_exit_statuses(project, tmp_path, capsys):
    wf = write_wf(
        project,
        "ask.md",
        """
        steps:
          - id: write
            output: { type: object }
        """,
        "## write\n\nWrite.",
    )
    result = api.run_workflow(str(wf), cwd=str(project))
    rid = result.run.run_id
    assert cli.main(["workflow", "wait", rid]) == 3  # awaiting the calling agent, as `workflow run` exits
    assert "awaiting_session" in capsys.readouterr().out
    api.abandon(rid)
    assert cli.main(["workflow", "wait", rid, "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["run"]["status"] == "abandoned"
    assert cli.main(["workflow", "wait", "00000000-0000-0000-0000-000000000000"]) == 1
    assert "RUN_NOT_FOUND" in capsys.readouterr().err
    assert cli.main(["workflow", "wait", rid, "--timeout", "soon"]) == 2


def test_wait_says_when_nothing_drives_an_active_run(project, tmp_path):
    release = tmp_path / "never"
    fan(project, tmp_path / "starts", release, count=1)
    opened = api.open_run("fan.md", cwd=str(project))  # started, never driven
    waited = api.wait_run(opened.run_id, undriven_after_s=0.3)
    assert waited.undriven and not waited.timed_out and waited.run.status == "active"
    assert api.wait_exit_status(waited) == 5
    con = sqlite3.connect(os.environ["AKM_DATA_DIR"] + "/akm-journal.sqlite3")
    assert con.execute("SELECT COUNT(*) FROM units").fetchone() == (0,)  # opening drives nothing
    con.close()


def test_detach_refuses_bad_input_before_anything_runs(project, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(project)
    fan(project, tmp_path / "starts")
    assert cli.main(["workflow", "run", "fan.md", "--detach", "--xs", "notjson", "--nope", "1"]) == 2
    assert "error[" in capsys.readouterr().err
    assert cli.main(["workflow", "run", "missing.md", "--detach"]) != 0
    assert not (Path(os.environ["AKM_DATA_DIR"]) / "logs").exists()
