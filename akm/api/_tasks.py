"""Durable task records: a front's long call over a run, kept in the journal so any process can answer for it.

The MCP tasks extension lets a server answer a `workflow_run` call at once with a task and the client poll
it; a session that restarts its server polls a new process. So a task is not kept in the memory of the
process that made it: it is three kinds of event on its run's journal (`TASK_OPENED`, `TASK_SETTLED`,
`TASK_CANCELLED`), and what a task stands for — where the run is — is read from the run itself.

A task id is `<run id>.<secret>`: the run id finds the events, the secret (unguessable, as the extension
asks of an id that grants access to state) is never journaled — only its SHA-256 is, so reading the event
log (`workflow_events`) does not hand out task ids.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from akm.api._views import _open_db
from akm.views import View

TASK_OPENED = "mcp_task_opened"
TASK_SETTLED = "mcp_task_settled"  # the task reached its result (the run stopped being driven)
TASK_CANCELLED = "mcp_task_cancelled"
_KINDS = (TASK_OPENED, TASK_SETTLED, TASK_CANCELLED)


class TaskRecord(View):
    """A task as its events tell it: when it was opened and last changed, its time to live, and whether it
    settled (its result is the run's) or was cancelled."""

    task_id: str
    run_id: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    settled: bool = False
    cancelled: bool = False


def _digest(task_id: str) -> str:
    return hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:32]


def open_task(run_id: str, *, ttl_ms: int | None = None) -> TaskRecord:
    """A new task over the run `run_id` (a whole run id), journaled before it is returned: any process's
    `find_task` finds it from then on."""
    from akm.store.events import append_event

    task_id = f"{run_id}.{secrets.token_urlsafe(24)}"
    with _open_db() as db:
        append_event(db, TASK_OPENED, run_id, {"runId": run_id, "task": _digest(task_id), "ttlMs": ttl_ms})
    found = find_task(task_id)
    assert found is not None  # journaled just above
    return found


def find_task(task_id: str) -> TaskRecord | None:
    """The task `task_id` names, from its run's events; None when there is no such task."""
    from akm.store.events import list_events

    run_id, dot, secret = task_id.rpartition(".")
    if not dot or not run_id or not secret or len(task_id) > 512:
        return None
    digest = _digest(task_id)
    record: TaskRecord | None = None
    with _open_db(read_only=True) as db:
        for kind in _KINDS:
            rows, _ = list_events(db, run_id=run_id, event_type=kind)
            for event in rows:
                if event.metadata.get("task") != digest:
                    continue
                if kind == TASK_OPENED:
                    record = TaskRecord(
                        task_id=task_id,
                        run_id=run_id,
                        created_at=event.ts,
                        last_updated_at=event.ts,
                        ttl_ms=event.metadata.get("ttlMs"),
                    )
                elif record is not None:
                    record.last_updated_at = max(record.last_updated_at, event.ts)
                    record.settled = record.settled or kind == TASK_SETTLED
                    record.cancelled = record.cancelled or kind == TASK_CANCELLED
            if record is None:
                return None
    return record


def mark_task(task: TaskRecord, kind: str) -> TaskRecord:
    """Journal that `task` settled (`TASK_SETTLED`) or was cancelled (`TASK_CANCELLED`); once is enough."""
    from akm.store.events import append_event

    if kind not in (TASK_SETTLED, TASK_CANCELLED):
        raise ValueError(f"not a task mark: {kind}")
    if (kind == TASK_SETTLED and task.settled) or (kind == TASK_CANCELLED and task.cancelled):
        return task
    metadata: dict[str, Any] = {"runId": task.run_id, "task": _digest(task.task_id)}
    with _open_db() as db:
        append_event(db, kind, task.run_id, metadata)
    return find_task(task.task_id) or task
