"""Runs and the step spine: create guard, derived state, completion contract, resume/abandon."""

from __future__ import annotations

import pytest

from akm.errors import JournalError, NotFoundError, UsageError
from akm.store import events, runs
from tests.helpers import sqlite_only, step_row


@pytest.fixture()
def db(journal):
    database = journal  # both journals (conftest: sqlite, postgres)
    yield database


def make_run(db, run_id="r1", ref="workflows/ship", scope="scope-a", steps=("a", "b", "c"), **extra):
    return runs.create_run(
        db,
        run_id=run_id,
        workflow_ref=ref,
        workflow_path=f"/p/{ref}.md",
        title="Ship it",
        scope_key=scope,
        params=extra.get("params", {"zeta": 1, "alpha": "x"}),
        plan_json='{"steps":[]}',
        plan_hash="f" * 64,
        hash_version=1,
        step_ids=list(steps),
        **({"join_identical": extra["join_identical"]} if "join_identical" in extra else {}),
    )


def event_types(db, run_id):
    return [e.event_type for e in events.list_events(db, run_id)[0]]


def test_create_inserts_active_run_and_pending_spine(db):
    run = make_run(db)
    assert run.status == "active" and run.current_step_id == "a"
    assert run.params_json == '{"zeta":1,"alpha":"x"}'  # insertion order kept
    assert run.params == {"zeta": 1, "alpha": "x"}
    assert run.lease_holder is None and run.completed_at is None
    steps = runs.get_steps(db, "r1")
    assert [(s.step_id, s.sequence_index, s.status) for s in steps] == [
        ("a", 0, "pending"),
        ("b", 1, "pending"),
        ("c", 2, "pending"),
    ]
    assert event_types(db, "r1") == ["workflow_started"]


def test_create_guard_one_drivable_run_per_ref_scope_and_params(db):
    make_run(db)
    with pytest.raises(UsageError) as info:
        make_run(db, run_id="r2", params={"alpha": "x", "zeta": 1})  # same params, other key order
    assert info.value.code == "RUN_ALREADY_ACTIVE" and info.value.details == {"runId": "r1"}
    assert runs.get_run(db, "r2") is None and runs.get_steps(db, "r2") == []
    make_run(db, run_id="r3", scope="scope-b")  # other project: fine
    make_run(db, run_id="r4", ref="workflows/other")  # other workflow: fine
    runs.set_run_status(db, "r1", "awaiting_session", {"units": ["a:solo"]})
    with pytest.raises(UsageError) as info:
        make_run(db, run_id="r5")  # awaiting_session still occupies the scope
    assert info.value.code == "RUN_ALREADY_ACTIVE" and "awaiting_session run (r1)" in info.value.message
    runs.abandon_run(db, "r1")
    assert make_run(db, run_id="r6").status == "active"


def test_runs_with_other_params_live_side_by_side_and_a_forced_start_always_inserts(db):
    make_run(db)
    assert make_run(db, run_id="r2", params={"zeta": 2, "alpha": "x"}).status == "active"
    assert make_run(db, run_id="r3", join_identical=False).status == "active"  # identical, but asked for
    assert runs.find_active_run(db, "workflows/ship", "scope-a", {"alpha": "x", "zeta": 2}).id == "r2"
    assert runs.find_active_run(db, "workflows/ship", "scope-a", {"alpha": "y"}) is None
    assert {r.id for r in runs.list_runs(db, active_only=True)} == {"r1", "r2", "r3"}


def test_create_is_atomic_on_duplicate_id(db):
    sqlite_only(db, "matches SQLite's own error text")
    make_run(db)
    with pytest.raises(JournalError, match="UNIQUE constraint failed: runs.id"):
        make_run(db, run_id="r1", ref="workflows/else", steps=("x",))
    assert [s.step_id for s in runs.get_steps(db, "r1")] == ["a", "b", "c"]
    with pytest.raises(UsageError, match="declares a step id twice"):
        make_run(db, run_id="r9", ref="workflows/dup", steps=("x", "x"))
    with pytest.raises(UsageError, match="has no steps; nothing to run"):
        make_run(db, run_id="r9", ref="workflows/empty", steps=())


