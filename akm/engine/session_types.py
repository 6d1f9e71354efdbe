"""The session protocol's request and results, typed: what a report asks and what the engine answers.

The engine speaks in these records; the api's views (`akm.api._briefs`) turn them into the camelCase JSON
the fronts show, so no engine module writes a front's key. A leaf (it imports only the store's status
vocabulary), so every module of the protocol (`briefs`, `session`, `resends`, `report_finish`) can name them.
"""

from __future__ import annotations

from typing import Any, Literal

from akm.record import dataclass, field
from akm.store.status import ReportRecorded as Recorded

__all__ = [
    "REPORT_STATUSES",
    "Brief",
    "BriefKind",
    "BriefUnit",
    "Claim",
    "JudgeBrief",
    "OutcomeKind",
    "Recorded",
    "ReportAnswer",
    "ReportHint",
    "ReportStatus",
    "StepOutcome",
    "UnitAction",
    "UnitContext",
    "UnitReport",
]

ReportStatus = Literal["completed", "failed", "running"]
REPORT_STATUSES: tuple[ReportStatus, ...] = ("completed", "failed", "running")
UnitAction = Literal["do", "claimed", "rerun", "do_not_run"]
OutcomeKind = Literal["completed", "failed", "blocked", "next_loop", "awaiting_verdict"]


@dataclass(frozen=True)
class UnitReport:
    """One report of the calling agent: a unit's result, a claim (`running`) or a gate verdict.

    The api builds it once from its validated `ReportRequest`; it is carried as it is to the guards and the
    write. `result` None: no result. `verdict` is a verdict object, or its JSON text (the CLI reads it as
    text); None: the report carries none (a gate unit id still makes it a verdict report).
    """

    run_id: str
    unit_id: str
    holder: str
    status: ReportStatus = "completed"
    result: Any = None
    verdict: Any = None
    tokens: int | None = None
    failure_reason: str | None = None
    expect_step: str | None = None
    rerun: bool = False
    attempt_id: str | None = None
    gate_loop: int | None = None

    @property
    def is_verdict(self) -> bool:
        """A gate verdict: it names a gate row (`STEP.gate:lN`, `STEP.gate`) or carries a verdict."""
        return ".gate:l" in self.unit_id or self.unit_id.endswith(".gate") or self.verdict is not None

    @property
    def is_new_work(self) -> bool:
        """A re-run or a claim is new work: never the resend of an earlier report."""
        return self.rerun or self.status == "running"


@dataclass(frozen=True)
class Claim:
    """A live claim on a unit: who holds it, and until when (D13)."""

    holder: str
    expires_at: str


@dataclass(frozen=True)
class ReportHint:
    """The arguments of the report that would record a unit (or a verdict): a front passes them as they are."""

    run_id: str
    unit_id: str
    attempt_id: str | None
    gate_loop: int | None
    expect_step: str | None
    status: ReportStatus = "completed"
    rerun: bool = False


@dataclass(frozen=True)
class UnitContext:
    """What a session unit is given besides its prompt. `fan_out`: a map's unit (it has an item and an index)."""

    params: dict[str, Any]
    inputs: dict[str, Any]
    gate_feedback: dict[str, Any] | None
    fan_out: bool = False
    item: Any = None
    item_index: int | None = None


@dataclass(frozen=True)
class BriefUnit:
    """One unit the calling agent should do (`action`: do | claimed | rerun | do_not_run)."""

    unit_id: str
    attempt_id: str
    input_hash: str
    action: UnitAction
    result_kind: Literal["json", "text"]  # what `result` is
    env: list[str]  # the unit's env: refs by name (never values)
    env_bindings: list[str]  # the variable names those refs bind (never values)
    runner: str
    prompt: str
    output_schema: dict[str, Any] | None
    context: UnitContext
    claim: Claim | None
    last_failure: str | None
    report: ReportHint


@dataclass(frozen=True)
class JudgeBrief:
    """The verdict the calling agent should give on a step's artifact."""

    unit_id: str
    criteria: list[str]
    artifact: Any
    summary: str
    prompt: str
    verdict_schema: dict[str, Any]
    report: ReportHint


BriefKind = Literal["units", "judge", "engine", "done", "inactive", "none"]


@dataclass
class Brief:
    """What the calling agent should do now for a run (`kind`: units | judge | engine | done | inactive | none)."""

    run_id: str
    status: str
    done: bool
    active: bool
    kind: BriefKind = "none"
    step_id: str | None = None
    step_title: str | None = None
    instructions: str | None = None
    gate_loop: int | None = None
    max_loops: int | None = None
    gate_feedback: dict[str, Any] | None = None
    units: list[BriefUnit] = field(default_factory=list)
    unit_count: int = 0
    done_count: int = 0
    judge: JudgeBrief | None = None
    message: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StepOutcome:
    """What a report did to its step (`kind`: completed | failed | blocked | next_loop | awaiting_verdict)."""

    kind: OutcomeKind
    summary: str | None = None
    gate_loop: int | None = None
    missing: list[str] | None = None
    feedback: str | None = None


@dataclass(frozen=True)
class ReportAnswer:
    """The answer to one report (`recorded`: written | idempotent | heartbeat).

    `brief`: the run's new brief when the report changed the agent's work within the step (a verdict is now
    awaited, or the gate opened the next loop), so the agent needs no other call."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    status: ReportStatus
    recorded: Recorded
    gate_loop: int
    run_status: str
    message: str
    claim: Claim | None = None
    remaining_units: int | None = None
    step_outcome: StepOutcome | None = None
    brief: Brief | None = None
