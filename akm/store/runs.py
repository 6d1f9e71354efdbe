"""Runs, the step spine, and the run lease (spec/engine.md; spec/decisions.md D7, D16).

Return types: `Run`, `Step` and `LeaseInfo` named tuples (documented
below). Every state change is one short `BEGIN IMMEDIATE` transaction, and
the events it implies are appended in that same transaction, so the log can
never claim something the tables do not show (or miss something they do).

Run statuses: `active`, `awaiting_session`, `blocked`, `failed`, `completed`,
`abandoned` (final: given up by the user; never resumed or driven again).
`awaiting_session` (D11) is a *drivable* status just like `active`: it is
found by `find_active_run`, counts for the identical-start guard of
`create_run`, listed by `list_runs(active_only=True)`, may take/renew the lease,
may complete steps, and `resume` treats it as a no-op. When a step completes
on such a run the derived state replaces it (`active` if steps remain); the
session layer sets `awaiting_session` again if it still waits.

Lease (D16): holder id + host id + pid + expiry + epoch. A lease is live when
holder and expiry are set and expiry >= now (fixed-width ISO strings compare as
times), except that a holder on *this* host whose pid no longer exists is dead
at once, so a crashed `workflow run` is resumable immediately. "This host" is
the host id (`host_id`): hostname + boot id + PID namespace, since a pid means
nothing across a reboot or a PID namespace. The epoch is the fencing counter:
every acquisition bumps it, and a driver's writes carry its `Fence` (holder,
epoch) so that they commit only while it still owns the run (LEASE_LOST).

Error codes raised here: RUN_ALREADY_ACTIVE, RUN_NOT_ACTIVE, RUN_ABANDONED, RUN_COMPLETED,
RUN_ALREADY_FINISHED, STEP_NOT_PENDING, STEP_NOT_CURRENT, LEASE_HELD
(UsageError) and NOT_FOUND (NotFoundError).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from akm.canonical import CanonicalError, canonical_json, compact_json
from akm.errors import NotFoundError, UsageError
from akm.store.events import append_event, has_event
from akm.store.journal import RUN_UPDATE, RUN_WRITE, HolderLiveness, Journal
from akm.store.status import (  # noqa: E402,F401
    DRIVABLE_STATUSES,
    RUN_STATUSES,
    STEP_TERMINAL_STATUSES,
    RunStatus,
    StepStatus,
)

LEASE_TTL_S = 90.0
LEASE_TTL_ENV = "AKM_LEASE_TTL_S"  # overrides the TTL (seconds); for tests and slow shared hosts

_DRIVABLE_SQL = "(" + ",".join(f"'{s}'" for s in DRIVABLE_STATUSES) + ")"


# -- rows -------------------------------------------------------------------------------------


class LeaseInfo(NamedTuple):
    """Who holds a lease (or claim) and until when (ISO timestamp)."""

    holder: str
    host: str | None
    pid: int | None
    until: str


class Fence(NamedTuple):
    """A driver's claim on the run as its writes check it: the holder id and the epoch it acquired."""

    holder: str
    epoch: int


class Run(NamedTuple):
    """One `runs` row. JSON columns are kept raw; the properties decode them."""

    id: str
    workflow_ref: str
    workflow_path: str | None
    title: str
    status: RunStatus
    params_json: str
    current_step_id: str | None
    created_at: str
    updated_at: str
    completed_at: str | None
    scope_key: str
    plan_json: str
    plan_hash: str
    hash_version: int
    lease_holder: str | None
    lease_host: str | None
    lease_pid: int | None
    lease_until: str | None
    status_detail_json: str | None
    lease_epoch: int = 0
    reuse_from: str | None = None  # `workflow run FILE --from RUN`: the run whose completed units this one reuses

    @property
    def params(self) -> dict[str, Any]:
        """The params object; CORRUPT_RUN when the stored record is not one."""
        try:
            value = json.loads(self.params_json) if self.params_json else {}
        except ValueError:
            value = None
        if not isinstance(value, dict):
            from akm.codes import Code

            raise UsageError(
                f"Run {self.id} has a corrupt params record (not a JSON object); it can still be inspected "
                "or abandoned.",
                code=Code.CORRUPT_RUN,
                details={"runId": self.id},
            )
        return value

    @property
    def status_detail(self) -> dict[str, Any] | None:
        return json.loads(self.status_detail_json) if self.status_detail_json else None

    @property
    def drivable(self) -> bool:
        return self.status in DRIVABLE_STATUSES


class Step(NamedTuple):
    """One `steps` row (the spine)."""

    run_id: str
    step_id: str
    sequence_index: int
    status: StepStatus
    notes: str | None
    evidence_json: str | None
    summary: str | None
    completed_at: str | None
    gate_loop_base: int = 0

    @property
    def evidence(self) -> Any:
        return json.loads(self.evidence_json) if self.evidence_json else None


_RUN_COLUMNS = ", ".join(Run._fields)
_STEP_COLUMNS = ", ".join(Step._fields)


def _run(row: Any) -> Run:
    return Run(**{k: row[k] for k in Run._fields})


def _step(row: Any) -> Step:
    return Step(**{k: row[k] for k in Step._fields})


# -- liveness (shared with unit claims) -------------------------------------------------------


