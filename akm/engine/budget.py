"""Run-lifetime dispatch ceilings, seeded from the journal.

Counted in attempts (not rows), so a unit re-dispatched after a crash is
charged again: the budget protects the user's wallet, not the journal.
Thread-safe: fan-out workers consume from one budget.

The ceilings (spec/engine.md "Budgets"): `max_units` attempts, `max_tokens`, `max_cost` US dollars (each
attempt's usage times its engine's prices, akm.engine.cost), and config `limits.maxCostPerDay` for all of
the project's runs together. Each is checked before a dispatch is reserved, so nothing is sent once it is
reached (attempts already running when it is crossed finish, and count). A model attempt of an engine that
reported no usage cannot be counted: under a token or money ceiling it refuses every further dispatch,
unless the workflow says `budget.unknown: allow` (then the budget counts only what is known).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from akm.dispatch.types import MAX_TOKENS

LIFETIME_UNIT_CAP = 10_000
# The most tokens one session report may count: the bound every dispatcher's figure gets (see there),
# so the journal's 64-bit sums over a run never overflow, whatever a client sends.
MAX_UNIT_TOKENS = MAX_TOKENS


class DailyLimit:
    """Config `limits.maxCostPerDay`: `spent()` asks the journal what the project's runs spent today."""

    def __init__(self, limit: float, spent: Callable[[], float]) -> None:
        self.limit = limit
        self.spent = spent


class DispatchBudget:
    def __init__(
        self,
        *,
        used: int,
        tokens: int,
        max_units: int | None,
        max_tokens: int | None,
        cost: float = 0.0,
        max_cost: float | None = None,
        unknown_tokens: int = 0,
        unknown_cost: int = 0,
        allow_unknown: bool = False,
        daily: DailyLimit | None = None,
    ) -> None:
        self.used = used
        self.tokens = tokens
        self.cost = cost
        self.unknown_tokens = unknown_tokens
        self.unknown_cost = unknown_cost
        self.max_units = max_units
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.allow_unknown = allow_unknown
        self.daily = daily
        self.exceeded: str | None = None
        self.cap_message: str | None = None
        self._lock = threading.Lock()
        self._on_exceed: Callable[[], None] | None = None

    @property
    def counts_usage(self) -> bool:
        """Does any ceiling need each attempt's usage (tokens or money)?"""
        return self.max_tokens is not None or self.max_cost is not None or self.daily is not None

    def set_exceed_hook(self, hook: Callable[[], None] | None) -> None:
        """Called once when a ceiling is crossed (the current step's cancellation)."""
        with self._lock:
            self._on_exceed = hook
            crossed = self.exceeded is not None
        if crossed and hook is not None:
            hook()

    def _exceed(self, message: str) -> None:
        """Cross a ceiling. Its sentence is the one a report refused by the same ceiling gets
        (`report_guards`), so both surfaces fail the step with the same notes."""
        if self.exceeded is None:
            self.exceeded = message
            if self._on_exceed is not None:
                self._on_exceed()

    def _refusal(self, model: bool) -> str | None:
        """The sentence of the first ceiling that refuses another dispatch, or None (lock held). The words are
        imported only when one does: a run under no ceiling never loads them."""
        reason = self._run_ceiling_reached()
        if reason is None and model and self.daily is not None:
            spent = self.daily.spent()
            if spent >= self.daily.limit:
                reason = _words().daily_cost_reason(spent, self.daily.limit)
        return reason

    def _run_ceiling_reached(self) -> str | None:
        """The sentence of the first of the run's own ceilings reached (units, tokens, cost, or usage not known
        under a ceiling that needs it), or None."""
        reason: str | None = None
        if self.max_units is not None and self.used >= self.max_units:
            reason = _words().max_units_reason(self.used, self.max_units)
        elif self.max_tokens is not None and self.tokens >= self.max_tokens:
            reason = _words().max_tokens_reason(self.tokens, self.max_tokens)
        elif self.max_cost is not None and self.cost >= self.max_cost:
            reason = _words().max_cost_reason(self.cost, self.max_cost)
        elif not self.allow_unknown and self.unknown_cost and (self.max_cost is not None or self.daily is not None):
            ceiling = "max_cost" if self.max_cost is not None else "limits.maxCostPerDay"
            reason = _words().unknown_usage_reason(ceiling, self.unknown_cost)
        elif not self.allow_unknown and self.unknown_tokens and self.max_tokens is not None:
            reason = _words().unknown_usage_reason("max_tokens", self.unknown_tokens)
        return reason

    def try_consume(self, model: bool = False) -> str | None:
        """Reserve one dispatch; returns the refusal reason code, or None when allowed. `model`: the unit is a
        model call of an engine (the daily money limit is asked about those only: nothing else spends)."""
        with self._lock:
            if self.exceeded is not None:
                return "budget_exceeded"
            refusal = self._refusal(model)
            if refusal is not None:
                self._exceed(refusal)
                return "budget_exceeded"
            if self.used >= LIFETIME_UNIT_CAP:
                self.cap_message = (
                    f"workflow run exceeded the lifetime unit cap ({LIFETIME_UNIT_CAP}). "
                    "Aborting dispatch — check for a runaway fan-out."
                )
                return "unit_cap_exceeded"
            self.used += 1
            return None

    def release(self) -> None:
        """Give back a reservation whose dispatch did not happen (a unit journaled ahead, not run)."""
        with self._lock:
            self.used = max(0, self.used - 1)

    def add_tokens(self, n: int) -> None:
        self.add_usage(tokens=n)

    def add_usage(
        self,
        *,
        tokens: int | None = None,
        cost: float | None = None,
        unknown_tokens: bool = False,
        unknown_cost: bool = False,
    ) -> None:
        """Count one finished attempt's usage; crossing the token or money ceiling stops the step's dispatch."""
        with self._lock:
            self.tokens += tokens or 0
            self.cost += cost or 0.0
            self.unknown_tokens += int(unknown_tokens)
            self.unknown_cost += int(unknown_cost)
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                self._exceed(_words().max_tokens_reason(self.tokens, self.max_tokens))
            elif self.max_cost is not None and self.cost >= self.max_cost:
                self._exceed(_words().max_cost_reason(self.cost, self.max_cost))


def _words() -> Any:
    """The ceilings' sentences, shared with the session path's refusals (`report_guards`)."""
    from akm.store import report_guards

    return report_guards
