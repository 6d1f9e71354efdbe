"""Events cursor (spec-engine §8.2) and task_history metadata v1/v2 (D17)."""

from __future__ import annotations

import pytest

from akm.errors import UsageError
from akm.store import events
from tests.helpers import sqlite_only


@pytest.fixture()
def db(journal):
    database = journal  # both journals (conftest: sqlite, postgres)
    yield database


def test_cursor_per_run_never_skips_or_repeats(db):
    ids = {"r1": [], "r2": []}
    for i in range(7):
        run = "r1" if i % 3 else "r2"
        ids[run].append(events.append_event(db, "tick", run, {"runId": run, "i": i}))
    events.append_event(db, "global", None, {})
    got, nxt = events.list_events(db, "r1")
    assert [e.id for e in got] == ids["r1"] and nxt == ids["r1"][-1]
    assert all(e.run_id == "r1" and e.metadata["runId"] == "r1" for e in got)
    assert events.list_events(db, "r1", since_offset=nxt) == ([], nxt)
    new_id = events.append_event(db, "tick", "r1", {"runId": "r1"})
    got, nxt2 = events.list_events(db, "r1", since_offset=nxt)
    assert [e.id for e in got] == [new_id] and nxt2 == new_id
    # paging with a limit walks every event exactly once
    seen: list[int] = []
    offset = 0
    while True:
        page, offset2 = events.list_events(db, since_offset=offset, limit=3)
        if not page:
            assert offset2 == offset
            break
        assert len(page) <= 3
        seen += [e.id for e in page]
        offset = offset2
    assert seen == sorted(seen) and len(seen) == 9 == len(set(seen))


def test_filters_and_shapes(db):
    events.append_event(db, "a", "r1", {"runId": "r1"})
    second = events.append_event(db, "b", "r1", {})
    got, _ = events.list_events(db, event_type="b")
    assert [e.id for e in got] == [second]
    assert got[0].to_dict() == {"id": second, "ts": got[0].ts, "eventType": "b", "runId": "r1"}  # {} omitted
    assert events.list_events(db, since_ts="9999")[0] == []
    assert len(events.list_events(db, since_ts="0000")[0]) == 2
    assert events.has_event(db, "a", "r1") and not events.has_event(db, "a", "r2")


def test_corrupt_metadata_reads_as_empty(db):
    sqlite_only(db, "stores a non-timestamp 't' in ts")
    db.execute("INSERT INTO events (event_type, ts, run_id, metadata_json) VALUES ('x', 't', 'r', '{nope')")
    db.execute("INSERT INTO events (event_type, ts, run_id, metadata_json) VALUES ('y', 't', 'r', '[1,2]')")
    assert [e.metadata for e in events.list_events(db, "r")[0]] == [{}, {}]


@pytest.mark.parametrize("bad", [-1, True, "3", 1.5])
def test_bad_offsets_are_usage_errors(db, bad):
    with pytest.raises(UsageError, match="event offset must be a non-negative integer") as info:
        events.list_events(db, since_offset=bad)
    assert info.value.code == "INVALID_ARGUMENT"


def test_bad_limit_is_usage_error(db):
    with pytest.raises(UsageError, match="event limit must be a positive integer") as info:
        events.list_events(db, limit=0)
    assert info.value.code == "INVALID_ARGUMENT"


# -- task_history -------------------------------------------------------------------------------


def test_record_invocation_writes_v2_and_reads_back(db):
    sqlite_only(db, "stores a non-timestamp 't' in started_at")
    hid = events.record_invocation(
        db,
        run_id="r1",
        started_at="2026-01-01T00:00:00.000Z",
        finished_at="2026-01-01T00:00:01.500Z",
        outcome="failed",
        duration_ms=1500,
        detail={"runId": "r1", "reason": "step_failed", "error": None, "exitCode": 1},
        engine="local",
    )
    raw = db.query_one("SELECT metadata_json FROM task_history WHERE id = ?", (hid,))["metadata_json"]
    assert (
        raw == '{"metadataVersion":2,"durationMs":1500,"detail":{"runId":"r1","reason":"step_failed",'
        '"exitCode":1},"engine":"local"}'
    )
    [entry] = events.list_task_history(db, "r1")
    assert entry.outcome == "failed" and entry.finished_at.endswith("01.500Z")
    assert entry.metadata == {
        "metadataVersion": 2,
        "durationMs": 1500,
        "detail": {"runId": "r1", "reason": "step_failed", "exitCode": 1},
        "engine": "local",
    }
    events.record_invocation(
        db, run_id=None, started_at="t", finished_at=None, outcome="error", duration_ms=3, detail=None, engine=None
    )
    assert len(events.list_task_history(db)) == 2
    assert events.list_task_history(db)[1].metadata == {
        "metadataVersion": 2,
        "durationMs": 3,
        "detail": None,
        "engine": None,
    }


