"""The unit journal: upsert attempts, finish guard, totals, heartbeats, claims (D8, D13, D16)."""

from __future__ import annotations

import pytest

from akm.errors import JournalError
from akm.store import events, units
from tests.helpers import bare_run


@pytest.fixture()
def db(journal):
    bare_run(journal, step_ids=["build", "review"])  # both journals (conftest: sqlite, postgres)
    return journal


def insert(db, unit_id="build:solo", step_id="build", **kw):
    args = dict(
        run_id="r1",
        unit_id=unit_id,
        step_id=step_id,
        node_id=kw.pop("node_id", step_id),
        runner="exec",
        input_hash="h1",
    )
    args.update(kw)
    return units.insert_unit(db, **args)


def unit_events(db, kind):
    return [e for e in events.list_events(db, "r1")[0] if e.event_type == kind]


def test_insert_then_finish(db):
    started = insert(db, engine=None, model=None, worktree_path="/wt/1")
    u = units.get_unit(db, "r1", "build:solo")
    assert (u.status, u.attempts, u.started_at, u.worktree_path, u.input_hash) == ("running", 1, started, "/wt/1", "h1")
    assert unit_events(db, "workflow_unit_started")[0].metadata == {
        "runId": "r1",
        "stepId": "build",
        "unitId": "build:solo",
    }
    out = units.finish_unit(
        db,
        run_id="r1",
        unit_id="build:solo",
        started_at=started,
        status="failed",
        result_json='"boom"',
        tokens=None,
        failure_reason="non_zero_exit",
        session_id="s-1",
    )
    assert out == "finished"
    u = units.get_unit(db, "r1", "build:solo")
    assert (u.status, u.result_json, u.failure_reason, u.session_id) == ("failed", '"boom"', "non_zero_exit", "s-1")
    assert u.finished_at is not None and u.finished_at >= u.started_at
    assert unit_events(db, "workflow_unit_finished")[0].metadata == {
        "runId": "r1",
        "stepId": "build",
        "unitId": "build:solo",
        "status": "failed",
        "failureReason": "non_zero_exit",
    }


def test_reinsert_bumps_attempts_clears_values_and_never_reuses_a_stamp(db):
    first = insert(db)
    units.finish_unit(
        db,
        run_id="r1",
        unit_id="build:solo",
        started_at=first,
        status="completed",
        result_json='{"ok":true}',
        tokens=12,
        session_id="s",
    )
    units.heartbeat_units(db, "r1", ["build:solo"])  # terminal: untouched
    stamps = [first]
    for _ in range(3):  # back-to-back, likely within one millisecond
        stamps.append(insert(db, input_hash="h2", worktree_path="/wt/2"))
    assert len(set(stamps)) == 4 and stamps == sorted(stamps)
    u = units.get_unit(db, "r1", "build:solo")
    assert u.attempts == 4 and u.status == "running" and u.input_hash == "h2"
    assert (u.result_json, u.tokens, u.session_id, u.finished_at, u.last_checkin_at) == (None, None, None, None, None)


def test_finish_guard_superseded_does_not_overwrite(db):
    stale = insert(db)
    fresh = insert(db)  # another driver re-dispatched the same attempt id
    assert (
        units.finish_unit(
            db, run_id="r1", unit_id="build:solo", started_at=stale, status="completed", result_json='"old"'
        )
        == "superseded"
    )
    u = units.get_unit(db, "r1", "build:solo")
    assert u.status == "running" and u.result_json is None and u.started_at == fresh
    assert unit_events(db, "workflow_unit_finished") == []
    assert (
        units.finish_unit(
            db, run_id="r1", unit_id="build:solo", started_at=fresh, status="completed", result_json='"new"', tokens=3
        )
        == "finished"
    )
    # a second finish of the same dispatch is also refused (row no longer running)
    assert units.finish_unit(db, run_id="r1", unit_id="build:solo", started_at=fresh, status="failed") == "superseded"
    assert units.get_unit(db, "r1", "build:solo").result_json == '"new"'
    assert len(unit_events(db, "workflow_unit_finished")) == 1


def test_finish_of_a_vanished_row_is_a_journal_error(db):
    started = insert(db)
    db.execute("DELETE FROM units WHERE unit_id = 'build:solo'")  # simulate an outside deletion
    with pytest.raises(JournalError, match="row is gone"):
        units.finish_unit(db, run_id="r1", unit_id="build:solo", started_at=started, status="completed")
    assert unit_events(db, "workflow_unit_finished") == []


