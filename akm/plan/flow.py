"""The control flow of a frozen plan, as edges between steps (for graphs of a run).

Steps run in plan order; a route selects one of its targets and every other
target of that route is skipped. So the targets of one route are
alternatives: each continues to the first later step that is not one of its
alternatives (never to a sibling). Passing a step that only runs when some
route selects it gives an uncertain edge, and the walk goes on to the next
step, up to the first one that always runs.
"""

from __future__ import annotations

from akm.plan.model import Plan
from akm.record import dataclass


@dataclass(frozen=True)
class FlowEdge:
    source: str
    target: str
    label: str | None  # a route branch's match value, or "default"
    certain: bool  # False when the target runs only if a route selects it


def flow_edges(plan: Plan) -> list[FlowEdge]:
    order = [s.step_id for s in plan.steps]
    targets_of: dict[str, list[str]] = {}
    for s in plan.steps:
        if s.route is not None:
            default = [s.route.default_step_id] if s.route.default_step_id else []
            targets_of[s.step_id] = list(dict.fromkeys([*s.route.when.values(), *default]))
    conditional = {t for ts in targets_of.values() for t in ts}
    edges: list[FlowEdge] = []
    for i, step_id in enumerate(order):
        exclusive = set(targets_of.get(step_id, []))
        for ts in targets_of.values():
            if step_id in ts:
                exclusive.update(t for t in ts if t != step_id)
        for later in order[i + 1 :]:
            if later in exclusive:
                continue
            edges.append(FlowEdge(step_id, later, None, later not in conditional))
            if later not in conditional:
                break
    for s in plan.steps:
        if s.route is None:
            continue
        for match, target in s.route.when.items():
            edges.append(FlowEdge(s.step_id, target, match, True))
        if s.route.default_step_id:
            edges.append(FlowEdge(s.step_id, s.route.default_step_id, "default", False))
    return edges