_HOST: str | None = None
_HOST_ID: str | None = None
HOST_ID_ENV = "AKM_HOST_ID"


def hostname() -> str:
    """This machine's name, for display (socket is imported on first need only)."""
    global _HOST
    if _HOST is None:
        uname = getattr(os, "uname", None)
        if uname is not None:
            _HOST = uname().nodename  # what socket.gethostname() answers on POSIX, without importing socket
        else:
            import socket

            _HOST = socket.gethostname()
    return _HOST


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""


def host_id() -> str:
    """Where a pid means something, as leases and claims record it: `hostname/boot/pidns`.

    The same hostname is not the same pid space: after a reboot pids are reused, and a process in
    another PID namespace (a container, `unshare --pid`) sees other pids — judging a holder "dead"
    by its pid there would let a second driver take over a live run. So the id adds the boot id
    (Linux: /proc/sys/kernel/random/boot_id, first 12 hex digits) and the PID namespace inode
    (readlink /proc/self/ns/pid). Without /proc (macOS) it is the hostname alone: no PID
    namespaces there, and a pid recycled after a reboot only keeps a dead lease until it expires.
    `AKM_HOST_ID` overrides it (two "hosts" on one machine in tests; a container whose /proc says too
    little). It must be unique per pid space: two hosts sharing one would judge each other's holders by
    pids of the wrong machine.
    """
    global _HOST_ID
    if _HOST_ID is None and os.environ.get(HOST_ID_ENV, "").strip():
        _HOST_ID = os.environ[HOST_ID_ENV].strip()
    if _HOST_ID is None:
        boot = _read_first_line("/proc/sys/kernel/random/boot_id").replace("-", "")[:12]
        try:
            ns = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
        except OSError:
            ns = ""
        ns = ns[ns.find("[") + 1 : ns.rfind("]")] if "[" in ns else ns
        _HOST_ID = "/".join(part for part in (hostname(), boot, ns) if part) if boot or ns else hostname()
    return _HOST_ID


def lease_ttl_s() -> float:
    """The lease TTL in seconds: AKM_LEASE_TTL_S when set (INVALID_ENV unless a number > 0), else 90."""
    return seconds_from_env(LEASE_TTL_ENV, LEASE_TTL_S)


def seconds_from_env(name: str, default: float) -> float:
    """A TTL override in seconds (`30` or `30s`) from the environment; INVALID_ENV unless a number > 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw.removesuffix("s"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        from akm.codes import Code

        raise UsageError(
            f"{name} must be a number of seconds greater than 0, not {raw!r}.",
            code=Code.INVALID_ENV,
            details={"name": name, "value": raw},
            hint=f"Unset {name} for the default of {default:g} s.",
        )
    return value


def pid_alive(pid: int) -> bool:
    """Does a process with this pid exist on this host? (EPERM means it exists.)"""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped yet (its parent died, and a container's init may never reap
    it) still answers kill(pid, 0): on Linux /proc tells it is dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2][:2] == b" Z"
    except OSError:
        return False


def holder_is_live(holder: str | None, host: str | None, pid: int | None, until: str | None, now: str) -> bool:
    """The lease/claim rule: set, not expired, and not a dead process on this host (same `host_id`)."""
    if holder is None or until is None or until < now:
        return False
    if host is not None and pid is not None and host == host_id() and not pid_alive(pid):
        return False
    return True


# -- reads ------------------------------------------------------------------------------------


def get_run(db: Journal, run_id: str) -> Run | None:
    row = db.query_one(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
    return _run(row) if row else None


def run_status(db: Journal, run_id: str) -> str | None:
    """Just the run's status (a cheap read the heartbeat polls), or None for no such run."""
    row = db.query_one("SELECT status FROM runs WHERE id = ?", (run_id,))
    return row["status"] if row else None


def run_status_and_lease(db: Journal, run_id: str) -> tuple[str, str | None, int] | None:
    """(status, lease holder, lease epoch) of the run, or None for no such run: the heartbeat's poll."""
    row = db.query_one("SELECT status, lease_holder, lease_epoch FROM runs WHERE id = ?", (run_id,))
    return (row["status"], row["lease_holder"], int(row["lease_epoch"])) if row else None


def not_drivable_error(run_id: str, status: str, verb: str) -> UsageError:
    """The one refusal for acting on a run that cannot be driven: abandoned runs say so (they are final)."""
    if status == "abandoned":
        from akm.codes import Code

        return UsageError(
            f"workflow run {run_id} was abandoned and cannot be {verb}; abandoning is final",
            code=Code.RUN_ABANDONED,
            details={"runId": run_id, "status": status},
        )
    from akm.codes import Code

    return UsageError(
        f"workflow run {run_id} is {status} and cannot be {verb}",
        code=Code.RUN_NOT_ACTIVE,
        details={"runId": run_id, "status": status},
    )


def require_run(db: Journal, run_id: str) -> Run:
    """Like `get_run` but raises NotFoundError (the one "no such run" error both fronts show)."""
    run = get_run(db, run_id)
    if run is None:
        from akm.codes import Code
        from akm.text import shown

        raise NotFoundError(
            f"No workflow run with id {shown(run_id)}.", code=Code.RUN_NOT_FOUND, details={"runId": run_id}
        )
    return run


