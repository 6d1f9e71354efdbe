"""Chaos (issue 33): kill -9 during rewinds and during `--from` runs — on SQLite and on PostgreSQL.

Each iteration kills, at a random instant, `workflow rewind RUN --to fan`, then the `workflow run RUN` that
restores what the rewind superseded, then `workflow run FILE --from RUN` of an edited copy; after each kill the
journal must hold either the old run or the rewound one (one transaction), no completed unit row may be lost
(every one ever seen is still there, in force or superseded, with its stamp), and no unit that could be reused
may run: every execution is appended to a file outside the journal, and only the edited step ever adds a line.
`AKM_CHAOS_ITERATIONS` sets the number of iterations (default 4; CI keeps it modest), `AKM_CHAOS_SEED` the seed.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import open_at

TOOL = """
import json, os, sys
mode = sys.argv[1]
with open(sys.argv[2], "a") as log:
    log.write((mode if mode != "fan" else "fan " + os.environ["AKM_ITEM"]) + "\\n")
inputs = json.loads(os.environ.get("AKM_INPUTS", "{}"))
if mode == "fan":
    print(json.loads(os.environ["AKM_ITEM"]) * 2)
elif mode == "total":
    print(sum(inputs["steps.fan.output"]))
else:
    print(json.dumps(mode))
"""


def _workflow(tool: Path, log: Path, last: str) -> str:
    def cmd(mode: str) -> str:
        return json.dumps([sys.executable, str(tool), mode, str(log)])

    return f"""---
