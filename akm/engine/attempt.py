"""One unit attempt, prepared the same way wherever it runs: on a driver's thread or in `akm worker`.

An attempt needs more than its unit: the step's env bindings (resolved from the env files of the host it runs
on — secrets never travel through the journal), the values to scrub from everything it returns (those, and every
env file the project can see), where it runs (the project root, or an isolation worktree of its own) and the
`UnitRequest` its dispatcher gets. `StepAttempts` holds what every attempt of a step shares (opened once per
dispatch pass by a driver, once per claim by a worker); its `prepare` turns an `AttemptSpec` into a `Prepared`
attempt that runs and cleans up after itself.

An `AttemptSpec` is what the run's driver computed of the unit and a worker could not: the prompt or the exec
context (run id, params, inputs, item), the timeout, the engine and model. A driver makes it from the unit
(`StepAttempts.spec_of`); a worker reads it from the queued row's payload, which `to_payload` writes with the
project's identity and commit (checked by a worker before it claims anything) and `from_payload` reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from akm.dispatch.base import Dispatcher, UnitRequest
from akm.dispatch.exec import build_exec_context
from akm.dispatch.redact import sensitive_values_from
from akm.engine import worktree as worktrees
from akm.engine.activity import ActivityRelay
from akm.engine.env_bindings import EnvBindingError, project_sensitive_values, resolve_env_refs
from akm.engine.reduce import UnitOutcome
from akm.engine.structured import run_structured
from akm.engine.worklist import WorkUnit
from akm.plan.identity import NO_ITEM
from akm.plan.model import Plan, StepPlan, UnitNode
from akm.record import dataclass, field

__all__ = [
    "PAYLOAD_VERSION",
    "AttemptSpec",
    "EnvBindingError",
    "Payload",
    "Prepared",
    "StepAttempts",
    "WorktreeError",
    "env_bindings",
    "from_payload",
    "to_payload",
    "worktree_problem",
]

PAYLOAD_VERSION = 1
WorktreeError = worktrees.WorktreeError


@dataclass
class AttemptSpec:
    """What an attempt runs, as the run's driver computed it (the part of a request a queued row carries)."""

    unit_id: str  # the unit's content id (AKM_UNIT_ID, evidence); the attempt's journal id is separate
    kind: str
    prompt: str = ""
    system_prompt: str | None = None
    timeout_ms: int | None = None
    engine: str | None = None
    model: str | None = None
    exec_context: dict[str, str] = field(default_factory=dict)


@dataclass
class Payload:
    """A queued attempt's `dispatch_json`, read back: its spec, and where it may run."""

    spec: AttemptSpec
    scope: str | None
    commit: str | None  # the project's commit at the driver (None: not a git checkout)


def to_payload(spec: AttemptSpec, *, scope_key: str, commit: str | None) -> str:
    """The `dispatch_json` of a queued attempt: its spec and the project's identity, never a secret nor a cwd."""
    body: dict[str, Any] = {
        "v": PAYLOAD_VERSION,
        "unitId": spec.unit_id,
        "kind": spec.kind,
        "scope": scope_key,
        "commit": commit,
    }
    if spec.kind == "exec":
        body["execContext"] = spec.exec_context
    else:
        body["prompt"] = spec.prompt
        if spec.system_prompt is not None:
            body["systemPrompt"] = spec.system_prompt
    if spec.timeout_ms is not None:
        body["timeoutMs"] = spec.timeout_ms
    if spec.engine is not None:
        body["engine"] = spec.engine
    if spec.model is not None:
        body["model"] = spec.model
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def from_payload(text: str | None) -> Payload | None:
    """A queued attempt's payload, or None when it is missing or not ours (another akm version's)."""
    if not text:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != PAYLOAD_VERSION:
        return None
    spec = AttemptSpec(
        unit_id=str(body.get("unitId") or ""),
        kind=str(body.get("kind") or ""),
        prompt=str(body.get("prompt") or ""),
        system_prompt=body.get("systemPrompt"),
        timeout_ms=body.get("timeoutMs"),
        engine=body.get("engine"),
        model=body.get("model"),
        exec_context=dict(body.get("execContext") or {}),
    )
    return Payload(spec=spec, scope=body.get("scope"), commit=body.get("commit"))


def env_bindings(template: UnitNode, project_root: Path) -> dict[str, str]:
    """The unit's env bindings, resolved from the env files this host has (raises `EnvBindingError`)."""
    return resolve_env_refs(template.env, project_root) if template.env else {}


def worktree_problem(template: UnitNode, project_root: Path) -> str | None:
    """Why isolation worktrees for the unit cannot be made here (None: they can, or it uses none)."""
    return worktrees.preflight(str(project_root)) if template.isolation == "worktree" else None


class Prepared:
    """One attempt ready to dispatch: where it runs (its worktree, if isolated) and, built when first asked for
    (after its row is journaled, so that a failure building it is the attempt's own), its request."""

    __slots__ = ("step", "source", "attempt_id", "tree", "cwd", "db", "started_at", "on_progress", "_request")

    def __init__(
        self,
        step: StepAttempts,
        source: WorkUnit | AttemptSpec,
        attempt_id: str,
        tree: worktrees.Worktree | None,
        *,
        db: Any,
        started_at: str | None,
        on_progress: Callable[[Any], None] | None,
    ) -> None:
        self.step, self.source, self.attempt_id, self.tree = step, source, attempt_id, tree
        self.cwd = tree.path if tree is not None else step.root
        self.db, self.started_at, self.on_progress = db, started_at, on_progress
        self._request: UnitRequest | None = None

    @property
    def request(self) -> UnitRequest:
        if self._request is None:
            self._request = self.step.request(self)
        return self._request

    def run(self, dispatcher: Dispatcher, cancel: Any) -> UnitOutcome:
        """Dispatch it (with the engine's structured-output loop); the outcome, tied to its unit."""
        request = self.request
        res = run_structured(dispatcher, request, cancel)
        return UnitOutcome(unit_id=request.unit_id, **vars(res))

    def cleanup(self) -> str | None:
        """Remove its worktree (kept, and said so in the warning returned, when it holds uncollected work)."""
        return worktrees.cleanup(self.tree) if self.tree is not None else None