def runs_with_id_prefix(db: Journal, prefix: str, limit: int) -> list[tuple[str, str, str, str]]:
    """(id, status, workflow ref, created_at) of at most `limit` runs whose id starts with `prefix` (hex
    digits and dashes: no LIKE wildcard), newest first: what a run id typed in part names (the api refuses an
    ambiguous one, listing these)."""
    if not all(c in "0123456789abcdef-" for c in prefix):
        return []
    rows = db.query(
        "SELECT id, status, workflow_ref, created_at FROM runs WHERE id LIKE ? "
        f"ORDER BY created_at DESC, {db.dialect.rowid} DESC LIMIT ?",
        (prefix + "%", limit),
    )
    return [(r["id"], r["status"], r["workflow_ref"], r["created_at"]) for r in rows]


def newest_run_id(db: Journal, scope_keys: tuple[str, ...]) -> str | None:
    """The id of the newest run under any of the scope keys (a project's), or None."""
    marks = ", ".join("?" for _ in scope_keys)
    row = db.query_one(
        f"SELECT id FROM runs WHERE scope_key IN ({marks}) ORDER BY created_at DESC, {db.dialect.rowid} DESC LIMIT 1",
        tuple(scope_keys),
    )
    return row["id"] if row else None


def list_runs(
    db: Journal, scope_key: str | None = None, active_only: bool = False, ref: str | None = None
) -> list[Run]:
    """Runs newest first (created_at, then insertion). `active_only` = drivable statuses."""
    where: list[str] = []
    params: list[Any] = []
    if scope_key is not None:
        where.append("scope_key = ?")
        params.append(scope_key)
    if ref is not None:
        where.append("workflow_ref = ?")
        params.append(ref)
    if active_only:
        where.append(f"status IN {_DRIVABLE_SQL}")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = db.query(
        f"SELECT {_RUN_COLUMNS} FROM runs{clause} ORDER BY created_at DESC, {db.dialect.rowid} DESC", params
    )
    return [_run(r) for r in rows]


def same_params(params_json: str | None, params: dict[str, Any]) -> bool:
    """Do a stored params snapshot and a params object hold the same values (key order aside)?"""
    try:
        stored = json.loads(params_json) if params_json else {}
        return canonical_json(stored) == canonical_json(params)
    except (ValueError, CanonicalError):
        return False  # an unreadable snapshot matches nothing: a new run is the safe answer


def find_active_run(db: Journal, ref: str, scope_key: str, params: dict[str, Any] | None = None) -> Run | None:
    """The drivable run (active or awaiting_session) of ref in scope — with exactly these params when
    given — or None; the most recently updated wins."""
    rows = db.query(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE workflow_ref = ? AND scope_key = ? AND status IN {_DRIVABLE_SQL} "
        f"ORDER BY updated_at DESC, created_at DESC, {db.dialect.rowid} DESC",
        (ref, scope_key),
    )
    for row in rows:
        if params is None or same_params(row["params_json"], params):
            return _run(row)
    return None


