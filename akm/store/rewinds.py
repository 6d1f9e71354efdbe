"""Going back without losing anything: rewinds, the history they keep, and restoring a unit from it.

A **rewind** (`rewind_run`) reopens a step and every later step of a run in ONE transaction, under the run's
row lock and fenced like a driver's writes (it bumps the lease epoch, so a driver stopped past its lease can
write nothing afterwards): the reopened step rows are copied to `superseded_steps`, their unit and gate rows
move, unchanged, to `superseded_units`, each row marked with the rewind that superseded it (`rewinds`), and
the spine and the run are set back. Nothing is deleted: `status --units`, the event log and the HTML report
show the superseded rows as such. A kill -9 at any instant leaves the old run or the rewound one.

**Reuse** (`reuse_candidates`, `adopt_units`): when the engine meets a unit that has no row yet, a completed
row with the same content id and input hash — superseded by a rewind of this run and marked `reusable`, or
journaled by the run a `--from` run reuses (`runs.reuse_from`) — is copied in as the unit's row, `completed`,
with no attempt, no tokens and `reused_from` naming its source. Nothing runs for it.

Error codes raised here: RUN_NOT_FOUND, RUN_ABANDONED, LEASE_HELD, STEP_NOT_FOUND, STEP_NOT_REACHED,
UNKNOWN_UNIT, RUN_NOT_ACTIVE, LEASE_LOST.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from akm.canonical import compact_json
from akm.errors import NotFoundError, UsageError
from akm.store.events import append_event
from akm.store.journal import RUN_UNIT_WRITE, RUN_UPDATE, Journal
from akm.store.runs import (
    Fence,
    Step,
    check_fence,
    holder_is_live,
    host_id,
    not_drivable_error,
)
from akm.store.status import DRIVABLE_STATUSES
from akm.store.units import _UNIT_FIELDS, Unit

# Every column of a `units` row, as `superseded_units` keeps it (the same names, plus its own two).
HISTORY_UNIT_COLUMNS = (*_UNIT_FIELDS, "dispatch_json")
_COLUMNS = ", ".join(HISTORY_UNIT_COLUMNS)
_STEP_SNAPSHOT = "status, notes, evidence_json, summary, completed_at, gate_loop_base"


class Rewind(NamedTuple):
    """One `rewinds` row: which step a run was taken back to, when, and from where."""

    id: str
    run_id: str
    seq: int  # 1, 2, … per run
    to_step: str
    redo: Any  # None (reuse what is unchanged), True (redo every unit), or the list of unit ids redone
    from_status: str  # the run's status before the rewind
    from_step: str | None  # its current step before the rewind (None: it was completed)
    created_at: str
    lease_epoch: int  # the epoch the rewind fenced the run at


class RewindOutcome(NamedTuple):
    """What `rewind_run` did."""

    rewind: Rewind
    steps: list[str]  # the steps it reopened, in plan order
    superseded_units: int  # unit and gate rows moved to the history
    reusable_units: int  # of those, completed unit rows the engine may restore (same identity)


def _rewind(row: Any) -> Rewind:
    redo = json.loads(row["redo_json"]) if row["redo_json"] else None
    return Rewind(
        row["id"],
        row["run_id"],
        int(row["seq"]),
        row["to_step"],
        redo,
        row["from_status"],
        row["from_step"],
        row["created_at"],
        int(row["lease_epoch"]),
    )


def content_id(unit_id: str) -> str:
    """A unit's content id from any of its attempt ids (`X~l2~r1` -> `X`; gate rows keep theirs)."""
    return unit_id.partition("~")[0]


