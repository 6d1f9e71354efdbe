"""Loading a run from the journal, with the integrity checks that make resume safe.

A stored plan must be byte-identical to its own canonical re-serialisation and
match its hash; the step rows must match the plan's steps. Anything else is a
corrupt run: refuse before any lease or dispatch, but leave it inspectable and
abandonable.
"""

from __future__ import annotations

import json
import re
from typing import Any

from akm.canonical import sha256_hex
from akm.errors import UsageError
from akm.format.schema import validate_instance
from akm.plan.model import UNIT_HASH_VERSION, Plan, PlanError
from akm.record import dataclass
from akm.store import runs as runs_store
from akm.store.journal import Journal
from akm.store.runs import Run

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


@dataclass
class LoadedRun:
    run: Run
    plan: Plan
    params: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def status(self) -> str:
        return self.run.status


def _corrupt(run_id: str, what: str) -> UsageError:
    from akm.codes import Code

    return UsageError(
        f"Run {run_id} has a corrupt {what}; it cannot be executed (it can still be inspected or abandoned).",
        code=Code.CORRUPT_RUN,
        details={"runId": run_id},
    )


def decode_plan(run_id: str, plan_json: str | None, plan_hash: str | None) -> Plan:
    if not plan_json:
        raise _corrupt(run_id, "frozen plan (missing)")
    if not plan_hash or not _HEX64.match(plan_hash) or sha256_hex(plan_json) != plan_hash:
        raise _corrupt(run_id, "frozen plan (integrity check failed: plan_hash does not match plan_json)")
    try:
        plan: Plan = Plan.model_validate(json.loads(plan_json))
    except (ValueError, PlanError) as exc:
        raise _corrupt(run_id, f"frozen plan ({str(exc).splitlines()[0]})") from exc
    if plan.canonical() != plan_json:
        raise _corrupt(run_id, "frozen plan (noncanonical JSON)")
    return plan


def _same_plan_and_params(before: Run, now: Run) -> bool:
    """The run row still holds the very plan, params and hash version it held before."""
    return (before.id, before.plan_json, before.plan_hash, before.params_json, before.hash_version) == (
        now.id,
        now.plan_json,
        now.plan_hash,
        now.params_json,
        now.hash_version,
    )


def load_run(db: Journal, run_id: str, prior: LoadedRun | None = None) -> LoadedRun:
    """The run, its frozen plan and its params, checked (a corrupt run is CORRUPT_RUN).

    `prior`: this run as loaded moments ago in the same call (a report reads its run before its write and
    again after it): when the row still holds the very plan and params checked then, they are kept
    instead of decoded and checked again; the run row itself is always read afresh."""
    run = runs_store.require_run(db, run_id)
    if prior is not None and _same_plan_and_params(prior.run, run):
        return LoadedRun(run=run, plan=prior.plan, params=prior.params)
    if run.hash_version > UNIT_HASH_VERSION:
        # Its units' identities are a preimage this akm does not know: hashing them some other way
        # would diverge from (or silently redo) the units a newer akm journaled.
        from akm.codes import Code

        raise UsageError(
            f"Run {run_id} was created by a newer akm (unit hash version {run.hash_version}; this akm computes "
            f"up to {UNIT_HASH_VERSION}); drive it with that akm (it can still be inspected or abandoned here).",
            code=Code.CORRUPT_RUN,
            details={"runId": run_id},
        )
    plan = decode_plan(run_id, run.plan_json, run.plan_hash)
    try:
        params = json.loads(run.params_json or "{}")
    except ValueError as exc:
        raise _corrupt(run_id, "params record") from exc
    if not isinstance(params, dict):
        raise _corrupt(run_id, "params record")
    if plan.param_schemas:
        errors = validate_instance(params, {"type": "object", "properties": plan.param_schemas}, "params")
        if errors:
            raise _corrupt(run_id, "params record (" + "; ".join(errors) + ")")
    if [s.step_id for s in runs_store.get_steps(db, run_id)] != [p.step_id for p in plan.steps]:
        raise _corrupt(run_id, "step spine (step rows do not match the frozen plan)")
    return LoadedRun(run=run, plan=plan, params=params)