def get_steps(db: Journal, run_id: str) -> list[Step]:
    """The spine in plan order."""
    rows = db.query(f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY sequence_index", (run_id,))
    return [_step(r) for r in rows]


# -- create -----------------------------------------------------------------------------------


def create_run(
    db: Journal,
    *,
    run_id: str,
    workflow_ref: str,
    workflow_path: str | None,
    title: str,
    scope_key: str,
    params: dict[str, Any],
    plan_json: str,
    plan_hash: str,
    hash_version: int,
    step_ids: Sequence[str],
    join_identical: bool = True,
    reuse_from: str | None = None,
    trace_parent: str | None = None,
) -> Run:
    """Insert an `active` run and its `pending` spine in one tx; emits `workflow_started`
    (with `trace_parent`, a caller's W3C traceparent the run's trace continues: akm.telemetry.context).

    With `join_identical` (the default) it refuses (UsageError
    RUN_ALREADY_ACTIVE, details.runId) when a drivable run of the same ref,
    scope and params already exists: two identical starts racing each other
    end with one run, and the loser continues the winner's. Runs of the same
    workflow with other params live side by side; `join_identical=False`
    always inserts (a deliberate fresh start). `reuse_from`: the run whose completed units the engine
    reuses when it meets the same unit (content id and input hash) in this one (`workflow run --from`).
    """
    steps = list(step_ids)
    if not steps:
        raise UsageError(f"workflow {workflow_ref!r} has no steps; nothing to run")
    if len(set(steps)) != len(steps):
        raise UsageError(f"workflow {workflow_ref!r} declares a step id twice")
    now = db.now()
    with db.tx() as conn:
        if join_identical:
            db.dialect.identity_lock(conn, f"{workflow_ref}\x1f{scope_key}")  # identical starts, one at a time
            for existing in conn.execute(
                f"SELECT id, status, params_json FROM runs WHERE workflow_ref = ? AND scope_key = ? "
                f"AND status IN {_DRIVABLE_SQL} ORDER BY updated_at DESC",
                (workflow_ref, scope_key),
            ):
                if same_params(existing["params_json"], params):
                    from akm.codes import Code

                    raise UsageError(
                        f"workflow {workflow_ref} already has an {existing['status']} run ({existing['id']}) "
                        "with the same params in this project",
                        code=Code.RUN_ALREADY_ACTIVE,
                        details={"runId": existing["id"]},
                    )
        inserted = conn.execute(
            "INSERT INTO runs (id, workflow_ref, workflow_path, title, status, params_json, current_step_id, "
            "created_at, updated_at, scope_key, plan_json, plan_hash, hash_version, reuse_from) "
            f"VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {_RUN_COLUMNS}",
            (
                run_id,
                workflow_ref,
                workflow_path,
                title,
                compact_json(params),
                steps[0],
                now,
                now,
                scope_key,
                plan_json,
                plan_hash,
                hash_version,
                reuse_from,
            ),
        ).fetchone()
        conn.executemany(
            "INSERT INTO steps (run_id, step_id, sequence_index, status) VALUES (?, ?, ?, 'pending')",
            [(run_id, sid, i) for i, sid in enumerate(steps)],
        )
        started: dict[str, Any] = {"runId": run_id, "status": "active"}
        if trace_parent is not None:
            started["traceparent"] = trace_parent
        append_event(db, "workflow_started", run_id, started)
    return _run(inserted)  # the row as inserted (RETURNING): nothing else writes it before the commit


# -- derive + complete ------------------------------------------------------------------------


def derive_run_state(steps: Sequence[Step]) -> tuple[str, str | None, str | None]:
    """(status, current_step_id, completed_at) from the spine (spec §3.3). Pure.

    First failed/blocked step -> that status; else first unfinished
    (pending/running) -> active; else completed at the latest step stamp.
    """
    ordered = sorted(steps, key=lambda s: s.sequence_index)
    for s in ordered:
        if s.status in ("failed", "blocked"):
            return s.status, s.step_id, None
        if s.status in ("pending", "running"):
            return "active", s.step_id, None
    stamps = [s.completed_at for s in ordered if s.completed_at]
    return "completed", None, (max(stamps) if stamps else None)


def _check_lease_allows(row: Any, lease_holder: str | None, now: str) -> None:
    if holder_is_live(row["lease_holder"], row["lease_host"], row["lease_pid"], row["lease_until"], now) and (
        row["lease_holder"] != lease_holder
    ):
        from akm.codes import Code

        raise UsageError(
            f"workflow run {row['id']} is being driven by engine {row['lease_holder']} "
            f"(lease until {row['lease_until']}); the engine owns the step spine while it runs",
            code=Code.LEASE_HELD,
            hint="Wait for that driver to finish or for its lease to expire.",
            details={"runId": row["id"], "holder": row["lease_holder"], "until": row["lease_until"]},
        )


def lease_lost_error(run_id: str, fence: Fence, holder: str | None, epoch: int | None) -> UsageError:
    """The refusal of a write by a driver that no longer owns the run (another holder took the lease)."""
    who = f"held by {holder} (epoch {epoch})" if holder else f"released (epoch {epoch})"
    from akm.codes import Code

    return UsageError(
        f"This invocation lost its lease on run {run_id} (it held epoch {fence.epoch}; the lease is now {who}); "
        "nothing was written.",
        code=Code.LEASE_LOST,
        details={"runId": run_id, "epoch": fence.epoch, "currentEpoch": epoch, "holder": holder},
        hint="Another invocation drives the run now (it redoes what this one left unfinished); "
        "`workflow status` shows it.",
    )


def check_fence(conn: Any, run_id: str, fence: Fence | None) -> None:
    """Inside the caller's transaction: LEASE_LOST unless the run still carries `fence` (None: no check).

    Expiry alone does not end ownership: a lease lapsed but not taken by anyone is still the
    holder's (its heartbeat renews it); only a new acquisition (a new epoch) or a release does.
    """
    if fence is None:
        return
    row = conn.execute("SELECT lease_holder, lease_epoch FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        from akm.codes import Code

        raise NotFoundError(f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id})
    if row["lease_holder"] != fence.holder or row["lease_epoch"] != fence.epoch:
        raise lease_lost_error(run_id, fence, row["lease_holder"], row["lease_epoch"])


def _drivable_run_row(conn: Any, run_id: str, verb: str) -> Any:
    """The run's status/lease row inside a transaction; refuses runs that cannot be driven now."""
    row = conn.execute(
        "SELECT id, status, current_step_id, lease_holder, lease_host, lease_pid, lease_until, lease_epoch "
        "FROM runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        from akm.codes import Code

        raise NotFoundError(f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id})
    if row["status"] not in DRIVABLE_STATUSES:
        raise not_drivable_error(run_id, row["status"], verb)
    return row


def complete_step(
    db: Journal,
    run_id: str,
    step_id: str,
    status: str,
    *,
    notes: str | None = None,
    evidence_json: str | None = None,
    summary: str | None = None,
    lease_holder: str | None = None,
    status_detail: dict[str, Any] | None = None,
    fence: Fence | None = None,
) -> Run:
    """Finish the current step and re-derive the run, in one tx. Returns the updated Run.

    `fence`: a driver's lease; LEASE_LOST (nothing written) once another holder took the run.

    Preconditions (UsageError otherwise): run drivable, step exists
    (NotFoundError), is `pending`, is the run's current step, and no live
    lease is held by someone other than `lease_holder`. Emits
    `workflow_step_completed` / `workflow_step_updated` and, when the run is
    done, `workflow_finished` in the same tx. `status_detail` is stored on
    the run (e.g. D7's missing criteria for `blocked`); None clears it.
    """
    if status not in STEP_TERMINAL_STATUSES:
        raise UsageError(f"cannot complete a step as {status!r}; use one of {', '.join(STEP_TERMINAL_STATUSES)}")
    now = db.now()
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_WRITE)
        run = _drivable_run_row(conn, run_id, "updated")
        check_fence(conn, run_id, fence)
        _check_lease_allows(run, lease_holder, now)
        step = conn.execute("SELECT status FROM steps WHERE run_id = ? AND step_id = ?", (run_id, step_id)).fetchone()
        if step is None:
            raise NotFoundError(f"step {step_id!r} not found in workflow run {run_id}")
        if step["status"] != "pending":
            from akm.codes import Code

            raise UsageError(f"step {step_id} of run {run_id} is already {step['status']}", code=Code.STEP_NOT_PENDING)
        if run["current_step_id"] != step_id:
            from akm.codes import Code

            raise UsageError(
                f"step {step_id} is not the current step of run {run_id}; complete {run['current_step_id']} first",
                code=Code.STEP_NOT_CURRENT,
            )
        clean_notes = notes.strip() if notes is not None and notes.strip() else None
        conn.execute(
            "UPDATE steps SET status = ?, notes = ?, evidence_json = ?, summary = ?, completed_at = ? "
            "WHERE run_id = ? AND step_id = ?",
            (status, clean_notes, evidence_json, summary, now, run_id, step_id),
        )
        spine = [_step(r) for r in conn.execute(f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ?", (run_id,))]
        new_status, current, completed_at = derive_run_state(spine)
        conn.execute(
            "UPDATE runs SET status = ?, current_step_id = ?, completed_at = ?, updated_at = ?, "
            "status_detail_json = ? WHERE id = ?",
            (new_status, current, completed_at, now, compact_json(status_detail) if status_detail else None, run_id),
        )
        event = "workflow_step_completed" if status == "completed" else "workflow_step_updated"
        append_event(db, event, run_id, {"runId": run_id, "stepId": step_id, "status": status})
        if new_status == "completed":
            append_event(db, "workflow_finished", run_id, {"runId": run_id})
    return require_run(db, run_id)


# -- status changes ---------------------------------------------------------------------------


def set_run_status(
    db: Journal, run_id: str, status: RunStatus, detail: dict[str, Any] | None = None, *, fence: Fence | None = None
) -> Run:
    """Switch a drivable run between `active` and `awaiting_session` (D11), storing `detail`.

    Only drivable runs move, and only to a drivable status; anything else is a
    UsageError (steps decide failed/blocked/completed, via `complete_step`).
    `fence`: a driver's lease (LEASE_LOST, nothing written, once it is lost).
    """
    if status not in DRIVABLE_STATUSES:
        raise UsageError(f"set_run_status only moves between active and awaiting_session, not {status!r}")
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_WRITE)
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"workflow run {run_id!r} not found")
        if row["status"] not in DRIVABLE_STATUSES:
            raise not_drivable_error(run_id, row["status"], "updated")
        check_fence(conn, run_id, fence)
        conn.execute(
            "UPDATE runs SET status = ?, status_detail_json = ?, updated_at = ? WHERE id = ?",
            (status, compact_json(detail) if detail else None, db.now(), run_id),
        )
    return require_run(db, run_id)