class StepAttempts:
    """What every attempt of one step shares: its env bindings, the secrets to scrub, the parent environment.

    `open` raises `EnvBindingError` when the step's env bindings cannot be resolved here; the caller says what
    that means for it (a driver fails the pass, a worker refuses the step).
    """

    def __init__(
        self,
        *,
        plan: Plan,
        step: StepPlan,
        template: UnitNode,
        run_id: str,
        project_root: Path,
        params: Any,
        env_values: dict[str, str],
        sensitive: list[str],
        parent_env: dict[str, str],
    ) -> None:
        self.plan, self.step, self.template, self.run_id = plan, step, template, run_id
        self.project_root, self.root = project_root, str(project_root)
        self.params = params
        self.env_values, self.sensitive, self.parent_env = env_values, sensitive, parent_env
        self._ctx_base: dict[str, str] | None = None

    @classmethod
    def open(
        cls,
        plan: Plan,
        step: StepPlan,
        *,
        run_id: str,
        project_root: Path,
        params: Any = None,
        parent_env: dict[str, str] | None = None,
    ) -> StepAttempts:
        tmpl = step.unit_template
        assert tmpl is not None
        env_values = env_bindings(tmpl, project_root)
        sensitive = sensitive_values_from(env_values) if tmpl.env else []
        # Every env file the project can see is secret, bound by this unit or not.
        sensitive = sensitive + project_sensitive_values(project_root)
        return cls(
            plan=plan,
            step=step,
            template=tmpl,
            run_id=run_id,
            project_root=project_root,
            params=params,
            env_values=env_values,
            sensitive=sensitive,
            parent_env=dict(os.environ) if parent_env is None else parent_env,
        )

    def spec_of(self, unit: WorkUnit) -> AttemptSpec:
        """What an attempt of `unit` runs (the same for each of its attempts)."""
        tmpl = unit.template
        if tmpl.exec is not None:
            if self._ctx_base is None:
                # Params and inputs are the same for every unit of the step: serialise them once.
                self._ctx_base = build_exec_context(
                    run_id=self.run_id,
                    step_id=self.step.step_id,
                    unit_id="",
                    params=self.params,
                    inputs=dict(unit.inputs) if tmpl.inputs else None,
                )
            ctx = dict(self._ctx_base, AKM_UNIT_ID=unit.unit_id)
            if unit.item is not NO_ITEM:  # what item_context(unit.item, unit.index) gives, serialised once already
                ctx["AKM_ITEM"], ctx["AKM_ITEM_INDEX"] = unit.item_json, str(unit.index)
            return AttemptSpec(unit.unit_id, "exec", timeout_ms=tmpl.exec.timeout_ms, exec_context=ctx)
        return AttemptSpec(
            unit.unit_id,
            unit.runner,
            prompt=unit.prompt,
            timeout_ms=unit.timeout_ms,
            engine=unit.engine,
            model=unit.model,
        )

    def prepare(
        self,
        source: WorkUnit | AttemptSpec,
        attempt_id: str,
        *,
        db: Any,
        started_at: str | None = None,
        on_progress: Callable[[Any], None] | None = None,
    ) -> Prepared:
        """The attempt `attempt_id` of a unit (or of a spec read from a queued row), ready to run: in a worktree
        of its own when the step isolates its units (raises `WorktreeError` or `OSError` when it cannot be made).

        An agent unit's live activity goes to `on_progress` and is journaled in `db` against the attempt's row
        started at `started_at` (set it on the `Prepared` once the row is journaled)."""
        tree = worktrees.create(self.root, self.run_id, attempt_id) if self.template.isolation == "worktree" else None
        return Prepared(self, source, attempt_id, tree, db=db, started_at=started_at, on_progress=on_progress)

    def request(self, attempt: Prepared) -> UnitRequest:
        """The `UnitRequest` of a prepared attempt."""
        tmpl = self.template
        source = attempt.source
        spec = self.spec_of(source) if isinstance(source, WorkUnit) else source
        relay = None
        if spec.kind == "agent":
            relay = ActivityRelay(
                attempt.db,
                run_id=self.run_id,
                step_id=self.step.step_id,
                unit_id=spec.unit_id,
                attempt_id=attempt.attempt_id,
                started_at=attempt.started_at,
                on_progress=attempt.on_progress,
            )
        engine = spec.engine
        return UnitRequest(
            run_id=self.run_id,
            step_id=self.step.step_id,
            unit_id=spec.unit_id,
            attempt_id=attempt.attempt_id,
            kind=spec.kind,
            cwd=attempt.cwd,
            prompt=spec.prompt,
            system_prompt=spec.system_prompt,
            output_schema=tmpl.output_schema,
            timeout_ms=spec.timeout_ms,
            engine_name=engine,
            engine=self.plan.execution.engines.get(engine) if engine else None,
            model=spec.model,
            llm_options=tmpl.invocation.llm if tmpl.invocation else None,
            exec_spec=tmpl.exec,
            exec_context=spec.exec_context,
            env_bindings=self.env_values,
            sensitive_values=self.sensitive,
            parent_env=self.parent_env,
            on_activity=relay,
        )
