"""What a dispatcher hands back to the engine for one attempt."""

from __future__ import annotations

import math
from typing import Any

from akm.record import dataclass

# The most tokens one unit attempt can count (session reports too: akm.engine.budget.MAX_UNIT_TOKENS).
# Far above any real call, and low enough that a run's hard cap of 10 000 dispatches cannot push the journal's SUM(tokens) past SQLite's 64-bit integers
# (or JSON's exact integers): 10 000 x 10^12 = 10^16 < 2^53.
MAX_TOKENS = 10**12


def token_count(value: Any) -> int | None:
    """A usage figure a server, harness or agent reported, as a count the journal can hold.

    Not a number (or NaN, or negative): unknown, None. Above `MAX_TOKENS` (a huge integer,
    `1e999` read as infinity): `MAX_TOKENS`, so a token budget still trips rather than
    silently ignoring the figure — and nothing overflows on the way into SQLite.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if value < 0:
        return None
    return MAX_TOKENS if value > MAX_TOKENS else int(value)


def add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two usage records (`DispatchResult.usage`) summed figure by figure: a figure unknown in one is the
    other's, unknown in both stays unknown; per-model records (`models`) are summed by model name."""
    if more is None:
        return total
    if total is None:
        return dict(more)
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and isinstance(out.get(key), int):
            out[key] = out[key] + value
        elif key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = dict(out[key])
            for name, figures in value.items():
                merged[name] = add_usage(merged.get(name), figures) if isinstance(figures, dict) else figures
            out[key] = merged
    return out


# How long a result's `error` may be: every dispatcher clips its diagnostic to it (after redacting).
DIAGNOSTIC_CLIP = 2000


@dataclass
class DispatchResult:
    """Outcome of one dispatched attempt.

    ok        -- the unit succeeded.
    text      -- free-text artifact (None when empty).
    result    -- structured (parsed JSON) artifact when the unit has an output schema.
    failure_reason -- one of the failure vocabulary strings (spec/workflow-format.md) when not ok.
    error     -- human diagnostic (already redacted and clipped to DIAGNOSTIC_CLIP by the dispatcher).
    tokens    -- token usage when the runner reports it.
    session_id -- harness-native session id, if any.
    truncated -- output was cut at a capture cap (the artifact is incomplete; never a silent success).
    usage     -- the parts of `tokens` as the runner reported them (input, output, reasoning, cacheRead,
                 cacheWrite, models: {name: {role, …}}); only figures it gave, None when it gave none.
    retry_after_s -- how long the server asked to be left alone (an HTTP 429's Retry-After), so a
                 unit-level `retry` waits that long before its next attempt instead of re-asking at once.
    """

    ok: bool
    text: str | None = None
    result: Any = None
    has_result: bool = False
    failure_reason: str | None = None
    error: str | None = None
    tokens: int | None = None
    session_id: str | None = None
    truncated: bool = False
    retry_after_s: float | None = None
    usage: dict[str, Any] | None = None
    cost: float | None = None  # USD, priced by the engine from `usage` (akm.engine.cost); dispatchers leave it

    def __post_init__(self) -> None:
        # Every dispatcher's usage figure passes here: one bound for the journal and the budget.
        if self.tokens is not None:
            self.tokens = token_count(self.tokens)