def resume_run(db: Journal, run_id: str) -> Run:
    """Reopen a blocked/failed run (spec §3.7). Returns the run after the call.

    blocked/failed -> active: the current step goes back to `pending` (notes,
    evidence, completed_at cleared; summary kept), lease, status detail and
    completed_at cleared. active/awaiting_session -> no-op. completed ->
    UsageError RUN_COMPLETED; abandoned -> RUN_ABANDONED (abandoning is final).
    No event (spec §8.1).
    """
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_WRITE)
        row = conn.execute(
            "SELECT status, current_step_id, status_detail_json FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"workflow run {run_id!r} not found")
        if row["status"] == "completed":
            from akm.codes import Code

            raise UsageError(
                f"workflow run {run_id} is already completed and cannot be resumed", code=Code.RUN_COMPLETED
            )
        if row["status"] == "abandoned":
            raise not_drivable_error(run_id, "abandoned", "resumed")
        if row["status"] in ("blocked", "failed"):
            if row["current_step_id"] is not None:
                step_id = row["current_step_id"]
                conn.execute(
                    "UPDATE steps SET status = 'pending', notes = NULL, evidence_json = NULL, completed_at = NULL "
                    "WHERE run_id = ? AND step_id = ? AND status IN ('blocked','failed')",
                    (run_id, step_id),
                )
                # A session unit failed for good is offered to the agent again (the native engine
                # re-dispatches its own failed units on the next invocation anyway).
                conn.execute(
                    "UPDATE units SET reopened = 1 WHERE run_id = ? AND step_id = ? AND phase IS NULL "
                    "AND status = 'failed' AND runner = 'session'",
                    (run_id, step_id),
                )
                if _gate_exhausted(row["status_detail_json"]):
                    # D7: a fresh loop budget, counted from the last journaled gate loop
                    conn.execute(
                        "UPDATE steps SET gate_loop_base = ? WHERE run_id = ? AND step_id = ?",
                        (_highest_gate_loop(conn, run_id, step_id), run_id, step_id),
                    )
            conn.execute(
                "UPDATE runs SET status = 'active', updated_at = ?, completed_at = NULL, status_detail_json = NULL, "
                "lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_until = NULL WHERE id = ?",
                (db.now(), run_id),
            )
    return require_run(db, run_id)


def _gate_exhausted(detail_json: str | None) -> bool:
    try:
        detail = json.loads(detail_json) if detail_json else None
    except ValueError:
        return False
    return isinstance(detail, dict) and detail.get("kind") == "gate_exhausted"


def _highest_gate_loop(conn: Any, run_id: str, step_id: str) -> int:
    prefix = f"{step_id}.gate:l"
    loops = [0]
    for r in conn.execute(
        "SELECT unit_id FROM units WHERE run_id = ? AND step_id = ? AND phase = 'gate'", (run_id, step_id)
    ):
        tail = r["unit_id"][len(prefix) :] if r["unit_id"].startswith(prefix) else ""
        if tail.isdigit() and tail.isascii():
            loops.append(int(tail))
    return max(loops)


ABANDONED_STEP_NOTE = "Not finished: the run was abandoned."
SKIPPED_STEP_NOTE = "Not run: the run was abandoned."


def abandon_run(db: Journal, run_id: str) -> Run:
    """Give up on a run, at once and for good: active/awaiting_session/blocked/failed -> `abandoned`.

    One transaction leaves a spine with nothing left to do: the current step
    (pending, blocked or failed) becomes `failed` (keeping any notes saying
    why it stopped), every later pending step `skipped`, and each change is an
    event. When no live driver holds the run, its `running` unit rows (left by
    a crashed driver) are finished `failed`/`abandoned`; a live driver finishes
    its own, because from this commit on it cannot renew its lease
    (`renew_lease`) nor journal a new unit (`units.insert_unit`), and its
    heartbeat, which polls the run status, stops its in-flight units. The lease
    columns stay as forensic state. `workflow_abandoned` is appended once.
    completed/abandoned -> UsageError RUN_ALREADY_FINISHED.
    """
    now = db.now()
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UPDATE)  # no unit write (KEY SHARE) can start past this commit
        row = conn.execute(
            "SELECT status, current_step_id, lease_holder, lease_host, lease_pid, lease_until FROM runs WHERE id = ?",
            (run_id,),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"workflow run {run_id!r} not found")
        if row["status"] in ("completed", "abandoned"):
            from akm.codes import Code

            raise UsageError(
                f"workflow run {run_id} is already {row['status']}",
                code=Code.RUN_ALREADY_FINISHED,
                details={"runId": run_id, "status": row["status"]},
            )
        changed: list[tuple[str, str]] = []
        for step in conn.execute(
            "SELECT step_id, status, notes FROM steps WHERE run_id = ? AND (status IN ('pending','running','blocked') "
            "OR (step_id = ? AND status = 'failed')) ORDER BY sequence_index",
            (run_id, row["current_step_id"]),
        ).fetchall():
            current = step["step_id"] == row["current_step_id"]
            status = "failed" if current else "skipped"
            notes = step["notes"] or (ABANDONED_STEP_NOTE if current else SKIPPED_STEP_NOTE)
            if step["status"] == status and step["notes"] == notes:
                continue
            conn.execute(
                "UPDATE steps SET status = ?, notes = ?, completed_at = ? WHERE run_id = ? AND step_id = ?",
                (status, notes, now, run_id, step["step_id"]),
            )
            changed.append((step["step_id"], status))
        if not holder_is_live(
            row["lease_holder"], row["lease_host"], row["lease_pid"], row["lease_until"], now
        ) or db.dialect.lease_dead(conn, run_id):
            conn.execute(
                "UPDATE units SET status = 'failed', failure_reason = 'abandoned', finished_at = ? "
                "WHERE run_id = ? AND status = 'running' AND queued_at IS NULL",
                (now, run_id),
            )
        # Units still waiting for a worker (phase 2) will never run now. A worker's running claim ends when its
        # worker finishes or stops it (`queue.finish_claimed` records it `abandoned`), or, if that worker is
        # gone, when the sweep finds the claim lapsed (`queue._put_back` fails it in an abandoned run).
        conn.execute(
            "UPDATE units SET status = 'failed', failure_reason = 'abandoned', finished_at = ? "
            "WHERE run_id = ? AND status = 'queued'",
            (now, run_id),
        )
        conn.execute(
            "UPDATE runs SET status = 'abandoned', updated_at = ?, completed_at = ?, status_detail_json = NULL "
            "WHERE id = ?",
            (now, now, run_id),
        )
        for step_id, status in changed:
            append_event(db, "workflow_step_updated", run_id, {"runId": run_id, "stepId": step_id, "status": status})
        if not has_event(db, "workflow_abandoned", run_id):
            append_event(db, "workflow_abandoned", run_id, {"runId": run_id})
    return require_run(db, run_id)