def rewind_run(
    db: Journal,
    run_id: str,
    *,
    rewind_id: str,
    to_step: str,
    redo: bool | Sequence[str] = False,
) -> RewindOutcome:
    """Reopen `to_step` and every later step of the run, in one transaction; returns what it did.

    `redo`: False reuses every unit whose identity is unchanged (the engine restores it from the history),
    True none, a list of unit ids (content ids, or any attempt id of them) all but those. Session units of
    `to_step` itself are never reused: the calling agent is asked for them again.

    Refusals (nothing written): RUN_NOT_FOUND; RUN_ABANDONED (abandoning is final); LEASE_HELD (a live
    driver, or a report finishing a step, holds the run: the caller may wait for a report's short hold);
    STEP_NOT_FOUND; STEP_NOT_REACHED (a step after the current one, or one a route skipped); UNKNOWN_UNIT
    (a `redo` id that is no unit of the reopened steps).
    """
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UPDATE)  # no unit write (KEY SHARE) slips in before the commit
        run = conn.execute(
            "SELECT id, status, current_step_id, lease_holder, lease_host, lease_pid, lease_until, lease_epoch "
            "FROM runs WHERE id = ?",
            (run_id,),
        ).fetchone()
        if run is None:
            from akm.codes import Code

            raise NotFoundError(
                f"No workflow run with id {run_id}.", code=Code.RUN_NOT_FOUND, details={"runId": run_id}
            )
        if run["status"] == "abandoned":
            raise not_drivable_error(run_id, "abandoned", "rewound")
        now = db.now()
        if holder_is_live(
            run["lease_holder"], run["lease_host"], run["lease_pid"], run["lease_until"], now
        ) and not db.dialect.lease_dead(conn, run_id):
            from akm.codes import Code

            raise UsageError(
                f"Workflow run {run_id} is held by {run['lease_holder']} (host {run['lease_host']}, pid "
                f"{run['lease_pid']}) until {run['lease_until']}; a rewind would change what it is working on. "
                "Nothing was changed.",
                code=Code.LEASE_HELD,
                details={"runId": run_id, "holder": run["lease_holder"], "until": run["lease_until"]},
            )
        spine = conn.execute(
            "SELECT step_id, sequence_index, status FROM steps WHERE run_id = ? ORDER BY sequence_index", (run_id,)
        ).fetchall()
        target = next((s for s in spine if s["step_id"] == to_step), None)
        if target is None:
            names = [s["step_id"] for s in spine]
            from akm.codes import Code

            raise UsageError(
                f"Run {run_id} has no step {to_step!r}; its steps are {', '.join(names)}.",
                code=Code.STEP_NOT_FOUND,
                details={"runId": run_id, "stepId": to_step, "steps": names},
            )
        _check_reached(run_id, run["current_step_id"], target)
        index = int(target["sequence_index"])
        reopened = [s["step_id"] for s in spine if int(s["sequence_index"]) >= index]
        marks = ", ".join("?" * len(reopened))
        redo_ids = _redo_ids(conn, run_id, reopened, marks, redo)
        seq = int(
            conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 AS n FROM rewinds WHERE run_id = ?", (run_id,)).fetchone()[
                "n"
            ]
        )
        epoch = int(run["lease_epoch"]) + 1
        conn.execute(
            "INSERT INTO rewinds (id, run_id, seq, to_step, redo_json, from_status, from_step, created_at, "
            "lease_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rewind_id,
                run_id,
                seq,
                to_step,
                None if redo is False else compact_json(True if redo is True else sorted(redo_ids)),
                run["status"],
                run["current_step_id"],
                now,
                epoch,
            ),
        )
        # The step rows as they were (a pending step nothing touched yet has nothing to keep).
        conn.execute(
            f"INSERT INTO superseded_steps (rewind_id, run_id, step_id, sequence_index, {_STEP_SNAPSHOT}) "
            f"SELECT ?, run_id, step_id, sequence_index, {_STEP_SNAPSHOT} FROM steps WHERE run_id = ? "
            "AND sequence_index >= ? AND (status != 'pending' OR step_id = ?)",
            (rewind_id, run_id, index, run["current_step_id"]),
        )
        # Every unit and gate row of the reopened steps moves to the history, unchanged; a completed unit row
        # may be restored when the engine meets the same unit again, except what is to be redone — by this
        # rewind's rows or an earlier rewind's, so `redo` (and the step's session units) means done anew.
        # A judge's verdict (a gate row with the identity of what it judged) may be restored too, when the same
        # artifact is judged again; `to_step`'s own gate and session units are asked again.
        moved = conn.execute(
            f"INSERT INTO superseded_units (rewind_id, reusable, {_COLUMNS}) SELECT ?, CASE WHEN status = "
            "'completed' AND (phase IS NULL OR (phase = 'gate' AND input_hash IS NOT NULL)) THEN 1 ELSE 0 END, "
            f"{_COLUMNS} FROM units WHERE run_id = ? AND step_id IN ({marks})",
            (rewind_id, run_id, *reopened),
        ).rowcount
        not_again = "UPDATE superseded_units SET reusable = 0 WHERE run_id = ? AND reusable = 1 AND "
        if redo is True:
            conn.execute(not_again + f"step_id IN ({marks})", (run_id, *reopened))
        conn.execute(not_again + "step_id = ? AND (runner = 'session' OR phase = 'gate')", (run_id, to_step))
        for uid in redo_ids:
            conn.execute(
                not_again + f"step_id IN ({marks}) AND (unit_id = ? OR (unit_id > ? AND unit_id < ?))",
                (run_id, *reopened, uid, uid + "~", uid + "\x7f"),
            )
        # An attempt in flight (a dead driver's, a claim, a queued unit) is ended by the rewind.
        conn.execute(
            "UPDATE superseded_units SET status = 'failed', failure_reason = 'superseded', finished_at = ? "
            "WHERE rewind_id = ? AND status IN ('running', 'queued')",
            (now, rewind_id),
        )
        conn.execute(f"DELETE FROM units WHERE run_id = ? AND step_id IN ({marks})", (run_id, *reopened))
        conn.execute(
            "UPDATE steps SET status = 'pending', notes = NULL, evidence_json = NULL, summary = NULL, "
            "completed_at = NULL, gate_loop_base = 0 WHERE run_id = ? AND sequence_index >= ?",
            (run_id, index),
        )
        liveness = ", lease_session = NULL, lease_liveness = NULL" if db.dialect.liveness else ""
        conn.execute(
            "UPDATE runs SET status = 'active', current_step_id = ?, completed_at = NULL, status_detail_json = NULL, "
            "updated_at = ?, lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_until = NULL, "
            f"lease_epoch = ?{liveness} WHERE id = ?",
            (to_step, now, epoch, run_id),
        )
        usable = int(
            conn.execute(
                "SELECT COUNT(*) AS n FROM superseded_units WHERE rewind_id = ? AND reusable = 1 AND phase IS NULL",
                (rewind_id,),
            ).fetchone()["n"]
        )  # this rewind's rows the engine may restore (older history of the same units may serve too)
        for s in spine:
            if int(s["sequence_index"]) >= index and s["status"] != "pending":
                append_event(
                    db,
                    "workflow_step_updated",
                    run_id,
                    {"runId": run_id, "stepId": s["step_id"], "status": "pending", "rewindId": rewind_id},
                )
        append_event(
            db,
            "workflow_rewound",
            run_id,
            {
                "runId": run_id,
                "rewindId": rewind_id,
                "toStep": to_step,
                "fromStatus": run["status"],
                "steps": reopened,
                "supersededUnits": moved,
                "reusableUnits": usable,
            },
        )
        record = conn.execute("SELECT * FROM rewinds WHERE id = ?", (rewind_id,)).fetchone()
        return RewindOutcome(_rewind(record), reopened, int(moved), usable)


