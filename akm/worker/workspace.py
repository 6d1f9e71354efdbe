"""Can this worker run a step's queued units here? Checked before it claims any (spec/journal.md "Workers").

A unit runs in its project as the coordinator would run it, so a worker needs, on its own host:

1. **the same project**: its `--project` directory has one of the run's scope keys (on a shared journal a git
   checkout with the same remote and path in the repository; on SQLite the same directory);
2. **the run's commit checked out**, when the coordinator's project is a git checkout (`commit` in the
   dispatch payload): the units would otherwise run other code than the run froze;
3. **the env files the step binds** (`env:`), readable here: secrets never travel through the journal, so a
   worker without them cannot give the unit its environment;
4. **a git work tree** for `isolation: worktree` steps, and a dispatcher for the unit's kind.

Each answer is a reason string (None: can run); the worker reports a refusal once per run and step and
leaves those units to a worker that can run them.
"""

from __future__ import annotations

from pathlib import Path

from akm.engine.attempt import EnvBindingError, Payload, env_bindings, worktree_problem
from akm.plan.model import Plan


def refusal(
    *,
    plan: Plan,
    step_id: str | None,
    payload: Payload | None,
    scopes: tuple[str, ...],
    run_scope: str,
    project_root: Path,
    commit: str | None,
    kinds_here: frozenset[str],
) -> str | None:
    """Why this worker cannot run the step's queued units here, or None when it can."""
    if run_scope not in scopes:
        return f"the run belongs to another project than {project_root} (pass --project DIR of a checkout of it)"
    if payload is None:
        return "its queued units carry no dispatch payload this akm can read (started by another akm version?)"
    wanted = payload.commit
    if wanted and commit != wanted:
        have = commit[:12] if commit else "no readable commit"
        return f"the run needs commit {str(wanted)[:12]} checked out, {project_root} has {have}"
    step = plan.step(step_id) if step_id is not None else None
    tmpl = step.unit_template if step is not None else None
    if tmpl is None:
        return f"step {step_id!r} has no unit template in the run's frozen plan"
    kind = payload.spec.kind
    if kind not in kinds_here:
        return f"this akm has no dispatcher for {kind} units"
    try:
        env_bindings(tmpl, project_root)
    except EnvBindingError as exc:
        return f"the step's env binding cannot be resolved here: {exc}"
    problem = worktree_problem(tmpl, project_root)
    if problem:
        return f"the step uses isolation: worktree, but {problem}"
    return None
