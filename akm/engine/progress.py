"""What the drive loop reports as it goes, besides the journal: one event per finished unit and step,
and what a running agent unit is doing (its CLI's turns, tool calls and retries, as they happen).

Plain dataclasses (the drive loop calls the callback from worker threads for
units and from its own thread for steps, so building one must stay cheap);
`akm.api` turns them into its typed `UnitFinished` / `StepFinished` models.
"""

from __future__ import annotations

from typing import Any

from akm.record import dataclass


@dataclass
class UnitProgress:
    """Reported once per finished dispatched unit (for the CLI's stderr progress line)."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    ok: bool
    failure_reason: str | None
    done: int
    total: int


@dataclass
class StepProgress:
    """A step reached a final status in this invocation: completed, failed or skipped."""

    run_id: str
    step_id: str
    status: str
    summary: str | None


@dataclass
class PassStarted:
    """A dispatch pass over `total` units of a step begins (a step's units, or one gate loop's re-dos)."""

    run_id: str
    step_id: str
    total: int
    width: int | None = None  # units at once (akm.engine.concurrency)
    note: str | None = None  # why fewer than the step declares, when an engine holds it down


@dataclass
class UnitActivity:
    """A running agent unit's CLI did something: `activity` is `akm.dispatch.agent_stream.Activity.to_json()`
    (`turns`, `toolCalls`, `tool`?, `retries`, `retryStatus`?, `sessionId`?), `elapsed_s` since it started."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    activity: dict[str, Any]
    elapsed_s: float
