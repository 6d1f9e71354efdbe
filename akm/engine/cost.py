"""What a unit attempt cost in US dollars: its usage figures times its engine's prices (config, frozen).

Prices are per million tokens: `input`, `output` and `cached` (cache reads; the input price when not
given). The figures are the dispatcher's `usage` record (akm.dispatch.types), as each source reports
them — and sources count differently, so the sum is made per source:

| source                   | `input` holds cache reads | `output` holds reasoning |
|--------------------------|---------------------------|--------------------------|
| llm (OpenAI-compatible)  | yes (prompt_tokens)       | yes (completion_tokens)  |
| claude                   | no                        | yes                      |
| codex                    | yes                       | yes                      |
| gemini                   | yes                       | no (thoughts apart)      |
| opencode, others         | no                        | no                       |

Cache writes are billed at the input price. Where a record has per-model figures (`models`), every
model is priced (a CLI's helper models cost money too). A usage record with neither `input` nor
`output` cannot be priced: the cost is unknown (None), never 0 — a ceiling counts it as unknown
(spec/engine.md "Budgets").
"""

from __future__ import annotations

from typing import Any, Mapping

from akm.store.status import MODEL_RUNNERS, NOTHING_SPENT
from akm.text import dollars

__all__ = ["MODEL_RUNNERS", "NOTHING_SPENT", "counts_as_unknown", "dollars", "source_of", "unit_cost"]

_INPUT_HOLDS_CACHE = frozenset({"llm", "codex", "gemini"})
_OUTPUT_HOLDS_REASONING = frozenset({"llm", "claude", "codex"})
_MILLION = 1_000_000


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def source_of(engine: Mapping[str, Any] | None) -> str:
    """The usage convention of an engine snapshot: `llm`, or the agent's platform."""
    if not engine:
        return ""
    if engine.get("kind") == "llm":
        return "llm"
    return str(engine.get("platform") or "")


def _priced(figures: Mapping[str, Any], prices: Mapping[str, float], source: str) -> float | None:
    if not isinstance(figures.get("input"), int) and not isinstance(figures.get("output"), int):
        return None
    cached = _count(figures, "cacheRead")
    fresh = _count(figures, "input")
    if source in _INPUT_HOLDS_CACHE:
        fresh = max(0, fresh - cached)
    fresh += _count(figures, "cacheWrite")
    out = _count(figures, "output")
    if source not in _OUTPUT_HOLDS_REASONING:
        out += _count(figures, "reasoning")
    price_in = float(prices.get("input", 0))
    price_cached = float(prices.get("cached", price_in))
    return (fresh * price_in + cached * price_cached + out * float(prices.get("output", 0))) / _MILLION


def unit_cost(
    engine: Mapping[str, Any] | None, prices: Mapping[str, float] | None, usage: Mapping[str, Any] | None
) -> float | None:
    """USD the attempt cost, or None when it cannot be known (no prices, or no input/output figures)."""
    if not prices or not usage:
        return None
    source = source_of(engine)
    models = usage.get("models")
    if isinstance(models, dict) and models:
        total: float | None = None
        for figures in models.values():
            if isinstance(figures, dict):
                c = _priced(figures, prices, source)
                if c is None:
                    return _priced(usage, prices, source)  # a model without figures: the whole record then
                total = (total or 0.0) + c
        if total is not None:
            return total
    return _priced(usage, prices, source)


def counts_as_unknown(runner: str | None, engine: str | None, status: str, failure_reason: str | None) -> bool:
    """Does a finished attempt with no figure (tokens or cost null) count as unknown usage?"""
    if runner not in MODEL_RUNNERS or engine is None:
        return False
    if status == "completed":
        return True
    return status == "failed" and (failure_reason or "") not in NOTHING_SPENT
