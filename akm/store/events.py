"""The append-only event bus and the invocation history (spec/engine.md, spec/decisions.md D17).

Events: `(id, event_type, ts, run_id, metadata_json)`. The id is the durable
cursor: SQLite serialises writers, so a committed id is never overtaken by a
smaller one committed later, and `id > offset` polling never skips or repeats.
Unlike upstream we store `run_id` as a column and filter on it in SQL, so the
returned `next_offset` is the id of the last *returned* row (or the input
offset when nothing matched) — polling one run with it is exact. Metadata
holds ids / statuses / numbers only (never titles, notes, results or errors).

task_history: one row per `workflow run` invocation. Metadata v2 is what we
write; the reader decodes v1 and v2 strictly (field-for-field as upstream's
0.9.0 decoder) and refuses anything else with a clear UsageError.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from akm.canonical import compact_json
from akm.errors import UsageError
from akm.store.journal import Journal


class Event(NamedTuple):
    """One event row; `metadata` is `{}` when the stored JSON is empty or corrupt."""

    id: int
    event_type: str
    ts: str
    run_id: str | None
    metadata: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "ts": self.ts, "eventType": self.event_type}
        if self.run_id is not None:
            out["runId"] = self.run_id
        if self.metadata:
            out["metadata"] = self.metadata
        return out


def append_event(db: Journal, event_type: str, run_id: str | None, metadata: dict[str, Any] | None = None) -> int:
    """Insert one event; joins the caller's open transaction (so it commits or rolls back with it)."""
    with db.tx() as conn:
        db.dialect.event_lock(conn)  # ids follow commit order (the cursor never skips an event)
        return db.dialect.insert_id(
            conn,
            "INSERT INTO events (event_type, ts, run_id, metadata_json) VALUES (?, ?, ?, ?)",
            (event_type, db.now(), run_id, compact_json(metadata or {})),
        )


