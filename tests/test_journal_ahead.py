"""Rows journaled ahead (akm.engine.ahead): a fan-out of quick units shares transactions.

A worker whose last unit ran in a few milliseconds journals its next units' rows with the current
one and runs them without writing in between. What must hold: every row is committed before its
unit starts, every result is journaled, nothing stays `running` when a pass stops, and a step whose
units are slow, retried or isolated keeps one transaction per unit.
"""

from __future__ import annotations

import itertools
import json
import threading

from akm.engine.cancel import Cancellation
from akm.plan.identity import item_unit_id
from akm.store import units
from tests.helpers import bare_run, db_rows, run, wait_until, write_wf


def _fan(project, name, *, command, width=2, extra=""):
    return write_wf(
        project,
        name,
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: fan
            map:
              over: params.xs
              concurrency: {width}
              unit:
                exec: {{ command: {command} }}
                {extra}
        """,
        "## fan\n\nOne command per item.",
    )


def _started_runs(run_id: str) -> int:
    """The longest stretch of consecutive `workflow_unit_started` events written by one statement."""
    rows = db_rows("SELECT event_type, ts FROM events WHERE run_id = ? ORDER BY id", run_id)
    longest = 0
    for (kind, _ts), group in itertools.groupby(rows):
        if kind == "workflow_unit_started":
            longest = max(longest, len(list(group)))
    return longest


def _unit_rows(run_id: str) -> list[tuple]:
    return db_rows("SELECT unit_id, status, failure_reason, attempts FROM units WHERE run_id = ?", run_id)


def _events_per_unit(run_id: str) -> dict[str, list[str]]:
    per: dict[str, list[str]] = {}
    for kind, meta in db_rows(
        "SELECT event_type, metadata_json FROM events WHERE run_id = ? AND event_type LIKE 'workflow_unit_%' "
        "ORDER BY id",
        run_id,
    ):
        per.setdefault(json.loads(meta)["unitId"], []).append(kind)
    return per


def _quick_pace(monkeypatch) -> None:
    """ "Quick" is a pace (10 ms a unit, a 30 ms window); a busy CI box spawns `true` slower than that, and a unit
    that outlasts the window has its lane's rows taken back and journaled again. A test about what quick units
    do sets the pace it means to see rather than depend on the machine's."""
    from akm.engine import ahead

    monkeypatch.setattr(ahead, "AHEAD_FAST_S", 1.0)
    monkeypatch.setattr(ahead, "AHEAD_WINDOW_S", 3.0)


def test_a_quick_fan_out_journals_rows_ahead_and_every_unit_once(project, monkeypatch):
    _quick_pace(monkeypatch)
    wf = _fan(project, "quick.md", command='["true"]')
    res = run(wf, project, params={"xs": list(range(200))})
    assert res.run.status == "completed"
    rows = _unit_rows(res.run.run_id)
    assert len(rows) == 200 and {r[1] for r in rows} == {"completed"} and {r[3] for r in rows} == {1}
    per = _events_per_unit(res.run.run_id)
    assert len(per) == 200
    assert all(kinds == ["workflow_unit_started", "workflow_unit_finished"] for kinds in per.values())
    # A transaction that journals units ahead writes their started events in one statement, with one stamp:
    # 1 + AHEAD_UNITS of them in a row, where one unit per transaction never writes more than the width.
    assert _started_runs(res.run.run_id) > 2


def test_switched_off_every_unit_keeps_a_transaction_of_its_own(project, monkeypatch):
    monkeypatch.setenv("AKM_JOURNAL_AHEAD", "0")
    wf = _fan(project, "off.md", command='["true"]')
    res = run(wf, project, params={"xs": list(range(100))})
    assert res.run.status == "completed"
    assert len(_unit_rows(res.run.run_id)) == 100
    assert _started_runs(res.run.run_id) <= 2  # at most the width's first inserts coincide


def test_slow_units_keep_a_transaction_each(project):
    wf = _fan(project, "slow.md", command='["sleep", "0.05"]')
    res = run(wf, project, params={"xs": list(range(12))})
    assert res.run.status == "completed"
    assert _started_runs(res.run.run_id) <= 2  # at most the width's first inserts coincide


def test_a_step_with_retries_keeps_a_transaction_per_unit(project):
    wf = _fan(project, "retry.md", command='["true"]', extra="retry: { max: 2, on: [non_zero_exit] }")
    res = run(wf, project, params={"xs": list(range(60))})
    assert res.run.status == "completed"
    assert _started_runs(res.run.run_id) <= 2


def test_fail_fast_closes_the_rows_journaled_ahead(project, monkeypatch):
    _quick_pace(monkeypatch)
    # unit 40 fails under on_error: fail: no unit starts after it, and the rows journaled ahead of it are
    # closed failed/not_run (their dispatch taken back) rather than left running
    wf = _fan(project, "failfast.md", command='["sh", "-c", "[ \\"$AKM_ITEM_INDEX\\" != 40 ]"]', width=1)
    res = run(wf, project, params={"xs": list(range(100))})
    assert res.run.status == "failed"
    rows = _unit_rows(res.run.run_id)
    assert not [r for r in rows if r[1] == "running"]
    failed = [r for r in rows if r[1] == "failed"]
    assert [r[2] for r in failed].count("non_zero_exit") == 1
    assert {r[2] for r in failed} <= {"non_zero_exit", "not_run"}
    assert all(r[3] == 0 for r in failed if r[2] == "not_run")  # journaled ahead, never run: no dispatch counted
    assert len([r for r in rows if r[1] == "completed"]) == 40  # width 1: every unit before it, none after
    per = _events_per_unit(res.run.run_id)
    assert all(kinds == ["workflow_unit_started", "workflow_unit_finished"] for kinds in per.values())


def test_a_cancelled_pass_leaves_no_row_running_and_the_run_resumes(project):
    wf = _fan(project, "cancel.md", command='["true"]')
    cancel = Cancellation()
    seen = []

    def progress(event):
        if getattr(event, "attempt_id", None):
            seen.append(event)
            if len(seen) == 50:
                cancel.trip("test")

    first = run(wf, project, params={"xs": list(range(300))}, cancel=cancel, on_progress=progress)
    run_id = first.run.run_id
    assert first.run.status == "active"
    rows = _unit_rows(run_id)
    assert not [r for r in rows if r[1] == "running"]
    done_before = {r[0] for r in rows if r[1] == "completed"}
    assert 50 <= len(done_before) < 300
    second = run(run_id, project)
    assert second.run.status == "completed"
    rows = {r[0]: r for r in _unit_rows(run_id)}
    assert len(rows) == 300 and {r[1] for r in rows.values()} == {"completed"}
    assert all(rows[u][3] == 1 for u in done_before)  # completed work is not dispatched again


def _new_run(journal, run_id):
    bare_run(journal, run_id, step_ids=["fan"])


def test_write_attempts_finishes_and_inserts_in_one_transaction(journal):
    _new_run(journal, "r1")
    a = units.insert_unit(journal, run_id="r1", unit_id="fan.unit:a", step_id="fan", node_id="fan.unit")
    b = units.insert_unit(journal, run_id="r1", unit_id="fan.unit:b", step_id="fan", node_id="fan.unit")
    finishes = [
        units.UnitFinish(run_id="r1", unit_id="fan.unit:a", started_at=a, status="completed", step_id="fan"),
        units.UnitFinish(
            run_id="r1", unit_id="fan.unit:b", started_at="1999-01-01T00:00:00.000Z", status="completed", step_id="fan"
        ),
    ]
    new = [units.NewAttempt("r1", f"fan.unit:{c}", "fan", "fan.unit") for c in "cde"]
    finished, stamps = units.write_attempts(journal, finishes, new)
    assert finished == ["finished", "superseded"]  # b's stamp is not this dispatch's: left alone
    assert len(stamps) == 3 and len(set(stamps)) == 1
    status = dict(db_rows_of(journal, "SELECT unit_id, status FROM units WHERE run_id = 'r1'"))
    assert status == {
        "fan.unit:a": "completed",
        "fan.unit:b": "running",
        "fan.unit:c": "running",
        "fan.unit:d": "running",
        "fan.unit:e": "running",
    }
    kinds = [r[0] for r in db_rows_of(journal, "SELECT event_type FROM events WHERE run_id = 'r1' ORDER BY id")]
    assert kinds[-4:] == ["workflow_unit_finished"] + ["workflow_unit_started"] * 3
    assert units.finish_unit(journal, run_id="r1", unit_id="fan.unit:b", started_at=b, status="failed") == "finished"


def test_write_attempts_rolls_back_whole_when_an_insert_is_refused(journal):
    import pytest

    from akm.errors import AkmError
    from akm.store import runs

    _new_run(journal, "r2")
    a = units.insert_unit(journal, run_id="r2", unit_id="fan.unit:a", step_id="fan", node_id="fan.unit")
    finish = units.UnitFinish(run_id="r2", unit_id="fan.unit:a", started_at=a, status="completed", step_id="fan")
    not_the_holder = runs.Fence("someone-else", 7)  # the run has no lease: a fenced insert is refused
    with pytest.raises(AkmError) as refused:
        units.write_attempts(
            journal, [finish], [units.NewAttempt("r2", "fan.unit:b", "fan", "fan.unit")], fence=not_the_holder
        )
    assert refused.value.code == "LEASE_LOST"
    rows = dict(db_rows_of(journal, "SELECT unit_id, status FROM units WHERE run_id = 'r2'"))
    assert rows == {"fan.unit:a": "running"}  # the finish rolled back with the refused insert


def db_rows_of(db, sql):
    return [tuple(r) for r in db.query(sql)]


def test_a_slow_unit_holds_back_neither_results_nor_rows_journaled_ahead(project, tmp_path):
    # Items 0-3 are quick; item 4 waits until the test releases it. Rows journaled ahead of it were
    # meant for quick units: while it runs, the results finished before it are journaled and the rows
    # after it stop reading `running` (closed not_run, journaled again when their turn comes).
    flags = tmp_path / "flags"
    flags.mkdir()
    script = (
        f'if [ "$AKM_ITEM_INDEX" = 4 ]; then touch {flags}/started; while [ ! -e {flags}/go ]; do sleep 0.01; done; fi'
    )
    wf = _fan(project, "slowmid.md", command=json.dumps(["sh", "-c", script]), width=1)
    seen: dict[str, list] = {}

    def watch():
        wait_until(lambda: (flags / "started").exists(), what="item 4 to start")
        seen["rows"] = wait_until(
            _settled_around_the_slow_one, what="the results before item 4 journaled and no other row running"
        )
        (flags / "go").touch()

    t = threading.Thread(target=watch)
    t.start()
    try:
        res = run(wf, project, params={"xs": list(range(12))})
    finally:
        (flags / "go").touch()
        t.join()
    assert res.run.status == "completed"
    assert {r[1] for r in _unit_rows(res.run.run_id)} == {"completed"}
    assert "rows" in seen


def _unit_rows_by_item() -> dict[int, str]:
    rows = db_rows("SELECT unit_id, status FROM units")
    by_id = {uid: status for uid, status in rows}
    return {i: by_id.get(item_unit_id("fan.unit", i)) for i in range(12)}


def _settled_around_the_slow_one() -> dict[int, str | None] | None:
    """The rows by item once items 0-3 are journaled completed and item 4 is the only one running."""
    rows = _unit_rows_by_item()
    before = all(rows[i] == "completed" for i in range(4))
    running = [i for i, status in rows.items() if status == "running"]
    return rows if before and running == [4] else None


def test_a_quick_failure_does_not_journal_the_next_units_ahead(project):
    wf = _fan(
        project,
        "quickfail.md",
        command='["sh", "-c", "[ \\"$AKM_ITEM_INDEX\\" = 0 ] && exit 3; sleep 0.05"]',
        width=1,
        extra="on_error: continue",
    )
    res = run(wf, project, params={"xs": list(range(6))})
    assert _started_runs(res.run.run_id) == 1  # one transaction per unit: no prediction from a failure
