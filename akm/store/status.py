"""The status vocabulary of runs, steps and unit attempts: one place, typed.

Statuses travel as plain strings (journal columns, JSON); these `Literal`s let a type checker catch a typo,
and the tuples are what SQL `IN (...)` clauses and membership tests use.
"""

from __future__ import annotations

from typing import Literal, get_args

RunStatus = Literal["active", "completed", "failed", "blocked", "awaiting_session", "abandoned"]
StepStatus = Literal["pending", "running", "completed", "failed", "skipped", "blocked"]
UnitStatus = Literal["queued", "running", "completed", "failed"]

RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
# A run something can still drive: the engine (active) or the calling agent (awaiting_session, D11).
DRIVABLE_STATUSES: tuple[RunStatus, ...] = ("active", "awaiting_session")
# The run lease of a report finishing a step carries this prefix: it holds the run for a moment and
# does not make other reports wait (nor refuse them).
REPORT_LOCK_PREFIX = "report:"
# What a session report did to its attempt row: wrote it, found exactly it already recorded, or (a claim)
# kept the unit's claim alive.
ReportRecorded = Literal["written", "idempotent", "heartbeat"]
STEP_TERMINAL_STATUSES: tuple[StepStatus, ...] = ("completed", "failed", "skipped", "blocked")

# Money and token ceilings (akm.engine.cost): a unit whose usage they must know is a model call akm made with an
# engine; a finished one with no figure is "unknown", unless it failed before any model was asked anything.
MODEL_RUNNERS = ("llm", "agent")
NOTHING_SPENT = frozenset(
    {
        "aborted",
        "abandoned",
        "budget_exceeded",
        "unit_cap_exceeded",
        "not_run",
        "env_unsupported",
        "worktree_failed",
        "dispatch_error",
        "spawn_failed",
        "agent_auth",
        "network_error",
        "llm_rate_limit",
        "journal_write_failed",
    }
)