def _decode_metadata(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(row: Any) -> Event:
    return Event(
        id=int(row["id"]),
        event_type=row["event_type"],
        ts=row["ts"],
        run_id=row["run_id"],
        metadata=_decode_metadata(row["metadata_json"]),
    )


def _check_page(since_offset: object, limit: object) -> None:
    """INVALID_ARGUMENT unless the offset is a non-negative integer and the limit, if any, a positive one."""
    if isinstance(since_offset, bool) or not isinstance(since_offset, int) or since_offset < 0:
        from akm.codes import Code

        raise UsageError(
            f"event offset must be a non-negative integer, got {since_offset!r}", code=Code.INVALID_ARGUMENT
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        from akm.codes import Code

        raise UsageError(f"event limit must be a positive integer, got {limit!r}", code=Code.INVALID_ARGUMENT)


def list_events(
    db: Journal,
    run_id: str | None = None,
    since_offset: int = 0,
    limit: int | None = None,
    *,
    event_type: str | None = None,
    since_ts: str | None = None,
) -> tuple[list[Event], int]:
    """Events with `id > since_offset` (ascending), optionally for one run / type / `ts >= since_ts`.

    Returns `(events, next_offset)`: `next_offset` = id of the last returned
    event, or `since_offset` when none matched. `limit` keeps the *first* k
    rows after the offset, so paging with `next_offset` never skips any.
    With `since_ts`, when fewer than `limit` events matched, `next_offset` is
    the newest event id at query time: everything up to it was considered, so
    a poller continuing from it neither replays the journal (a time in the
    future used to hand back offset 0) nor misses a later event (the newest id
    is read first and the page is bounded by it).
    """
    _check_page(since_offset, limit)
    where = ["id > ?"]
    params: list[Any] = [since_offset]
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if event_type is not None:
        where.append("event_type = ?")
        params.append(event_type)
    newest = None
    if since_ts is not None:
        where.append(f"{db.dialect.stamp_text('ts')} >= ?")  # as text: a partial stamp compares as on SQLite
        params.append(since_ts)
        row = db.query_one("SELECT COALESCE(MAX(id), 0) AS m FROM events")
        newest = int(row["m"]) if row else 0
        where.append("id <= ?")
        params.append(newest)
    sql = f"SELECT id, event_type, ts, run_id, metadata_json FROM events WHERE {' AND '.join(where)} ORDER BY id ASC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    events = [_event(r) for r in db.query(sql, params)]
    if newest is not None and (limit is None or len(events) < limit):
        return events, max(since_offset, newest)
    return events, (events[-1].id if events else since_offset)


def last_event_id(db: Journal, run_id: str) -> int:
    """The id of the run's newest event (0: none): where a caller's later look at the run's events starts."""
    row = db.query_one("SELECT COALESCE(MAX(id), 0) AS n FROM events WHERE run_id = ?", (run_id,))
    return int(row["n"]) if row is not None else 0


def first_event(db: Journal, event_type: str, run_id: str) -> Event | None:
    """The run's first event of this type (a run's `workflow_started` holds its trace context)."""
    row = db.query_one(
        "SELECT id, event_type, ts, run_id, metadata_json FROM events WHERE event_type = ? AND run_id = ? "
        "ORDER BY id LIMIT 1",
        (event_type, run_id),
    )
    return _event(row) if row is not None else None


def has_event(db: Journal, event_type: str, run_id: str) -> bool:
    """True when an event of this type was already recorded for the run (idempotent emits)."""
    return (
        db.query_one("SELECT 1 FROM events WHERE event_type = ? AND run_id = ? LIMIT 1", (event_type, run_id))
        is not None
    )


# -- task_history -------------------------------------------------------------------------------

TASK_DETAIL_FIELDS = ("runId", "reason", "error", "exitCode")


def _metadata_error(message: str) -> UsageError:
    from akm.codes import Code

    return UsageError(f"invalid task_history metadata_json: {message}", code=Code.INVALID_TASK_METADATA)


def _is_number(value: Any) -> bool:
    """JSON number in JS terms: int or float, never bool (Python's bool is an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _validate_detail(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _metadata_error("detail must be an object or null")
    unknown = sorted(k for k in value if k not in TASK_DETAIL_FIELDS)
    if unknown:
        raise _metadata_error(f"unknown detail fields: {', '.join(unknown)}")
    for field in ("runId", "reason", "error"):
        if field in value and not isinstance(value[field], str):
            raise _metadata_error(f"detail.{field} must be a string")
    if value.get("exitCode") is not None and not _is_number(value["exitCode"]):
        raise _metadata_error("detail.exitCode must be a number or null")


def decode_task_metadata(raw: str | dict[str, Any]) -> dict[str, Any]:
    """Decode task_history metadata v1 or v2 strictly; anything else is a UsageError.

    v1 (`metadataVersion` absent or 1): fields durationMs?, detail?, profile?
    -> `{metadataVersion: 1, durationMs?, detail?, legacyProfile?}`.
    v2: durationMs (required number), detail (required key, object or null), engine?
    -> `{metadataVersion: 2, durationMs, detail, engine?}`.
    """
    parsed: Any = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw, parse_constant=_reject_constant)
        except ValueError:
            raise _metadata_error("not valid JSON") from None
    if not isinstance(parsed, dict):
        raise _metadata_error("root must be an object")
    version = parsed.get("metadataVersion")
    if version is None:
        version = 1
    if _is_number(version) and version == 1:
        return _task_metadata_v1(parsed)
    if _is_number(version) and version == 2:
        return _task_metadata_v2(parsed)
    raise _metadata_error(f"unsupported metadataVersion: {_js_string(version)}")


def _task_metadata_v1(parsed: dict[str, Any]) -> dict[str, Any]:
    """v1 metadata checked field by field, `profile` renamed `legacyProfile`, a null detail left out."""
    unknown = sorted(k for k in parsed if k not in ("metadataVersion", "durationMs", "detail", "profile"))
    if unknown:
        raise _metadata_error(f"unknown v1 fields: {', '.join(unknown)}")
    if "metadataVersion" in parsed and not (_is_number(parsed["metadataVersion"]) and parsed["metadataVersion"] == 1):
        raise _metadata_error("invalid v1 metadataVersion")
    if "durationMs" in parsed and not _is_number(parsed["durationMs"]):
        raise _metadata_error("durationMs must be a number")
    if "profile" in parsed and not isinstance(parsed["profile"], str):
        raise _metadata_error("profile must be a string")
    _validate_detail(parsed.get("detail"))
    out: dict[str, Any] = {"metadataVersion": 1}
    if "durationMs" in parsed:
        out["durationMs"] = parsed["durationMs"]
    if parsed.get("detail") is not None:
        out["detail"] = parsed["detail"]
    if "profile" in parsed:
        out["legacyProfile"] = parsed["profile"]
    return out


def _task_metadata_v2(parsed: dict[str, Any]) -> dict[str, Any]:
    """v2 metadata: durationMs and detail required, engine a string or null."""
    unknown = sorted(k for k in parsed if k not in ("metadataVersion", "durationMs", "detail", "engine"))
    if unknown:
        raise _metadata_error(f"unknown v2 fields: {', '.join(unknown)}")
    if not _is_number(parsed.get("durationMs")):
        raise _metadata_error("durationMs must be a number")
    if "detail" not in parsed:
        raise _metadata_error("detail is required in v2")
    if parsed.get("engine") is not None and not isinstance(parsed["engine"], str):
        raise _metadata_error("engine must be a string or null")
    _validate_detail(parsed["detail"])
    out: dict[str, Any] = {"metadataVersion": 2, "durationMs": parsed["durationMs"], "detail": parsed["detail"]}
    if "engine" in parsed:
        out["engine"] = parsed["engine"]
    return out


def _js_string(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


class TaskHistoryEntry(NamedTuple):
    """One invocation record with its decoded metadata."""

    id: int
    run_id: str | None
    started_at: str
    finished_at: str | None
    outcome: str
    metadata: dict[str, Any]


def record_invocation(
    db: Journal,
    *,
    run_id: str | None,
    started_at: str,
    finished_at: str | None,
    outcome: str,
    duration_ms: int | float,
    detail: dict[str, Any] | None,
    engine: str | None,
) -> int:
    """Write one task_history row with metadata v2; returns its id.

    `detail` may carry runId / reason / error (strings) and exitCode (number
    or None); string fields given as None are dropped. The metadata is run
    through the decoder before writing, so we never store a row we cannot read.
    """
    clean: dict[str, Any] | None = None
    if detail is not None:
        clean = {k: v for k, v in detail.items() if not (k in ("runId", "reason", "error") and v is None)}
    metadata = {"metadataVersion": 2, "durationMs": duration_ms, "detail": clean, "engine": engine}
    decode_task_metadata(metadata)
    with db.tx() as conn:
        return db.dialect.insert_id(
            conn,
            "INSERT INTO task_history (run_id, started_at, finished_at, outcome, metadata_json) VALUES (?, ?, ?, ?, ?)",
            (run_id, started_at, finished_at, outcome, compact_json(metadata)),
        )


def list_task_history(db: Journal, run_id: str | None = None) -> list[TaskHistoryEntry]:
    """Invocation records (oldest first), metadata decoded strictly (a bad row raises UsageError)."""
    sql = "SELECT id, run_id, started_at, finished_at, outcome, metadata_json FROM task_history"
    params: list[Any] = []
    if run_id is not None:
        sql += " WHERE run_id = ?"
        params.append(run_id)
    sql += " ORDER BY id ASC"
    return [
        TaskHistoryEntry(
            id=int(r["id"]),
            run_id=r["run_id"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            outcome=r["outcome"],
            metadata=decode_task_metadata(r["metadata_json"]),
        )
        for r in db.query(sql, params)
    ]