# -- lease ------------------------------------------------------------------------------------


def _lease_of(row: Any) -> LeaseInfo:
    return LeaseInfo(holder=row["lease_holder"], host=row["lease_host"], pid=row["lease_pid"], until=row["lease_until"])


class DeadHolder(NamedTuple):
    """A lease holder whose liveness session is gone, with its liveness lock now kept by this journal connection
    (`hold_dead_holder`): what `acquire_lease(dead=...)` takes the run over from once the grace has passed."""

    holder: str
    epoch: int
    key: int


def acquire_lease(
    db: Journal,
    run_id: str,
    holder: str,
    ttl_s: float | None = None,
    *,
    host: str | None = None,
    pid: int | None = None,
    liveness: HolderLiveness | None = None,
    dead: DeadHolder | None = None,
) -> LeaseInfo | None:
    """Take the run lease. None on success, else the live holder's LeaseInfo.

    `ttl_s` defaults to `lease_ttl_s()`. Success bumps the lease epoch (the
    fencing counter; `lease_fence` reads the one this holder got).
    `host`/`pid` identify the holder (default: this host id and process).
    A live lease is not re-acquirable, not even by the same holder id. The
    dead-pid check runs first; the UPDATE's WHERE then names the old holder
    and expiry, so of two racers only one can change the row.
    Raises NotFoundError / UsageError RUN_NOT_ACTIVE for a missing or
    non-drivable run.

    Where the journal records holder liveness (PostgreSQL, `Dialect.liveness`), the row records `liveness`
    (this holder's key and server marker, from `Journal.holder_liveness`), or NULLs for none, so a stale key
    never speaks for it. A holder whose liveness session is gone is *not* taken over here: a live driver that
    merely lost that connection is still running units. `dead` (from `hold_dead_holder`, after
    the caller waited out the takeover grace) takes the run over from that holder, provided the row still
    names it at the same epoch and this connection still keeps its liveness lock.
    """
    host = host_id() if host is None else host
    pid = os.getpid() if pid is None else pid
    ttl = lease_ttl_s() if ttl_s is None else ttl_s
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_WRITE)
        row = _drivable_run_row(conn, run_id, "executed")
        now = db.now()
        if holder_is_live(row["lease_holder"], row["lease_host"], row["lease_pid"], row["lease_until"], now) and not (
            dead is not None
            and row["lease_holder"] == dead.holder
            and int(row["lease_epoch"]) == dead.epoch
            and db.dialect.holds_key(conn, dead.key)
        ):
            return _lease_of(row)
        sets, extra = _liveness_sets(db, liveness)
        cur = conn.execute(
            "UPDATE runs SET lease_holder = ?, lease_host = ?, lease_pid = ?, lease_until = ?, "
            f"lease_epoch = lease_epoch + 1{sets} "
            f"WHERE id = ? AND status IN {_DRIVABLE_SQL} AND lease_holder {db.dialect.null_eq} ? "
            f"AND lease_until {db.dialect.null_eq} ?",
            # the TTL from the clock read above, under the same lock: not a second round trip for it
            (holder, host, pid, db.later(now, ttl), *extra, run_id, row["lease_holder"], row["lease_until"]),
        )
        if cur.rowcount == 1:
            return None
        current = conn.execute(
            "SELECT lease_holder, lease_host, lease_pid, lease_until FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        return _lease_of(current)


def take_free_lease(
    db: Journal,
    run_id: str,
    holder: str,
    ttl_s: float | None = None,
    *,
    liveness: HolderLiveness | None = None,
) -> tuple[Fence, str] | None:
    """Take the lease of a drivable run that nobody holds, in one statement: (the fence this holder got, the run's
    status), or None when the lease is held (live or lapsed) or the run is not drivable or not there — then
    `acquire_lease` decides, and says why.

    The usual start of a drive (a run just created, one whose last driver let go) is this case; across a network
    it costs one round trip instead of a transaction (lock, read, clock, update) and a read of the fence. The
    rules are `acquire_lease`'s: the row's holder, host, pid, expiry and liveness columns, the epoch bumped; two
    racers cannot both see the holder NULL (the update re-reads the row once it holds its lock)."""
    host, pid = host_id(), os.getpid()
    ttl = lease_ttl_s() if ttl_s is None else ttl_s
    sets, extra = _liveness_sets(db, liveness)
    if db.backend == "postgres":  # the expiry on the journal clock read in the statement (issue 40)
        from akm.store.postgres import hotpath

        row = hotpath.take_free_lease(db, run_id, holder, host, pid, ttl, sets, extra)
    else:
        with db.tx() as conn:
            row = conn.execute(
                "UPDATE runs SET lease_holder = ?, lease_host = ?, lease_pid = ?, lease_until = ?, "
                f"lease_epoch = lease_epoch + 1{sets} WHERE id = ? AND status IN {_DRIVABLE_SQL} "
                "AND lease_holder IS NULL RETURNING lease_epoch, status",
                (holder, host, pid, db.now(ttl), *extra, run_id),
            ).fetchone()
    return (Fence(holder, int(row["lease_epoch"])), str(row["status"])) if row is not None else None


def hold_dead_holder(db: Journal, run_id: str) -> DeadHolder | None:
    """The run's holder, live by its lease but with its liveness session gone, now kept out of its own liveness
    lock by this journal connection; None when there is no such holder (or the journal keeps no liveness).

    Why keep its lock: the holder may be alive, with only its liveness connection lost. Holding the lock, a
    peer makes sure the holder cannot take it back, so the holder stops its units within its fencing time
    (`akm.engine.fencing`); the peer waits a grace longer than that and then takes over with
    `acquire_lease(dead=...)`. Let go with `release_dead_holder` in every case.
    """
    if not db.dialect.liveness:
        return None
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_WRITE)
        row = _drivable_run_row(conn, run_id, "executed")
        now = db.now()
        if not holder_is_live(row["lease_holder"], row["lease_host"], row["lease_pid"], row["lease_until"], now):
            return None
        key = db.dialect.hold_dead(conn, run_id)
        return DeadHolder(row["lease_holder"], int(row["lease_epoch"]), key) if key is not None else None