def _check_reached(run_id: str, current: str | None, target: Any) -> None:
    """A rewind goes back to a step the run reached: one it finished, or the one it is on."""
    status, step_id = target["status"], target["step_id"]
    if status == "skipped":
        from akm.codes import Code

        raise UsageError(
            f"Step {step_id} of run {run_id} was skipped (a route chose another branch); rewind to the route "
            "step that skipped it to decide the route again.",
            code=Code.STEP_NOT_REACHED,
            details={"runId": run_id, "stepId": step_id, "status": status},
        )
    if status == "pending" and step_id != current:
        from akm.codes import Code

        raise UsageError(
            f"Run {run_id} has not reached step {step_id} yet (it is on {current}); a rewind goes back to a step "
            "the run finished or is on.",
            code=Code.STEP_NOT_REACHED,
            details={"runId": run_id, "stepId": step_id, "currentStep": current},
        )


def _redo_ids(conn: Any, run_id: str, reopened: list[str], marks: str, redo: bool | Sequence[str]) -> list[str]:
    """The content ids `redo` names, each a unit of the reopened steps (else UNKNOWN_UNIT)."""
    if isinstance(redo, bool):
        return []
    wanted = sorted({content_id(u) for u in redo})
    known = {
        content_id(r["unit_id"])
        for r in conn.execute(
            f"SELECT unit_id FROM units WHERE run_id = ? AND phase IS NULL AND step_id IN ({marks})",
            (run_id, *reopened),
        )
    }
    unknown = [u for u in wanted if u not in known]
    if unknown:
        listed = sorted(known)
        shown = ", ".join(listed[:20]) + (f", … ({len(listed)} in all)" if len(listed) > 20 else "")
        from akm.codes import Code

        raise UsageError(
            f"Cannot redo {', '.join(unknown)}: not a unit journaled in the steps this rewind reopens "
            f"({', '.join(reopened)}). Their units: {shown or '(none)'}.",
            code=Code.UNKNOWN_UNIT,
            details={"runId": run_id, "units": unknown},
        )
    return wanted


