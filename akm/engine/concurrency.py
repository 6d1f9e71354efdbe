"""How many units of a step run at once (D6), and why: one answer for the drive loop, the live board, the
note `workflow run` prints on a terminal, and anything that shows a plan (`--plan`).

Effective width = min(the step's own width — a map's `concurrency`, 1 for a solo step —, the run's limit
`workflow.maxConcurrency` or else the host's `max(2, cpu_count)`, an LLM engine's `concurrency`, the
step's unit count). An LLM engine at a loopback endpoint defaults to `concurrency: 1` (spec/config.md): a
map declaring `concurrency: 3` on it runs one unit at a time, which a user only learns if akm says so.
"""

from __future__ import annotations

import os
from typing import Any

from akm.plan.model import MapNode, Plan, StepPlan
from akm.record import dataclass

# No bound of that kind: larger than any width a plan allows (64) or a step's unit count (10 000).
UNBOUNDED = 1 << 30


def host_concurrency_limit() -> int:
    """D6: the host limit defaults to max(2, cpu_count)."""
    return max(2, os.cpu_count() or 2)


@dataclass(frozen=True)
class StepWidth:
    """A step's effective width and what set it."""

    step_id: str
    width: int  # units at once
    declared: int  # the step's own width: its map's `concurrency`, 1 for a solo step
    limited_by: str | None  # engine | maxConcurrency | host | units — None: the declared width holds
    engine: str | None  # the step's engine (None: exec or session units)
    engine_width: int | None  # that LLM engine's `concurrency` (None: no such bound)
    loopback: bool  # that engine is an LLM at a loopback endpoint

    def note(self) -> str | None:
        """One line for the user when an engine, not the workflow, holds a map below its declared width."""
        if self.limited_by != "engine" or self.engine is None:
            return None
        at_once = "one unit at a time" if self.width == 1 else f"{self.width} units at a time"
        why = (
            f"engine {self.engine} is a loopback LLM endpoint, which takes {self.engine_width} request(s) at once "
            "unless configured"
            if self.loopback
            else f"engine {self.engine} takes {self.engine_width} request(s) at once"
        )
        return (
            f"step {self.step_id} declares concurrency {self.declared} but runs {at_once}: {why} "
            f"(config engines.{self.engine}.concurrency: {self.declared} raises it)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "stepId": self.step_id,
            "width": self.width,
            "declared": self.declared,
            "limitedBy": self.limited_by,
            "engine": self.engine,
            "engineWidth": self.engine_width,
            "loopback": self.loopback,
            "note": self.note(),
        }


def engine_width(plan: Plan, engine: str | None) -> tuple[int | None, bool]:
    """(the frozen LLM engine's `concurrency`, whether it is at a loopback endpoint); (None, False) for any
    other engine (agents and exec units have no such bound)."""
    snap = plan.execution.engines.get(engine) if engine else None
    if not snap or snap.get("kind") != "llm" or not isinstance(snap.get("concurrency"), int):
        return None, False
    from akm.plan.engines import is_loopback_endpoint  # only for an LLM engine (it loads the config rules)

    return max(1, snap["concurrency"]), is_loopback_endpoint(str(snap.get("endpoint") or ""))


def _template_engine(step: StepPlan) -> str | None:
    """The engine the step's unit template names (None for a command unit or a template with no engine)."""
    tmpl = step.unit_template
    if tmpl is not None and not tmpl.is_exec and tmpl.invocation is not None:
        return tmpl.invocation.engine
    return None


def step_width(
    plan: Plan,
    step: StepPlan,
    *,
    units: int | None = None,
    engine: str | None = None,
    host_limit: int | None = None,
    declared: int | None = None,
) -> StepWidth:
    """The step's effective width. `units`: how many units this pass dispatches (None: not known yet, as
    when a plan is shown); `engine`: the units' frozen engine (default: the step template's);
    `host_limit`: the host's bound (default `host_concurrency_limit()`; `UNBOUNDED` with workers);
    `declared`: the work list's own width (default: the plan's)."""
    if declared is None:
        declared = step.root.concurrency if isinstance(step.root, MapNode) else 1
    if engine is None:
        engine = _template_engine(step)
    by_engine, loopback = engine_width(plan, engine)
    run_limit = plan.execution.max_concurrency
    bounds = [  # in this order, the first bound that sets the width is named
        ("units", max(1, units) if units is not None else UNBOUNDED),
        ("engine", by_engine if by_engine is not None else UNBOUNDED),
        ("maxConcurrency" if run_limit else "host", run_limit or (host_limit or host_concurrency_limit())),
    ]
    width = max(1, min([declared] + [b for _, b in bounds]))
    limited_by = next((name for name, b in bounds if b < declared and b == width), None)
    return StepWidth(
        step_id=step.step_id,
        width=width,
        declared=declared,
        limited_by=limited_by,
        engine=engine if by_engine is not None else None,
        engine_width=by_engine,
        loopback=loopback,
    )


def plan_widths(plan: Plan) -> list[StepWidth]:
    """Every executing step's width as the plan stands (unit counts not yet known)."""
    return [step_width(plan, s) for s in plan.steps if s.root is not None]