def test_record_invocation_refuses_undecodable_detail(db):
    sqlite_only(db, "stores a non-timestamp 't' in started_at")
    with pytest.raises(UsageError, match="unknown detail fields: bogus"):
        events.record_invocation(
            db,
            run_id="r",
            started_at="t",
            finished_at="t",
            outcome="ok",
            duration_ms=1,
            detail={"bogus": 1},
            engine=None,
        )
    assert events.list_task_history(db) == []


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("{}", {"metadataVersion": 1}),
        (
            '{"metadataVersion":1,"durationMs":12.5,"profile":"fast","detail":{"runId":"r","exitCode":null}}',
            {
                "metadataVersion": 1,
                "durationMs": 12.5,
                "legacyProfile": "fast",
                "detail": {"runId": "r", "exitCode": None},
            },
        ),
        ('{"durationMs":3,"detail":null}', {"metadataVersion": 1, "durationMs": 3}),
        ('{"metadataVersion":1.0}', {"metadataVersion": 1}),
        ('{"metadataVersion":2,"durationMs":0,"detail":null}', {"metadataVersion": 2, "durationMs": 0, "detail": None}),
        (
            '{"metadataVersion":2,"durationMs":5,"detail":{"error":"x"},"engine":null}',
            {"metadataVersion": 2, "durationMs": 5, "detail": {"error": "x"}, "engine": None},
        ),
    ],
)
def test_decode_v1_and_v2(raw, expected):
    assert events.decode_task_metadata(raw) == expected


@pytest.mark.parametrize(
    "raw, message",
    [
        ("not json", "not valid JSON"),
        ('{"durationMs": NaN}', "not valid JSON"),
        ("[1]", "root must be an object"),
        ('{"metadataVersion":3}', "unsupported metadataVersion: 3"),
        ('{"metadataVersion":true}', "unsupported metadataVersion: true"),
        ('{"metadataVersion":"2","durationMs":1,"detail":null}', "unsupported metadataVersion: 2"),
        ('{"metadataVersion":null}', "invalid v1 metadataVersion"),
        ('{"engine":"x"}', "unknown v1 fields: engine"),
        ('{"durationMs":"5"}', "durationMs must be a number"),
        ('{"durationMs":true}', "durationMs must be a number"),
        ('{"profile":null}', "profile must be a string"),
        ('{"detail":[1]}', "detail must be an object or null"),
        ('{"detail":{"runId":null}}', "detail.runId must be a string"),
        ('{"detail":{"exitCode":false}}', "detail.exitCode must be a number or null"),
        ('{"detail":{"z":1,"a":2}}', "unknown detail fields: a, z"),
        ('{"metadataVersion":2,"detail":null}', "durationMs must be a number"),
        ('{"metadataVersion":2,"durationMs":1}', "detail is required in v2"),
        ('{"metadataVersion":2,"durationMs":1,"detail":null,"profile":"x"}', "unknown v2 fields: profile"),
        ('{"metadataVersion":2,"durationMs":1,"detail":null,"engine":7}', "engine must be a string or null"),
    ],
)
def test_decode_rejects_everything_else(raw, message):
    with pytest.raises(UsageError) as info:
        events.decode_task_metadata(raw)
    assert info.value.code == "INVALID_TASK_METADATA"
    assert info.value.message == f"invalid task_history metadata_json: {message}"


def test_decode_accepts_an_object_too():
    assert events.decode_task_metadata({"metadataVersion": 2, "durationMs": 1, "detail": None}) == {
        "metadataVersion": 2,
        "durationMs": 1,
        "detail": None,
    }


def test_every_events_query_uses_the_id_range_or_the_run_index(db):
    sqlite_only(db, "reads SQLite's query plans")
    """Migration 0006 dropped the type and time indexes: no query of list_events/has_event may scan the table."""
    from akm.store.migrations import applied_ids

    assert "0006-drop-unused-event-indexes" in applied_ids(db)
    names = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='events'")}
    assert "idx_events_type" not in names and "idx_events_ts" not in names and "idx_events_run" in names
    for i in range(50):
        events.append_event(db, "tick" if i % 2 else "tock", f"r{i % 3}", {"i": i})
    seen: list[str] = []
    db.conn.set_trace_callback(seen.append)
    try:
        for run_id in (None, "r1"):
            for event_type in (None, "tick"):
                for since_ts in (None, "2000-01-01T00:00:00.000Z"):
                    events.list_events(db, run_id, since_offset=3, limit=10, event_type=event_type, since_ts=since_ts)
        events.has_event(db, "tick", "r1")
    finally:
        db.conn.set_trace_callback(None)
    selects = [s for s in seen if s.lstrip().upper().startswith("SELECT") and "FROM events" in s]
    assert len(selects) >= 9
    for sql in selects:
        plan = " | ".join(r[3] for r in db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN events" not in plan or "MAX(id)" in sql, (sql, plan)
