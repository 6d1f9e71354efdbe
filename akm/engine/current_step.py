"""The current step of a run as the session protocol reads it, and its decision, made once per read.

A brief reads the whole step and decides it (`decided`). A report reads it twice: before its write, only
what its guards need (the gate, the work list and its own unit's rows: `read_current(rows=False)`,
`unit_state`), and after its write, under the finalize lock, the whole step, which it then decides once.
The decision is `finalize.decide_step`'s, with the same pure inputs as the drive loop's, so both drivers
finish a step alike (tests/test_parity.py).
"""

from __future__ import annotations

import threading
from typing import Any

from akm.engine import gates
from akm.engine.finalize import GateState, StepDecision, UnitState, decide_step, gate_row_for, unit_states
from akm.engine.finalize import unit_state as classify
from akm.engine.session_types import Claim
from akm.engine.state import LoadedRun, load_run
from akm.engine.stepctx import Spine, load_gate, load_spine, step_rows
from akm.engine.worklist import StepFailure, WorkList, WorkUnit
from akm.plan.model import StepPlan
from akm.record import dataclass, field
from akm.store import units as units_store
from akm.store.journal import Journal
from akm.store.runs import holder_is_live
from akm.store.status import DRIVABLE_STATUSES


@dataclass
class CurrentStep:
    """A run and its current step as read now. `gate` is set when the step takes work (the run is drivable
    and the step not skipped); `rows` (its dispatch rows) once the whole step was read."""

    loaded: LoadedRun
    spine: Spine
    step: StepPlan | None
    gate: GateState | None = None
    gate_rows: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] | None = None
    decision: StepDecision | None = None

    @property
    def run_id(self) -> str:
        return self.loaded.run_id


def read_current(db: Journal, run_id: str, *, rows: bool = True, prior: LoadedRun | None = None) -> CurrentStep:
    """The run and its current step. `rows` False: the gate rows only (a report's guards read their own
    unit's rows); `prior`: the run as loaded earlier in the same call (see `state.load_run`)."""
    loaded = load_run(db, run_id, prior)
    spine = load_spine(db, run_id, loaded.plan)
    run = loaded.run
    step = loaded.plan.step(run.current_step_id) if run.current_step_id else None
    cur = CurrentStep(loaded, spine, step)
    if step is None or run.status not in DRIVABLE_STATUSES or spine.routes.skip_reason(step) is not None:
        return cur
    if rows:
        cur.rows, cur.gate_rows = step_rows(db, run_id, step.step_id)
    else:
        cur.gate_rows = units_store.gate_rows(db, run_id, step.step_id)
    cur.gate = load_gate(db, run_id, step, spine, cur.gate_rows)
    return cur


def decided(db: Journal, cur: CurrentStep) -> StepDecision | None:
    """The step's decision (None: no step takes work), made once per read: the whole step is read first
    when the read skipped its rows."""
    if cur.decision is not None or cur.step is None or cur.gate is None:
        return cur.decision
    if cur.rows is None:
        cur.rows = step_rows(db, cur.run_id, cur.step.step_id)[0]
    cur.decision = decide_step(
        run_id=cur.run_id,
        step=cur.step,
        params=cur.loaded.params,
        outputs=cur.spine.outputs,
        engines=cur.loaded.plan.execution.engines,
        gate=cur.gate,
        rows=cur.rows,
        fail_fast=True,
        work_list=work_list(cur),
        hash_version=cur.loaded.run.hash_version,
    )
    return cur.decision


# ---------------------------------------------------------------- the work list, remembered


@dataclass(frozen=True)
class _Work:
    """A step's work list, its units (none when it failed to build) and them by content id and base id."""

    work_list: WorkList | StepFailure
    units: list[WorkUnit]
    by_id: dict[str, WorkUnit]


_WORK_LISTS: dict[tuple[Any, ...], _Work] = {}
_WORK_LISTS_LOCK = threading.Lock()
_WORK_LISTS_MAX = 8