# -- history ----------------------------------------------------------------------------------


def list_rewinds(db: Journal, run_id: str) -> list[Rewind]:
    """The run's rewinds, oldest first."""
    return [_rewind(r) for r in db.query("SELECT * FROM rewinds WHERE run_id = ? ORDER BY seq", (run_id,))]


class SupersededStep(NamedTuple):
    rewind_id: str
    step: Step


def superseded_steps(db: Journal, run_id: str) -> list[SupersededStep]:
    """The step rows rewinds reopened, as they were, oldest rewind first and in plan order."""
    rows = db.query(
        f"SELECT s.rewind_id, s.step_id, s.sequence_index, {', '.join('s.' + c for c in _STEP_SNAPSHOT.split(', '))} "
        "FROM superseded_steps s JOIN rewinds r ON r.id = s.rewind_id WHERE s.run_id = ? "
        "ORDER BY r.seq, s.sequence_index",
        (run_id,),
    )
    return [
        SupersededStep(
            r["rewind_id"],
            Step(
                run_id,
                r["step_id"],
                int(r["sequence_index"]),
                r["status"],
                r["notes"],
                r["evidence_json"],
                r["summary"],
                r["completed_at"],
                int(r["gate_loop_base"] or 0),
            ),
        )
        for r in rows
    ]


class SupersededUnit(NamedTuple):
    rewind_id: str
    reusable: bool
    unit: Unit


def superseded_units(db: Journal, run_id: str, step_id: str | None = None) -> list[SupersededUnit]:
    """The unit and gate rows rewinds superseded, oldest rewind first, each ordered as `units.get_units`."""
    sql = (
        f"SELECT s.rewind_id, s.reusable, {', '.join('s.' + c for c in _UNIT_FIELDS)} FROM superseded_units s "
        "JOIN rewinds r ON r.id = s.rewind_id WHERE s.run_id = ?"
    )
    params: list[Any] = [run_id]
    if step_id is not None:
        sql += " AND s.step_id = ?"
        params.append(step_id)
    out = []
    for r in db.query(sql + " ORDER BY r.seq, s.started_at, s.unit_id", params):
        values = list(r)
        out.append(SupersededUnit(values[0], bool(values[1]), Unit(*values[2:])))
    return out


def superseded_content_ids(db: Journal, run_id: str, step_id: str) -> set[str]:
    """Content ids of the units of a step that a rewind superseded (the brief offers them as re-runs)."""
    return {
        content_id(r["unit_id"])
        for r in db.query(
            "SELECT unit_id FROM superseded_units WHERE run_id = ? AND step_id = ? AND phase IS NULL",
            (run_id, step_id),
        )
    }


# -- reuse ------------------------------------------------------------------------------------


class Candidate(NamedTuple):
    """A completed row the engine may restore for a unit with the same content id and input hash."""

    unit_id: str  # its attempt id where it was journaled
    input_hash: str | None
    result_json: str | None
    truncated: int
    runner: str | None
    engine: str | None
    model: str | None
    source: dict[str, Any]  # {"runId", "unitId"} (+ "rewindId" for a superseded row): `reused_from`


_CANDIDATE = "unit_id, input_hash, result_json, truncated, runner, engine, model"