def release_dead_holder(db: Journal, dead: DeadHolder) -> None:
    """Let go of the liveness lock `hold_dead_holder` kept (nothing when a reconnect already lost it)."""
    try:
        db.dialect.unhold(db, dead.key)
    except Exception:  # the connection failed: the lock went with it
        pass


def _liveness_sets(db: Journal, liveness: HolderLiveness | None) -> tuple[str, tuple[Any, ...]]:
    """The lease row's liveness columns for an acquisition (nothing where the journal records none)."""
    if not db.dialect.liveness:
        return "", ()
    if liveness is None:
        return ", lease_session = ?, lease_liveness = ?", (None, None)
    return ", lease_session = ?, lease_liveness = ?", (liveness.key, liveness.marker)


def lease_fence(db: Journal, run_id: str, holder: str) -> Fence | None:
    """The fence of the lease `holder` holds now (its epoch), or None when it holds none.

    Read right after `acquire_lease`: holder ids are unique per acquisition and the epoch only
    changes with the holder, so the epoch read is the one this acquisition set.
    """
    row = db.query_one("SELECT lease_epoch FROM runs WHERE id = ? AND lease_holder = ?", (run_id, holder))
    return Fence(holder, int(row["lease_epoch"])) if row else None


def renew_lease(
    db: Journal,
    run_id: str,
    holder: str,
    ttl_s: float | None = None,
    *,
    epoch: int | None = None,
    liveness: HolderLiveness | None = None,
) -> bool:
    """Extend our lease; False when `holder` (at `epoch`, when given) no longer owns it or the run
    stopped being drivable. `ttl_s` defaults to `lease_ttl_s()`.

    `liveness` (the heartbeat's): refreshed first — a lost liveness session is re-taken *before* this
    renewal records the server marker it holds the lock on (None when it cannot: no fast path)."""
    ttl = lease_ttl_s() if ttl_s is None else ttl_s
    marker = liveness.refresh() if liveness is not None and db.dialect.liveness else None
    sets = ", lease_liveness = ?" if liveness is not None and db.dialect.liveness else ""
    if db.backend == "postgres":  # one statement, the journal clock read inside it (issue 40)
        from akm.store.postgres import hotpath

        return hotpath.renew_lease(db, run_id, holder, ttl, epoch=epoch, marker=marker, set_marker=bool(sets))
    with db.tx() as conn:
        cur = conn.execute(
            f"UPDATE runs SET lease_until = ?{sets} WHERE id = ? AND lease_holder = ? AND status IN {_DRIVABLE_SQL}"
            + (" AND lease_epoch = ?" if epoch is not None else ""),
            (db.now(ttl), *((marker,) if sets else ()), run_id, holder, *((epoch,) if epoch is not None else ())),
        )
        renewed: int = cur.rowcount
        return renewed == 1