def test_list_and_find(db):
    make_run(db, run_id="r1")
    runs.abandon_run(db, "r1")
    make_run(db, run_id="r2")
    make_run(db, run_id="r3", scope="scope-b")
    assert [r.id for r in runs.list_runs(db)] == ["r3", "r2", "r1"]
    assert [r.id for r in runs.list_runs(db, scope_key="scope-a")] == ["r2", "r1"]
    assert [r.id for r in runs.list_runs(db, scope_key="scope-a", active_only=True)] == ["r2"]
    assert [r.id for r in runs.list_runs(db, ref="workflows/nope")] == []
    assert runs.find_active_run(db, "workflows/ship", "scope-a").id == "r2"
    assert runs.find_active_run(db, "workflows/ship", "scope-c") is None
    with pytest.raises(NotFoundError):
        runs.require_run(db, "missing")


def test_derive_state_through_three_steps(db):
    make_run(db)
    run = runs.complete_step(db, "r1", "a", "completed", summary="built", evidence_json='{"units":[]}', notes="  ")
    assert (run.status, run.current_step_id, run.completed_at) == ("active", "b", None)
    a = step_row(db, "r1", "a")
    assert a.status == "completed" and a.summary == "built" and a.notes is None and a.evidence == {"units": []}
    run = runs.complete_step(db, "r1", "b", "skipped", notes=" route not taken ")
    assert (run.status, run.current_step_id) == ("active", "c")
    assert step_row(db, "r1", "b").notes == "route not taken"
    run = runs.complete_step(db, "r1", "c", "completed", summary="shipped")
    steps = runs.get_steps(db, "r1")
    assert run.status == "completed" and run.current_step_id is None
    assert run.completed_at == max(s.completed_at for s in steps)
    assert event_types(db, "r1") == [
        "workflow_started",
        "workflow_step_completed",
        "workflow_step_updated",
        "workflow_step_completed",
        "workflow_finished",
    ]
    evs = events.list_events(db, "r1")[0]
    assert evs[2].metadata == {"runId": "r1", "stepId": "b", "status": "skipped"}


@pytest.mark.parametrize("status", ["failed", "blocked"])
def test_failed_or_blocked_step_parks_the_run_on_it(db, status):
    make_run(db)
    runs.complete_step(db, "r1", "a", "completed", summary="ok")
    run = runs.complete_step(db, "r1", "b", status, notes="why", status_detail={"missing": ["tests"]})
    assert (run.status, run.current_step_id, run.completed_at) == (status, "b", None)
    assert run.status_detail == {"missing": ["tests"]}
    assert event_types(db, "r1")[-1] == "workflow_step_updated"


def test_derive_run_state_is_pure_and_ordered():
    def step(i, sid, status, done=None):
        return runs.Step("r", sid, i, status, None, None, None, done)

    assert runs.derive_run_state([step(1, "b", "pending"), step(0, "a", "completed", "t1")]) == ("active", "b", None)
    assert runs.derive_run_state([step(0, "a", "skipped", "t2"), step(1, "b", "completed", "t1")]) == (
        "completed",
        None,
        "t2",
    )
    assert runs.derive_run_state([step(0, "a", "blocked"), step(1, "b", "failed")]) == ("blocked", "a", None)


