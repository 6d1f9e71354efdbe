"""Known secrets kept out of a run's inputs: its params and its frozen plan.

Why here and not at output time: a run's params and plan are journaled (`runs.params_json`, `runs.plan_json`),
printed (`params:`, `--format json`), sent in every prompt and brief, and they decide the units' input hashes.
A param whose value is the value of a secret (any env file the project can see: `env_bindings`), or a secret
written literally in a workflow (an `exec.command` argument, a prompt), would otherwise be stored and shown
as it is. So, before a run is created, every such value is replaced by `[REDACTED]` in the params and in
the plan, the same set of spellings the units' output is scrubbed of (`dispatch.redact`). The run then *is*
what was stored: its units receive `[REDACTED]`, a resume sees the same params and plan, and identical starts
still find each other. Secrets belong in `env:` bindings; the caller is told which inputs held one.

Only string values are scrubbed, never keys (param names, schema keywords), and a secret that is a step id
cannot be replaced without renaming the run's steps, so that start is refused (WORKFLOW_INVALID) instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from akm.dispatch.redact import MIN_SECRET_LENGTH, redact_text, redact_value
from akm.engine.env_bindings import project_sensitive_values
from akm.errors import UsageError
from akm.plan.model import Plan, PlanError


def scrub_run_inputs(plan: Plan, params: dict[str, Any], project_root: Path) -> tuple[Plan, dict[str, Any], list[str]]:
    """(plan, params) with every known secret value replaced by `[REDACTED]`, and one warning per kind of input
    that held one (naming the params and steps, never the value)."""
    sensitive = _long_enough(project_sensitive_values(project_root))
    if not sensitive:
        return plan, params, []
    warnings: list[str] = []
    clean_params = {name: redact_value(value, sensitive) for name, value in params.items()}
    names = [name for name in params if clean_params[name] != params[name]]
    if names:
        warnings.append(
            f"param(s) {', '.join(names)} hold the value of a secret from the project's env files: the run stores "
            "and passes [REDACTED] instead (params are journaled and shown); pass secrets through a unit's env: "
            "bindings."
        )
    clean_plan, note = _scrubbed_plan(plan, sensitive)
    if note is not None:
        warnings.append(note)
    return clean_plan, clean_params, warnings


def _scrubbed_plan(plan: Plan, sensitive: list[str]) -> tuple[Plan, str | None]:
    """The plan with every secret value in its strings replaced by `[REDACTED]`, and the warning naming the
    steps that held one (None when none did). A secret used as a step id cannot be replaced: refused."""
    text = plan.canonical()  # the set holds JSON-escaped spellings too: a secret in any string shows here
    if not any(v in text for v in sensitive):
        return plan, None
    raw = plan.to_json_obj()
    clean_raw = _scrub_strings(raw, sensitive)
    if clean_raw == raw:
        return plan, None
    try:
        clean_plan = Plan.model_validate(clean_raw)
        if [s.step_id for s in clean_plan.steps] != [s.step_id for s in plan.steps]:
            raise PlanError("a step id held a secret")
    except (PlanError, ValueError):
        from akm.codes import Code

        raise UsageError(
            "the workflow uses the value of a secret from the project's env files as a name (a step id), where it "
            "cannot be replaced by [REDACTED] without changing the workflow",
            code=Code.WORKFLOW_INVALID,
            hint="Rename it in the workflow, or use another secret value.",
        ) from None
    where = [
        str(step.get("stepId") or i + 1)
        for i, (step, clean) in enumerate(zip(raw.get("steps") or [], clean_raw.get("steps") or [], strict=False))
        if step != clean
    ]
    return clean_plan, (
        "the workflow holds the value of a secret from the project's env files"
        + (f" (step(s) {', '.join(where)})" if where else "")
        + ": its frozen plan stores [REDACTED] instead, and that is what runs; give units secrets through env: "
        "bindings ($NAME in exec.command)."
    )


def _long_enough(values: list[str]) -> list[str]:
    """The spellings redaction acts on (`redact.MIN_SECRET_LENGTH` and up), once, not per string."""
    return [v for v in dict.fromkeys(values) if len(v) >= MIN_SECRET_LENGTH]


def _scrub_strings(obj: Any, sensitive: list[str]) -> Any:
    """A copy of a JSON value with every string value (not key) redacted."""
    if isinstance(obj, str):
        return redact_text(obj, sensitive)
    if isinstance(obj, dict):
        return {k: _scrub_strings(v, sensitive) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub_strings(v, sensitive) for v in obj]
    return obj