params:
  xs: {{ type: array }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: 4
      unit: {{ exec: {{ command: {cmd("fan")} }}, output: {{ type: integer }} }}
    output: {{ type: array }}
  - id: total
    inputs: [steps.fan.output]
    unit: {{ exec: {{ command: {cmd("total")} }} }}
    output: {{ type: integer }}
  - id: last
    inputs: [steps.total.output]
    unit: {{ exec: {{ command: {cmd(last)} }} }}
    output: {{ type: string }}
---

## fan
Double.

## total
Add.

## last
Say.
"""


class Journal:
    """The test's view of the journal the CLI writes (SQLite file or PostgreSQL schema), opened per question."""

    def __init__(self, akm: Any, url: str | None) -> None:
        self.akm, self.url = akm, url

    def rows(self, sql: str, *args: Any) -> list[tuple]:
        if self.url is None:
            con = sqlite3.connect(self.akm.data_dir / "akm-journal.sqlite3")
            try:
                return con.execute(sql, args).fetchall()
            finally:
                con.close()
        journal = open_at(self.url)
        try:
            return [tuple(r) for r in journal.query(sql, args)]
        finally:
            journal.close()

    def completed(self, run_id: str) -> set[tuple[str, str]]:
        """(unit id, started_at) of every completed unit row of the run, in force or superseded."""
        return {
            (u, str(s))
            for u, s in self.rows(
                "SELECT unit_id, started_at FROM units WHERE run_id = ? AND status = 'completed' UNION ALL "
                "SELECT unit_id, started_at FROM superseded_units WHERE run_id = ? AND status = 'completed'",
                run_id,
                run_id,
            )
        }

    def state(self, run_id: str) -> tuple[int, list[tuple], int]:
        """(rewinds, the steps' statuses, units in force) of the run."""
        rewinds = self.rows("SELECT COUNT(*) FROM rewinds WHERE run_id = ?", run_id)[0][0]
        steps = self.rows("SELECT step_id, status FROM steps WHERE run_id = ? ORDER BY sequence_index", run_id)
        units = self.rows("SELECT COUNT(*) FROM units WHERE run_id = ?", run_id)[0][0]
        return int(rewinds), steps, int(units)


def _consistent(j: Journal, run_id: str) -> None:
    """The run's rows agree with each other, whatever instant a kill fell on: its status and current step are
    what its spine says (`runs.derive_run_state`), no step after the current one has a unit row in force, and
    every superseded row belongs to a recorded rewind."""
    from akm.store.runs import Step, derive_run_state

    spine = [
        Step(run_id, sid, int(i), status, None, None, None, at)
        for sid, i, status, at in j.rows(
            "SELECT step_id, sequence_index, status, completed_at FROM steps WHERE run_id = ? ORDER BY sequence_index",
            run_id,
        )
    ]
    ((status, current),) = j.rows("SELECT status, current_step_id FROM runs WHERE id = ?", run_id)
    derived, derived_current, _ = derive_run_state(spine)
    assert current == derived_current, (current, spine)
    assert status == derived or (derived == "active" and status == "awaiting_session"), (status, spine)
    after = [s.step_id for s in spine if current is not None and s.sequence_index > _index(spine, current)]
    for sid in after:
        assert j.rows("SELECT COUNT(*) FROM units WHERE run_id = ? AND step_id = ?", run_id, sid)[0][0] == 0, sid
    orphans = j.rows(
        "SELECT COUNT(*) FROM superseded_units s LEFT JOIN rewinds r ON r.id = s.rewind_id WHERE s.run_id = ? "
        "AND r.id IS NULL",
        run_id,
    )
    assert orphans[0][0] == 0


def _index(spine: list[Any], step_id: str) -> int:
    return next(s.sequence_index for s in spine if s.step_id == step_id)


def _reran(log: Path, executed: list[str]) -> list[str]:
    """Executions beyond the first run's, the edited steps' aside: what ran though it could be reused."""
    lines = sorted(x for x in log.read_text().splitlines() if not x.startswith("edit-"))
    extra = list(lines)
    for x in executed:
        extra.remove(x)
    return extra


def _kill_at_random(akm: Any, rng: random.Random, *args: str) -> None:
    proc = akm.popen(*args)
    time.sleep(rng.uniform(0.05, 0.9))
    proc.kill()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill_9_during_rewinds_and_from_runs_loses_nothing_and_reruns_nothing(akm, project, backend, request):
    url = None
    if backend == "postgres":
        url = request.getfixturevalue("pg_journal_url")
        akm.env["AKM_JOURNAL_URL"] = url
    iterations = int(os.environ.get("AKM_CHAOS_ITERATIONS", "4"))
    rng = random.Random(int(os.environ.get("AKM_CHAOS_SEED", "3333")))
    tool, log = project.parent / "tool.py", project.parent / "executions.log"
    tool.write_text(TOOL)
    (project / "chaos.md").write_text(_workflow(tool, log, "first"))
    xs = json.dumps(list(range(12)))
    first = akm.json("workflow", "run", "chaos.md", "--xs", xs)
    rid = first["run"]["runId"]
    j = Journal(akm, url)
    executed = sorted(log.read_text().splitlines())
    assert len(executed) == 14  # 12 fan units, total, last

    seen = j.completed(rid)
    outcomes = {"rewind killed before its commit": 0, "rewind committed": 0}
    for it in range(iterations):
        # kill -9 during a rewind: the old run or the rewound one, never anything in between
        before = j.state(rid)
        _kill_at_random(akm, rng, "workflow", "rewind", rid, "--to", "fan")
        after = j.state(rid)
        outcomes["rewind killed before its commit" if after[0] == before[0] else "rewind committed"] += 1
        if after[0] == before[0]:
            assert after == before, "a killed rewind changed the run without committing its record"
            akm("workflow", "rewind", rid, "--to", "fan", check=0)
        else:
            assert after[0] == before[0] + 1
            assert [s for _, s in after[1]] == ["pending", "pending", "pending"] and after[2] == 0, after
        assert seen <= j.completed(rid), "a completed unit row was lost"
        _consistent(j, rid)
        # kill -9 while the run restores what the rewind superseded, then let it finish
        _kill_at_random(akm, rng, "workflow", "run", rid)
        _consistent(j, rid)
        assert akm.json("workflow", "run", rid)["run"]["status"] == "completed"
        assert _reran(log, executed) == [], "a unit that could be reused ran again"
        seen = j.completed(rid)
        # kill -9 during `--from` runs of an edited copy; every run they started is then finished
        edited = project / f"edited-{it}.md"
        edited.write_text(_workflow(tool, log, f"edit-{it}"))
        kills = rng.choice([1, 2])
        for _ in range(kills):
            _kill_at_random(akm, rng, "workflow", "run", edited.name, "--xs", xs, "--from", rid)
        new_runs = [r[0] for r in j.rows("SELECT id FROM runs WHERE reuse_from = ?", rid)]
        for new in new_runs:
            _consistent(j, new)
            done = akm("workflow", "run", new, "--format", "json", timeout=120)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["run"]["status"] == "completed"
        akm("workflow", "run", edited.name, "--xs", xs, "--from", rid, check=0)  # one that is never killed
        lines = sorted(log.read_text().splitlines())
        assert _reran(log, executed) == [], "a reusable unit ran in a --from run"
        # the edited step runs once in each run (the killed ones' and the last one's), and once more for each
        # kill that landed while it ran (a loaded box's kills come later in the run: then it is in flight)
        assert 1 <= lines.count(f"edit-{it}") <= len(new_runs) + 1 + kills
        for new in [r[0] for r in j.rows("SELECT id FROM runs WHERE reuse_from = ?", rid)]:
            fan = j.rows(
                "SELECT COUNT(*) FROM units WHERE run_id = ? AND step_id = 'fan' AND reused_from IS NOT NULL", new
            )
            assert fan[0][0] == 12
    print(f"{backend}: {outcomes}")  # shown with -s: how the kills fell
    if url is None:
        assert j.rows("PRAGMA integrity_check") == [("ok",)]
    final = akm.json("workflow", "status", rid)
    assert final["status"] == "completed" and len(final["rewinds"]) >= iterations