def test_complete_step_preconditions(db):
    make_run(db)
    with pytest.raises(UsageError) as info:
        runs.complete_step(db, "r1", "b", "completed", summary="x")
    assert info.value.code == "STEP_NOT_CURRENT" and "complete a first" in info.value.message
    with pytest.raises(NotFoundError, match="step 'zzz' not found"):
        runs.complete_step(db, "r1", "zzz", "completed", summary="x")
    with pytest.raises(NotFoundError, match="workflow run 'nope' not found"):
        runs.complete_step(db, "nope", "a", "completed", summary="x")
    with pytest.raises(UsageError, match="cannot complete a step as 'pending'"):
        runs.complete_step(db, "r1", "a", "pending")
    runs.complete_step(db, "r1", "a", "completed", summary="x")
    with pytest.raises(UsageError) as info:
        runs.complete_step(db, "r1", "a", "completed", summary="again")
    assert info.value.code == "STEP_NOT_PENDING" and "already completed" in info.value.message
    runs.complete_step(db, "r1", "b", "failed", notes="broke")
    with pytest.raises(UsageError) as info:
        runs.complete_step(db, "r1", "c", "completed", summary="x")
    assert info.value.code == "RUN_NOT_ACTIVE" and "failed" in info.value.message
    assert step_row(db, "r1", "c").status == "pending"  # nothing half-written


def test_complete_step_respects_live_lease_of_another_holder(db):
    make_run(db)
    assert runs.acquire_lease(db, "r1", "engine-1") is None
    with pytest.raises(UsageError) as info:
        runs.complete_step(db, "r1", "a", "completed", summary="x", lease_holder="engine-2")
    assert info.value.code == "LEASE_HELD" and "engine-1" in info.value.message
    with pytest.raises(UsageError) as info:
        runs.complete_step(db, "r1", "a", "completed", summary="x")  # no holder at all
    assert info.value.code == "LEASE_HELD"
    assert step_row(db, "r1", "a").status == "pending"
    run = runs.complete_step(db, "r1", "a", "completed", summary="x", lease_holder="engine-1")
    assert run.current_step_id == "b" and run.lease_holder == "engine-1"


def test_complete_step_ignores_expired_lease(db):
    make_run(db)
    assert runs.acquire_lease(db, "r1", "engine-1", ttl_s=-1) is None  # already expired
    assert runs.complete_step(db, "r1", "a", "completed", summary="x", lease_holder="driver").current_step_id == "b"


def test_set_run_status_between_drivable_states(db):
    make_run(db)
    run = runs.set_run_status(db, "r1", "awaiting_session", {"units": ["a:solo"]})
    assert run.status == "awaiting_session" and run.status_detail == {"units": ["a:solo"]} and run.drivable
    assert runs.find_active_run(db, "workflows/ship", "scope-a").id == "r1"
    # a step can finish while awaiting the session; derived state takes over
    run = runs.complete_step(db, "r1", "a", "completed", summary="from session")
    assert run.status == "active" and run.status_detail is None
    runs.set_run_status(db, "r1", "awaiting_session", None)
    assert runs.set_run_status(db, "r1", "active").status == "active"
    with pytest.raises(UsageError, match="only moves between active and awaiting_session"):
        runs.set_run_status(db, "r1", "completed")
    runs.abandon_run(db, "r1")
    with pytest.raises(UsageError) as info:
        runs.set_run_status(db, "r1", "active")
    assert info.value.code == "RUN_ABANDONED"


def _blocked_run(db, run_id="r1", ref="workflows/ship"):
    make_run(db, run_id=run_id, ref=ref)
    runs.complete_step(db, run_id, "a", "completed", summary="a done")
    runs.complete_step(
        db,
        run_id,
        "b",
        "blocked",
        notes="judge missing",
        evidence_json='{"x":1}',
        summary="kept",
        status_detail={"missing": ["c1"]},
    )
    return runs.require_run(db, run_id)


def test_resume_blocked_reopens_step_and_clears_lease(db):
    sqlite_only(db, "stores a non-timestamp '9999' in lease_until")
    _blocked_run(db)
    # lease columns may linger on a parked run; resume must clear them
    db.execute("UPDATE runs SET lease_holder='ghost', lease_host='h', lease_pid=1, lease_until='9999' WHERE id='r1'")
    run = runs.resume_run(db, "r1")
    assert (run.status, run.current_step_id, run.lease_holder, run.lease_until) == ("active", "b", None, None)
    assert run.status_detail is None and run.completed_at is None
    b = step_row(db, "r1", "b")
    assert (b.status, b.notes, b.evidence_json, b.completed_at, b.summary) == ("pending", None, None, None, "kept")
    assert step_row(db, "r1", "a").status == "completed"  # earlier steps untouched
    assert "workflow_resumed" not in event_types(db, "r1")


