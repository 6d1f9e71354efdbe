"""Restoring units instead of running them: the engine's half of reuse (spec/engine.md "Rewind and reuse").

When a driver (the drive loop, or a report finishing its step) finds units of the current step with no row
yet, a completed row with the same identity — the unit's content id and input hash, the key the engine
already keys every unit by (akm/plan/identity.py) — is restored as that unit's row instead of running it:
a row a rewind of this run superseded (unless the rewind said to redo it), or a row of the run a
`workflow run FILE --from RUN` run reuses. No process, no model call, no tokens; the row says where it came
from (`reused_from`). The decision is then taken again, over the restored rows, by the same
`finalize.decide_step` as always, so a restored step reduces, is judged and routes as it would have.
"""

from __future__ import annotations

from typing import Any, Callable

from akm.engine.finalize import PENDING, StepDecision
from akm.engine.state import LoadedRun
from akm.plan.model import Plan, StepPlan
from akm.store import rewinds as rewinds_store
from akm.store.journal import Journal
from akm.store.runs import Fence


def restorable(
    db: Journal, run_id: str, reuse_from: str | None, plan: Plan, step: StepPlan, decision: StepDecision
) -> list[rewinds_store.Adoption]:
    """The pending units of `decision` that have a row to restore, each with the row it would be copied from
    (`run_id`: the run, or "" for one not created yet; `reuse_from`: its `--from` source)."""
    pending = [s for s in decision.states if s.status == PENDING]
    if not pending or not rewinds_store.has_donors(db, run_id, reuse_from):
        return []
    redone = _redone_by_rewinds(db, run_id, plan, step) if reuse_from else None
    index: dict[tuple[str, str | None], rewinds_store.Candidate] = {}
    for c in rewinds_store.reuse_candidates(db, run_id, step.step_id, reuse_from):
        key = (rewinds_store.content_id(c.unit_id), c.input_hash)
        if redone is not None and "rewindId" not in c.source and redone(key[0], c.runner, False):
            continue  # a rewind of this run said to do it anew
        index.setdefault(key, c)  # the most recent source wins
    if not index:
        return []
    out = []
    for s in pending:
        u = s.unit
        found = index.get((u.unit_id, u.input_hash))
        if found is not None:
            out.append(rewinds_store.Adoption(u.base_id, u.node_id, u.parent_unit_id, u.input_hash, found))
    return out


def restore(
    db: Journal,
    loaded: LoadedRun,
    step: StepPlan,
    decision: StepDecision,
    *,
    fence: Fence | None = None,
    write: Callable[..., Any] | None = None,
) -> int:
    """Restore what `restorable` finds, in one journal write (`write`: the driver's fenced-write wrapper).
    Returns how many units were restored (the caller decides the step again when any were)."""
    adoptions = restorable(db, loaded.run_id, loaded.run.reuse_from, loaded.plan, step, decision)
    if not adoptions:
        return 0
    call = write or (lambda fn, *a, **k: fn(*a, **k))
    written = call(rewinds_store.adopt_units, db, loaded.run_id, step.step_id, adoptions, fence=fence)
    return len(written)


def restorable_verdict(
    db: Journal, run_id: str, reuse_from: str | None, plan: Plan, step: StepPlan, decision: StepDecision
) -> rewinds_store.Adoption | None:
    """For a `judge` decision: a verdict given before on the same question (`gates.verdict_identity`: the same
    rubric, units and artifact, the same judge) to restore as this loop's gate row, or None."""
    if decision.kind != "judge" or not rewinds_store.has_donors(db, run_id, reuse_from):
        return None
    from akm.engine import gates
    from akm.plan.identity import gate_row_id

    identity = gates.verdict_identity(plan, step, decision.result, decision.artifact)
    if identity is None:
        return None
    row_id = gate_row_id(step.step_id, decision.loop)
    redone = _redone_by_rewinds(db, run_id, plan, step) if reuse_from else None
    for c in rewinds_store.reuse_candidates(db, run_id, step.step_id, reuse_from, gate=True):
        if c.unit_id != row_id or c.input_hash != identity:
            continue
        if redone is not None and "rewindId" not in c.source and redone(c.unit_id, c.runner, True):
            continue
        return rewinds_store.Adoption(row_id, step.gate.id, None, identity, c, phase="gate")
    return None


def restore_verdict(
    db: Journal,
    loaded_run_id: str,
    reuse_from: str | None,
    plan: Plan,
    step: StepPlan,
    decision: StepDecision,
    *,
    fence: Fence | None = None,
    write: Callable[..., Any] | None = None,
) -> bool:
    """Restore `restorable_verdict` as the loop's gate row; True when it did (decide the step again)."""
    found = restorable_verdict(db, loaded_run_id, reuse_from, plan, step, decision)
    if found is None:
        return False
    call = write or (lambda fn, *a, **k: fn(*a, **k))
    return bool(call(rewinds_store.adopt_units, db, loaded_run_id, step.step_id, [found], fence=fence))


def _redone_by_rewinds(db: Journal, run_id: str, plan: Plan, step: StepPlan) -> Callable[[str, str | None, bool], bool]:
    """Whether a rewind of this run said to do a unit of `step` anew — `redo` (all, or that unit), or a session
    unit of the step it went back to — so a `--from` source may not serve it. (A rewind marks the rows of its
    own history not reusable instead, `rewinds.rewind_run`.)"""
    order = {s.step_id: i for i, s in enumerate(plan.steps)}
    here = order.get(step.step_id, -1)
    every, session = False, False
    ids: set[str] = set()
    for r in rewinds_store.list_rewinds(db, run_id):
        if here < order.get(r.to_step, len(order)):
            continue  # this rewind went back to a later step: it did not reopen `step`
        if r.redo is True:
            every = True
        elif isinstance(r.redo, list):
            ids.update(str(u) for u in r.redo)
        session = session or r.to_step == step.step_id
    return lambda unit_id, runner, gate: every or unit_id in ids or (session and (gate or runner == "session"))
