"""A driver's money and token accounting for one run: the budget seeded from the journal, each attempt priced.

The drive loop (and a coordinator waiting for workers) asks this module three things per attempt: may it be
dispatched (`budget.try_consume`, with `is_model`), what did it cost (`cost_of`, from its usage and the
prices the plan froze), and what does it add to the ceilings (`count`). Before a pass it asks `unpriced`:
a money ceiling cannot count a unit of an engine without prices, so such a pass is refused before anything
is sent (unless the workflow says `budget.unknown: allow`).
"""

from __future__ import annotations

from typing import Any

from akm.engine.budget import DailyLimit, DispatchBudget
from akm.engine.cost import counts_as_unknown, unit_cost
from akm.store import units as units_store


def day_start(now: str) -> str:
    """The start of the journal clock's UTC day, in the journal's timestamp format."""
    return now[:10] + "T00:00:00.000Z"


class RunSpend:
    def __init__(self, db: Any, loaded: Any) -> None:
        plan = loaded.plan
        self.engines: dict[str, dict[str, Any]] = plan.execution.engines
        self.prices: dict[str, dict[str, Any]] = plan.execution.prices or {}
        budget = plan.budget
        spend = units_store.journal_spend(db, loaded.run_id)
        limit = plan.execution.daily_cost_limit
        daily = None
        if limit is not None:
            scope, run_id = loaded.run.scope_key, loaded.run_id
            # This run's part is counted here (its last finishes may still wait for their journal write); the
            # other runs' is asked of the journal at each dispatch.
            mine_today = units_store.project_spend_since(db, scope, day_start(db.now()), only=run_id)
            seeded = spend.cost

            def spent_today() -> float:
                others = units_store.project_spend_since(db, scope, day_start(db.now()), but=run_id)
                return others + mine_today + (self.budget.cost - seeded)

            daily = DailyLimit(limit, spent_today)
        self.budget = DispatchBudget(
            used=spend.attempts,
            tokens=spend.tokens,
            cost=spend.cost,
            unknown_tokens=spend.unknown_tokens,
            unknown_cost=spend.unknown_cost,
            max_units=budget.max_units if budget else None,
            max_tokens=budget.max_tokens if budget else None,
            max_cost=budget.max_cost if budget else None,
            allow_unknown=bool(budget and budget.unknown == "allow"),
            daily=daily,
        )

    def cost_of(self, engine: str | None, usage: dict[str, Any] | None) -> float | None:
        """USD of one attempt of `engine` that reported `usage` (None: unknown, or no prices)."""
        if engine is None:
            return None
        return unit_cost(self.engines.get(engine), self.prices.get(engine), usage)

    def is_model(self, unit: Any) -> bool:
        return unit.engine is not None and unit.runner in ("llm", "agent")

    def count(self, unit: Any, outcome: Any) -> None:
        """Add a finished attempt to the budget (tokens, dollars, and whether either is unknown)."""
        b = self.budget
        if not (outcome.tokens or outcome.cost) and not b.counts_usage:
            return
        status = "completed" if outcome.ok else "failed"
        unknown = outcome.dispatched and counts_as_unknown(unit.runner, unit.engine, status, outcome.failure_reason)
        b.add_usage(
            tokens=outcome.tokens,
            cost=outcome.cost,
            unknown_tokens=unknown and outcome.tokens is None,
            unknown_cost=unknown and outcome.cost is None,
        )

    def unpriced(self, step: Any, units: list[Any]) -> str | None:
        """Why a pass cannot run under a money ceiling: an engine of its units has no prices (None: it can)."""
        b = self.budget
        if b.allow_unknown or (b.max_cost is None and b.daily is None):
            return None
        names = sorted({u.engine for u in units if self.is_model(u) and u.engine not in self.prices})
        if not names:
            return None
        ceiling = "budget.max_cost" if b.max_cost is not None else "limits.maxCostPerDay"
        listed = ", ".join(names)
        return (
            f'budget exceeded ({ceiling} ceiling): step "{step.step_id}" runs units on engine {listed}, which has no '
            f"prices in config (engines.{names[0]}.prices), so the money ceiling cannot count them; nothing of the "
            "step was dispatched. Give the engine its prices, or set budget.unknown: allow in the workflow"
        )