def test_finish_and_insert_is_one_transaction_with_the_same_rows_and_events(db):
    first = insert(db, unit_id="review.unit:aaa", step_id="review", node_id="review.unit")
    done = units.UnitFinish(
        run_id="r1",
        unit_id="review.unit:aaa",
        started_at=first,
        status="failed",
        result_json='"boom"',
        tokens=7,
        failure_reason="non_zero_exit",
        truncated=True,
        step_id="review",
    )
    finished, second = units.finish_and_insert(
        db,
        done,
        run_id="r1",
        unit_id="review.unit:bbb",
        step_id="review",
        node_id="review.unit",
        parent_unit_id="review.map",
        runner="exec",
        input_hash="h2",
    )
    assert finished == "finished"
    a, b = units.get_unit(db, "r1", "review.unit:aaa"), units.get_unit(db, "r1", "review.unit:bbb")
    assert (a.status, a.result_json, a.tokens, a.failure_reason, a.truncated) == (
        "failed",
        '"boom"',
        7,
        "non_zero_exit",
        1,
    )
    assert (b.status, b.started_at, b.parent_unit_id, b.input_hash, b.attempts) == (
        "running",
        second,
        "review.map",
        "h2",
        1,
    )
    kinds = [(e.event_type, e.metadata) for e in events.list_events(db, "r1")[0] if "unit" in e.event_type]
    assert kinds[1:] == [
        (
            "workflow_unit_finished",
            {
                "runId": "r1",
                "stepId": "review",
                "unitId": "review.unit:aaa",
                "status": "failed",
                "failureReason": "non_zero_exit",
                "tokens": 7,
                "truncated": True,
            },
        ),
        ("workflow_unit_started", {"runId": "r1", "stepId": "review", "unitId": "review.unit:bbb"}),
    ]
    # A superseded finish still inserts (and writes no finished event) ...
    stale = units.UnitFinish(run_id="r1", unit_id="review.unit:aaa", started_at=first, status="completed")
    assert (
        units.finish_and_insert(
            db, stale, run_id="r1", unit_id="review.unit:ccc", step_id="review", node_id="review.unit"
        )[0]
        == "superseded"
    )
    assert units.get_unit(db, "r1", "review.unit:ccc").status == "running"
    assert len(unit_events(db, "workflow_unit_finished")) == 1
    # ... while a finish whose row is gone fails the whole write: the next unit is not inserted.
    db.execute("DELETE FROM units WHERE unit_id = 'review.unit:bbb'")
    gone = units.UnitFinish(run_id="r1", unit_id="review.unit:bbb", started_at=second, status="completed")
    with pytest.raises(JournalError, match="row is gone"):
        units.finish_and_insert(
            db, gone, run_id="r1", unit_id="review.unit:ddd", step_id="review", node_id="review.unit"
        )
    assert units.get_unit(db, "r1", "review.unit:ddd") is None
    assert [e for e in unit_events(db, "workflow_unit_started") if e.metadata["unitId"] == "review.unit:ddd"] == []


def test_unit_event_metadata_is_the_compact_json_of_its_fields(db):
    from akm.canonical import compact_json

    odd = 'u"\\\u2028é\x01'  # quotes, backslash, a JS line separator, non-ASCII, a control character
    started = insert(db, unit_id=odd, step_id=None, node_id="n")
    units.finish_unit(db, run_id="r1", unit_id=odd, started_at=started, status="completed", tokens=0, step_id=None)
    raw = [
        r["metadata_json"]
        for r in db.query("SELECT metadata_json FROM events WHERE event_type LIKE 'workflow_unit_%' ORDER BY id")
    ]
    assert raw == [
        compact_json({"runId": "r1", "stepId": None, "unitId": odd}),
        compact_json({"runId": "r1", "stepId": None, "unitId": odd, "status": "completed", "tokens": 0}),
    ]