def test_resume_failed_and_noops(db):
    make_run(db)
    runs.complete_step(db, "r1", "a", "failed", notes="x")
    assert runs.resume_run(db, "r1").status == "active"
    assert step_row(db, "r1", "a").status == "pending"
    before = runs.require_run(db, "r1")
    assert runs.resume_run(db, "r1") == before  # active: no-op, not even updated_at
    runs.set_run_status(db, "r1", "awaiting_session")
    assert runs.resume_run(db, "r1").status == "awaiting_session"
    with pytest.raises(NotFoundError):
        runs.resume_run(db, "ghost")


def test_resume_completed_is_refused(db):
    make_run(db, steps=("a",))
    runs.complete_step(db, "r1", "a", "completed", summary="x")
    with pytest.raises(UsageError) as info:
        runs.resume_run(db, "r1")
    assert info.value.code == "RUN_COMPLETED" and "cannot be resumed" in info.value.message


def test_abandon_active_is_final_and_leaves_nothing_to_do(db):
    make_run(db)
    runs.complete_step(db, "r1", "a", "completed", summary="a done")
    assert runs.acquire_lease(db, "r1", "eng") is None
    run = runs.abandon_run(db, "r1")
    assert run.status == "abandoned" and run.completed_at is not None and run.current_step_id == "b"
    assert run.lease_holder == "eng"  # forensic
    assert [(s.step_id, s.status, s.notes) for s in runs.get_steps(db, "r1")] == [
        ("a", "completed", None),
        ("b", "failed", runs.ABANDONED_STEP_NOTE),
        ("c", "skipped", runs.SKIPPED_STEP_NOTE),
    ]
    assert runs.renew_lease(db, "r1", "eng") is False  # a driving engine notices
    with pytest.raises(UsageError) as info:
        runs.abandon_run(db, "r1")
    assert info.value.code == "RUN_ALREADY_FINISHED"
    with pytest.raises(UsageError) as info:
        runs.resume_run(db, "r1")
    assert info.value.code == "RUN_ABANDONED"
    assert runs.get_run(db, "r1").status == "abandoned"
    assert event_types(db, "r1")[-3:] == ["workflow_step_updated", "workflow_step_updated", "workflow_abandoned"]


def test_abandon_blocked_fails_its_step_and_keeps_the_reason(db):
    _blocked_run(db)
    run = runs.abandon_run(db, "r1")
    assert (run.status, run.current_step_id) == ("abandoned", "b")
    b = step_row(db, "r1", "b")
    assert b.status == "failed" and b.notes == "judge missing"
    assert step_row(db, "r1", "c").status == "skipped"


def test_abandon_a_failed_run_makes_it_final(db):
    make_run(db, steps=("a", "b"))
    runs.complete_step(db, "r1", "a", "failed", notes="boom")
    assert runs.abandon_run(db, "r1").status == "abandoned"
    assert [(s.status, s.notes) for s in runs.get_steps(db, "r1")] == [
        ("failed", "boom"),
        ("skipped", runs.SKIPPED_STEP_NOTE),
    ]


def test_abandon_awaiting_session_and_refusals(db):
    make_run(db)
    runs.set_run_status(db, "r1", "awaiting_session")
    assert runs.abandon_run(db, "r1").status == "abandoned"
    make_run(db, run_id="r2", steps=("a",))
    runs.complete_step(db, "r2", "a", "completed", summary="x")
    with pytest.raises(UsageError) as info:
        runs.abandon_run(db, "r2")
    assert "already completed" in info.value.message
    with pytest.raises(NotFoundError):
        runs.abandon_run(db, "ghost")
