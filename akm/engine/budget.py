"""Run-lifetime dispatch ceilings, seeded from the journal.

Counted in attempts (not rows), so a unit re-dispatched after a crash is
charged again: the budget protects the user's wallet, not the journal.
Thread-safe: fan-out workers consume from one budget.
"""

from __future__ import annotations

import threading
from typing import Callable

from akm.dispatch.types import MAX_TOKENS

LIFETIME_UNIT_CAP = 10_000
# The most tokens one session report may count: the bound every dispatcher's figure gets (see there),
# so the journal's 64-bit sums over a run never overflow, whatever a client sends.
MAX_UNIT_TOKENS = MAX_TOKENS


class DispatchBudget:
    def __init__(self, *, used: int, tokens: int, max_units: int | None, max_tokens: int | None) -> None:
        self.used = used
        self.tokens = tokens
        self.max_units = max_units
        self.max_tokens = max_tokens
        self.exceeded: str | None = None
        self.cap_message: str | None = None
        self._lock = threading.Lock()
        self._on_exceed: Callable[[], None] | None = None

    def set_exceed_hook(self, hook: Callable[[], None] | None) -> None:
        """Called once when a ceiling is crossed (the current step's cancellation)."""
        with self._lock:
            self._on_exceed = hook
            crossed = self.exceeded is not None
        if crossed and hook is not None:
            hook()

    def _exceed(self, kind: str) -> None:
        """Cross a ceiling (`kind`: max_units | max_tokens). Its sentence is the one a report refused by the
        same ceiling gets (`report_guards`), so both surfaces fail the step with the same notes."""
        from akm.store.report_guards import max_tokens_reason, max_units_reason

        if self.exceeded is None:
            message = (
                max_units_reason(self.used, self.max_units or 0)
                if kind == "max_units"
                else max_tokens_reason(self.tokens, self.max_tokens or 0)
            )
            self.exceeded = message
            if self._on_exceed is not None:
                self._on_exceed()

    def try_consume(self) -> str | None:
        """Reserve one dispatch; returns the refusal reason code, or None when allowed."""
        with self._lock:
            if self.exceeded is not None:
                return "budget_exceeded"
            if self.max_units is not None and self.used >= self.max_units:
                self._exceed("max_units")
                return "budget_exceeded"
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                self._exceed("max_tokens")
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
        with self._lock:
            self.tokens += n
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                self._exceed("max_tokens")