def test_get_units_order_and_totals(db):
    s1 = insert(db, unit_id="review.unit:aaa", step_id="review", node_id="review.unit", parent_unit_id="review.map")
    s0 = insert(db, unit_id="review.unit:bbb", step_id="review", node_id="review.unit", parent_unit_id="review.map")
    insert(db, unit_id="build:solo")
    s2 = insert(db, unit_id="build:solo")  # attempts 2
    g = insert(db, unit_id="review.gate:l1", step_id="review", node_id="review.gate", phase="gate", runner="llm")
    units.finish_unit(db, run_id="r1", unit_id="review.unit:aaa", started_at=s1, status="completed", tokens=10)
    units.finish_unit(db, run_id="r1", unit_id="review.unit:bbb", started_at=s0, status="completed", tokens=5)
    units.finish_unit(db, run_id="r1", unit_id="build:solo", started_at=s2, status="completed", tokens=1)
    units.finish_unit(db, run_id="r1", unit_id="review.gate:l1", started_at=g, status="completed", tokens=1000)
    assert units.journal_totals(db, "r1") == (4, 16)  # gate row excluded
    assert units.journal_totals(db, "nobody") == (0, 0)
    rows = units.get_units(db, "r1")
    assert [(r.started_at, r.unit_id) for r in rows] == sorted((r.started_at, r.unit_id) for r in rows)
    assert [r.unit_id for r in units.get_units(db, "r1", step_id="build")] == ["build:solo"]
    review = {r.unit_id: r for r in units.get_units(db, "r1", step_id="review")}
    assert set(review) == {"review.unit:aaa", "review.unit:bbb", "review.gate:l1"}
    assert review["review.unit:aaa"].parent_unit_id == "review.map" and review["review.gate:l1"].phase == "gate"


def test_heartbeat_touches_running_rows_only(db):
    s = insert(db, unit_id="a")
    insert(db, unit_id="b")
    units.finish_unit(db, run_id="r1", unit_id="a", started_at=s, status="completed")
    assert units.heartbeat_units(db, "r1", ["a", "b", "ghost"]) == 1
    assert units.get_unit(db, "r1", "b").last_checkin_at is not None
    assert units.get_unit(db, "r1", "a").last_checkin_at is None
    assert units.heartbeat_units(db, "r1", []) == 0


def test_step_tallies_count_units_attempts_and_gate_loops(db):
    for uid in (
        "build.unit:aaaaaaaaaaaa",
        "build.unit:aaaaaaaaaaaa~r1",
        "build.unit:bbbbbbbbbbbb",
        "build.unit:aaaaaaaaaaaa~l2",
        "build.unit:aaaaaaaaaaaa~l2~r1",
        "build.unit:bbbbbbbbbbbb~l2",
    ):
        insert(db, unit_id=uid)
    insert(db, unit_id="build.unit:bbbbbbbbbbbb~l2")  # re-dispatched after a crash: attempts 2
    insert(db, unit_id="review:solo", step_id="review")
    insert(db, unit_id="review:gate", step_id="review", phase="gate")  # gate rows are not dispatches
    tallies = units.step_tallies(db, "r1")
    assert tallies == {
        "build": units.StepTally(units=2, attempts=7, gate_loops=2),
        "review": units.StepTally(units=1, attempts=1, gate_loops=1),
    }


def test_step_tallies_agree_with_a_count_of_every_row(db, monkeypatch):
    """The journal counts the plain ids; `~` ids are parsed here and their logical units counted once."""
    ids = {
        "build": ["build.unit:a", "build.unit:a~r1", "build.unit:a~r2", "build.unit:b~l3", "build.unit:c",
                  "build.unit:d~l2~r1", "build.unit:d", "build.unit:e~l", "review:solo"],
        "review": ["review:solo~r1", "review:x", "review:y~l4"],
    }  # fmt: skip
    for step, uids in ids.items():
        for uid in uids:
            insert(db, unit_id=uid, step_id=step)
    insert(db, unit_id="build.unit:c")  # re-dispatched: attempts 2
    monkeypatch.setattr(units, "_TALLY_OVERLAP_CHUNK", 2)  # several `IN (...)` chunks
    expected = {}
    for u in units.get_units(db, "r1"):
        if u.phase is None:
            n, a, loop = expected.get(u.step_id, (set(), 0, 0))
            n.add(u.unit_id.partition("~")[0])
            expected[u.step_id] = (n, a + u.attempts, max(loop, units._gate_loop_of(u.unit_id)))
    assert units.step_tallies(db, "r1") == {s: units.StepTally(len(n), a, loop) for s, (n, a, loop) in expected.items()}
    assert units.step_tallies(db, "r1")["build"] == units.StepTally(units=6, attempts=10, gate_loops=3)