def has_donors(db: Journal, run_id: str, reuse_from: str | None) -> bool:
    """Could any unit of this run be restored? (A run with no rewinds and no `--from` source: never.)"""
    if reuse_from:
        return True
    return db.query_one("SELECT 1 AS one FROM rewinds WHERE run_id = ? LIMIT 1", (run_id,)) is not None


def reuse_candidates(
    db: Journal, run_id: str, step_id: str, reuse_from: str | None, *, gate: bool = False
) -> list[Candidate]:
    """The completed rows a unit of `step_id` (`gate`: a verdict of its gate) may be restored from, the most
    recent source first: rows superseded by this run's rewinds (latest rewind first) and marked reusable, then
    the completed rows of the run `reuse_from` names (verdicts only with the identity they were given on)."""
    phase = "s.phase = 'gate' AND s.input_hash IS NOT NULL" if gate else "s.phase IS NULL"
    out: list[Candidate] = []
    for r in db.query(
        f"SELECT s.rewind_id, {', '.join('s.' + c for c in _CANDIDATE.split(', '))} FROM superseded_units s "
        "JOIN rewinds w ON w.id = s.rewind_id WHERE s.run_id = ? AND s.step_id = ? AND s.reusable = 1 "
        f"AND s.status = 'completed' AND {phase} ORDER BY w.seq DESC",
        (run_id, step_id),
    ):
        source = {"runId": run_id, "unitId": r["unit_id"], "rewindId": r["rewind_id"]}
        out.append(_candidate(r, source))
    if reuse_from:
        for r in db.query(
            f"SELECT {_CANDIDATE} FROM units s WHERE run_id = ? AND step_id = ? AND status = 'completed' AND {phase}",
            (reuse_from, step_id),
        ):
            out.append(_candidate(r, {"runId": reuse_from, "unitId": r["unit_id"]}))
    return out


def _candidate(r: Any, source: dict[str, Any]) -> Candidate:
    return Candidate(
        r["unit_id"],
        r["input_hash"],
        r["result_json"],
        int(r["truncated"] or 0),
        r["runner"],
        r["engine"],
        r["model"],
        source,
    )


class Adoption(NamedTuple):
    """A unit row (or, `phase` gate, a verdict) to write `completed` from a candidate, under the id it has now."""

    unit_id: str
    node_id: str
    parent_unit_id: str | None
    input_hash: str
    candidate: Candidate
    phase: str | None = None


_ADOPT = (
    "INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, status, "
    "input_hash, result_json, truncated, started_at, finished_at, attempts, host, reused_from) "
    "VALUES (?,?,?,?,?,?,?,?,?,'completed',?,?,?,?,?,0,?,?) ON CONFLICT (run_id, unit_id) DO NOTHING"
)


def adopt_units(
    db: Journal, run_id: str, step_id: str, adoptions: Sequence[Adoption], *, fence: Fence | None = None
) -> list[str]:
    """Write each adoption as its unit's `completed` row — no attempt, no tokens, `reused_from` set — with a
    `workflow_unit_reused` event, in one transaction. Returns the unit ids written (a unit that got a row
    meanwhile keeps it). Refuses, writing nothing, when the run cannot be driven or `fence` is no longer
    the run's (LEASE_LOST)."""
    if not adoptions:
        return []
    written: list[str] = []
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        run = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if run is None:
            from akm.codes import Code

            raise NotFoundError(
                f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id}
            )
        if run["status"] not in DRIVABLE_STATUSES:
            raise not_drivable_error(run_id, run["status"], "given units")
        check_fence(conn, run_id, fence)
        now, host = db.now(), host_id()
        for a in adoptions:
            c = a.candidate
            source = compact_json(c.source)
            cur = conn.execute(
                _ADOPT,
                (
                    run_id,
                    a.unit_id,
                    step_id,
                    a.node_id,
                    a.parent_unit_id,
                    a.phase,
                    c.runner,
                    c.engine,
                    c.model,
                    a.input_hash,
                    c.result_json,
                    c.truncated,
                    now,
                    now,
                    host,
                    source,
                ),
            )
            if cur.rowcount == 1:
                written.append(a.unit_id)
                append_event(
                    db,
                    "workflow_unit_reused",
                    run_id,
                    {"runId": run_id, "stepId": step_id, "unitId": a.unit_id, "from": c.source},
                )
    return written
