"""What a dispatcher hands back to the engine for one attempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DispatchResult:
    """Outcome of one dispatched attempt.

    ok        -- the unit succeeded.
    text      -- free-text artifact (None when empty).
    result    -- structured (parsed JSON) artifact when the unit has an output schema.
    failure_reason -- one of the failure vocabulary strings (spec/workflow-format.md) when not ok.
    error     -- human diagnostic (already redacted and clipped by the dispatcher).
    tokens    -- token usage when the runner reports it.
    session_id -- harness-native session id, if any.
    truncated -- output was cut at a capture cap (the artifact is incomplete; never a silent success).
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