def release_lease(db: Journal, run_id: str, holder: str) -> bool:
    """Drop our lease on every exit path (no-op when someone else holds it).

    A finished driver's lease is not kept as a record of who ran the run: that
    is task_history's job, and a stale holder shown on a failed run only misleads.
    """
    sets = ", lease_session = NULL, lease_liveness = NULL" if db.dialect.liveness else ""
    with db.tx() as conn:
        cur = conn.execute(
            f"UPDATE runs SET lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_until = NULL{sets} "
            "WHERE id = ? AND lease_holder = ?",
            (run_id, holder),
        )
        released: int = cur.rowcount
        return released == 1


def wait_lease_change(db: Journal, run_id: str, seen: LeaseInfo, deadline: float) -> bool:
    """Block until the run's lease is no longer `seen` (released, taken, expired, or the run stopped
    being drivable): True; False once `deadline` (time.monotonic()) passes first.

    Watches the journal row (one primary-key read per poll, backing off from 2 ms to 50 ms), so a
    waiter learns of the release within milliseconds, not after a fixed sleep.
    """
    import time

    delay = 0.002
    while True:
        row = db.query_one("SELECT status, lease_holder, lease_until FROM runs WHERE id = ?", (run_id,))
        if (
            row is None
            or row["status"] not in DRIVABLE_STATUSES
            or row["lease_holder"] != seen.holder
            or row["lease_until"] is None
            or row["lease_until"] < db.now()
        ):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def read_lease(db: Journal, run_id: str) -> LeaseInfo | None:
    """The live lease on the run, or None (no lease, half-set, expired, dead local holder).

    A holder whose liveness session is gone (PostgreSQL) still counts as live here: it may be a driver that
    lost only that connection and still runs units, until it is taken over (`hold_dead_holder`) or expires."""
    row = db.query_one("SELECT lease_holder, lease_host, lease_pid, lease_until FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise NotFoundError(f"workflow run {run_id!r} not found")
    if not holder_is_live(row["lease_holder"], row["lease_host"], row["lease_pid"], row["lease_until"], db.now()):
        return None
    return _lease_of(row)