def _work(cur: CurrentStep) -> _Work | None:
    """The step's work list, remembered per (run, spine, gate state): a long-lived server answering a
    report per unit of a 1000-unit fan-out would otherwise rebuild (and rehash) it for every report.
    None for a step with no units (a route step) or none to take."""
    from akm.canonical import canonical_json
    from akm.engine.finalize import work_list_for

    step, gate = cur.step, cur.gate
    if step is None or gate is None or step.root is None:
        return None
    key = (
        cur.run_id,
        cur.loaded.run.plan_hash,
        cur.loaded.run.hash_version,
        step.step_id,
        gate.loop,
        gate.base,
        canonical_json(gate.feedback),
        tuple((s.step_id, s.status, s.completed_at) for s in cur.spine.steps),
    )
    with _WORK_LISTS_LOCK:
        hit = _WORK_LISTS.get(key)
    if hit is not None:
        return hit
    wl = work_list_for(
        cur.run_id,
        step,
        cur.loaded.params,
        cur.spine.outputs,
        cur.loaded.plan.execution.engines,
        gate,
        cur.loaded.run.hash_version,
    )
    units = wl.units if isinstance(wl, WorkList) else []
    by_id: dict[str, WorkUnit] = {}
    for u in units:
        by_id.setdefault(u.unit_id, u)
        by_id.setdefault(u.base_id, u)
    work = _Work(wl, units, by_id)
    with _WORK_LISTS_LOCK:
        if len(_WORK_LISTS) >= _WORK_LISTS_MAX:
            _WORK_LISTS.pop(next(iter(_WORK_LISTS)))
        _WORK_LISTS[key] = work
    return work


def work_list(cur: CurrentStep) -> WorkList | StepFailure | None:
    work = _work(cur)
    return work.work_list if work is not None else None


def _open_work(cur: CurrentStep) -> _Work | None:
    """The work list when the step's units take reports now: not a gate-exhausted step, not a work list
    that failed to build (`decide_step` gives those no units either)."""
    if cur.gate is None or cur.gate.exhausted:
        return None
    work = _work(cur)
    return work if work is not None and isinstance(work.work_list, WorkList) else None


def work_unit(cur: CurrentStep, unit_id: str) -> WorkUnit | None:
    """The unit of the current work named by its content id or its journal base id, else None."""
    work = _open_work(cur)
    return work.by_id.get(unit_id) if work is not None else None


def work_unit_ids(cur: CurrentStep) -> list[str]:
    """The content ids of the current work's units, in work-list order (what a refusal lists)."""
    work = _open_work(cur)
    return [u.unit_id for u in work.units] if work is not None else []


def unit_state(db: Journal, cur: CurrentStep, unit: WorkUnit) -> UnitState:
    """One unit against its attempt rows of this loop, as `decide_step` classifies it, from its rows alone."""
    assert cur.step is not None and cur.gate is not None
    if cur.rows is not None:
        family = [r for r in cur.rows if _base(r["unit_id"]) == unit.base_id]
    else:
        family = units_store.attempt_rows(db, cur.run_id, cur.step.step_id, unit.base_id)
    return classify(unit, family, cur.gate.loop)


def all_states(db: Journal, cur: CurrentStep) -> list[UnitState]:
    """Every unit of the current work against the step's rows (read now when the read skipped them)."""
    work = _open_work(cur)
    if work is None or cur.step is None or cur.gate is None:
        return []
    if cur.rows is None:
        cur.rows = step_rows(db, cur.run_id, cur.step.step_id)[0]
    assert isinstance(work.work_list, WorkList)
    return unit_states(work.work_list, cur.rows, cur.gate.loop)


def _base(unit_id: str) -> str:
    from akm.plan.identity import base_of_attempt

    return base_of_attempt(unit_id) if "~r" in unit_id else unit_id


# ---------------------------------------------------------------- gates and claims


def is_session_judged(cur: CurrentStep) -> bool:
    """The step's gate has no judge engine: the calling agent gives the verdict."""
    assert cur.step is not None
    return gates.judge_engine(cur.loaded.plan, cur.step)[0] is None


def judge_failed_here(cur: CurrentStep) -> bool:
    """The step's judge engine failed on the loop now to judge (its gate row is finished `failed`: no verdict,
    the step was blocked and the run resumed since): the calling agent may give the verdict instead, so a
    judge engine that keeps failing (an answer that is not JSON) never leaves the run without a way on."""
    d = cur.decision
    if cur.step is None or d is None or d.kind != "judge":
        return False
    row_id = gate_row_for(cur.step.step_id, d.loop)
    return any(r["unit_id"] == row_id and r.get("status") == "failed" for r in cur.gate_rows)


def takes_verdict(cur: CurrentStep) -> bool:
    """The step awaits a verdict from the calling agent: its gate has no judge engine, or the engine failed."""
    return is_session_judged(cur) or judge_failed_here(cur)


def live_claim(row: dict[str, Any] | None, now: str) -> Claim | None:
    """A unit row's live claim, else None."""
    if row is None or row.get("status") != "running":
        return None
    if not holder_is_live(
        row.get("claim_holder"), row.get("claim_host"), row.get("claim_pid"), row.get("claim_expires_at"), now
    ):
        return None
    return Claim(row["claim_holder"], row["claim_expires_at"])
